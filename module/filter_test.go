package module

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared/fake"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/request"
)

// handle is Envoy as the filter sees it: the SDK's fake header map and
// body buffers, a scheduler whose tasks the test runs (as Envoy's worker
// thread would), and what the filter answered.
type handle struct {
	shared.HttpFilterHandle // unused methods panic (nil)
	reqHeaders              *fake.FakeHeaderMap
	buffered                *fake.FakeBodyBuffer
	tasks                   chan func()
	local                   int // status of the local reply, 0: none
	localBody               string
	continued               bool
}

func newHandle(h map[string][]string) *handle {
	return &handle{reqHeaders: fake.NewFakeHeaderMap(h), buffered: fake.NewFakeBodyBuffer(nil), tasks: make(chan func(), 4)}
}

func (h *handle) RequestHeaders() shared.HeaderMap       { return h.reqHeaders }
func (h *handle) BufferedRequestBody() shared.BodyBuffer { return h.buffered }
func (h *handle) GetScheduler() shared.Scheduler         { return h }
func (h *handle) Schedule(f func())                      { h.tasks <- f }
func (h *handle) ClearRouteCache()                       {}
func (h *handle) ContinueRequest()                       { h.continued = true }
func (h *handle) SendLocalResponse(status uint32, _ [][2]string, body []byte, _ string) {
	h.local, h.localBody = int(status), string(body)
}

// policy admits with a reservation once release is closed, and records
// what is given back or settled.
type policy struct {
	request.AllowAll
	deciding chan struct{} // closed when Decide has begun
	decide   chan struct{} // Decide returns once this is closed
	mu       sync.Mutex
	released []string
	settled  []*request.Settlement
	done     chan struct{} // a release or a settlement happened
}

func newPolicy() *policy {
	return &policy{deciding: make(chan struct{}), decide: make(chan struct{}), done: make(chan struct{}, 4)}
}

func (p *policy) Decide(ctx context.Context, a *request.Admission) request.Verdict {
	close(p.deciding)
	<-p.decide
	v := p.AllowAll.Decide(ctx, a)
	v.Reservation = "res-1"
	return v
}

func (p *policy) Release(_ context.Context, _, reservation string) {
	p.mu.Lock()
	p.released = append(p.released, reservation)
	p.mu.Unlock()
	p.done <- struct{}{}
}

func (p *policy) Settle(_ context.Context, s *request.Settlement) {
	p.mu.Lock()
	p.settled = append(p.settled, s)
	p.mu.Unlock()
	p.done <- struct{}{}
}

func newFilter(p request.Policy, h *handle) *filter {
	o := &Options{Intake: gate.Intake{CompletionPaths: []string{"/v1/chat/completions"}, MaxBodyBytes: 1 << 16},
		Policy: p, Logger: slog.New(slog.DiscardHandler)}
	if err := o.defaults(); err != nil {
		panic(err)
	}
	return &filter{opts: o, h: h}
}

const chat = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

func chatHeaders() map[string][]string {
	return map[string][]string{":method": {"POST"}, ":path": {"/v1/chat/completions"}, "content-type": {"application/json"},
		"x-request-id": {"r1"}, "authorization": {"Bearer k"}, "x-infergate-model": {"spoofed"}}
}

// The decision runs off the worker thread; its plan is applied back on it:
// the routing header set, the credential and the spoofed header removed,
// the request continued.
func TestAdmitsThroughTheScheduler(t *testing.T) {
	h, p := newHandle(chatHeaders()), newPolicy()
	f := newFilter(p, h)
	if st := f.OnRequestHeaders(h.reqHeaders, false); st != shared.HeadersStatusStop {
		t.Fatalf("headers: %v", st)
	}
	if st := f.OnRequestBody(fake.NewFakeBodyBuffer([]byte(chat)), true); st != shared.BodyStatusStopAndBuffer {
		t.Fatalf("body: %v", st)
	}
	close(p.decide)
	(<-h.tasks)() // the worker thread runs the plan
	if !h.continued || h.local != 0 {
		t.Fatalf("continued %v, local reply %d %s", h.continued, h.local, h.localBody)
	}
	if got := h.reqHeaders.GetOne(request.ModelHeader).ToString(); got != "m" {
		t.Errorf("model header %q", got)
	}
	if len(h.reqHeaders.Get("authorization")) != 0 {
		t.Error("the gateway credential was forwarded")
	}
	if f.m == nil || f.m.Reservation != "res-1" {
		t.Errorf("the meter did not take the reservation: %+v", f.m)
	}
}

// A client that leaves while the policy decides: the reservation made for
// it is given back, and the plan is never applied.
func TestDecisionAfterTheClientLeftIsReleased(t *testing.T) {
	h, p := newHandle(chatHeaders()), newPolicy()
	f := newFilter(p, h)
	f.OnRequestHeaders(h.reqHeaders, false)
	f.OnRequestBody(fake.NewFakeBodyBuffer([]byte(chat)), true)
	<-p.deciding
	f.OnStreamComplete() // the client reset: Envoy completes the stream
	close(p.decide)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reservation was never released")
	}
	if len(p.released) != 1 || p.released[0] != "res-1" || len(p.settled) != 0 {
		t.Errorf("released %v, settled %d", p.released, len(p.settled))
	}
	select {
	case task := <-h.tasks:
		t.Fatalf("a plan was scheduled for a request that is over (%p)", task)
	default:
	}
}

// A request the gate cannot parse is refused on the worker thread, in
// OpenAI's error format, without asking the policy.
func TestMalformedBodyRefusedInPlace(t *testing.T) {
	h, p := newHandle(chatHeaders()), newPolicy()
	f := newFilter(p, h)
	f.OnRequestHeaders(h.reqHeaders, false)
	f.OnRequestBody(fake.NewFakeBodyBuffer([]byte(`{"model":`)), true)
	if h.local != 400 || !strings.Contains(h.localBody, `"code":"invalid_json"`) {
		t.Errorf("local reply %d %s", h.local, h.localBody)
	}
	select {
	case <-p.deciding:
		t.Error("the policy was asked about a malformed request")
	default:
	}
}

// A panic in a callback answers 503 gate_error and returns a status:
// Envoy's thread never sees it.
func TestPanicInACallbackFailsClosed(t *testing.T) {
	h := newHandle(chatHeaders())
	f := newFilter(panicky{}, h)
	if st := f.OnRequestHeaders(h.reqHeaders, false); st != shared.HeadersStatusStop {
		t.Errorf("status %v", st)
	}
	if h.local != 503 || !strings.Contains(h.localBody, `"code":"gate_error"`) {
		t.Errorf("local reply %d %s", h.local, h.localBody)
	}
}

type panicky struct{ request.AllowAll }

func (panicky) Identify(context.Context, *request.Admission) request.Verdict { panic("boom") }
