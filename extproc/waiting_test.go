package extproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/request"
)

// tenantsServer is a test server whose policy is the real admission
// controller with the keys given as {secret, id, tenant}.
func tenantsServer(tb testing.TB, keys ...[3]string) (*Server, *captureSink) {
	tb.Helper()
	s, sink := newTestServer(tb, "log: {requests: false}")
	yaml := "keys:\n"
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k[0]))
		yaml += "- id: " + k[1] + "\n  sha256: " + hex.EncodeToString(sum[:]) + "\n  tenant: " + k[2] + "\n"
	}
	path := filepath.Join(tb.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	loaded, err := identity.LoadKeys(path)
	if err != nil {
		tb.Fatal(err)
	}
	set := &identity.KeySet{}
	set.Store(loaded)
	m, err := admission.NewMetrics(sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		tb.Fatal(err)
	}
	s.policy = &admission.Controller{Keys: set, Log: slog.New(slog.DiscardHandler), Metrics: m}
	return s, sink
}

// pipeStream is a gate stream in memory: what the test sends in, what the
// gate answers out. Closing in is Envoy's half close.
type pipeStream struct {
	grpc.ServerStream
	ctx context.Context
	in  chan *extprocv3.ProcessingRequest
	out chan *extprocv3.ProcessingResponse
}

func (p *pipeStream) Context() context.Context { return p.ctx }

func (p *pipeStream) Send(r *extprocv3.ProcessingResponse) error {
	p.out <- r
	return nil
}

func (p *pipeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	select {
	case m, ok := <-p.in:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-p.ctx.Done():
		return nil, p.ctx.Err()
	}
}

// open starts a gate stream for a chat request with key's headers; done
// closes when Process returned (the stream's context is then cancelled,
// as gRPC does).
func open(t *testing.T, s *Server, key string) (p *pipeStream, done chan struct{}) {
	p, done, _ = openCancellable(t, s, key)
	return p, done
}

// openCancellable is open, and cancels the stream's context as Envoy's
// reset does.
func openCancellable(t *testing.T, s *Server, key string) (p *pipeStream, done chan struct{}, reset context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	p = &pipeStream{ctx: ctx, in: make(chan *extprocv3.ProcessingRequest, 4), out: make(chan *extprocv3.ProcessingResponse, 4)}
	done = make(chan struct{})
	p.in <- headersMsg(false, append([]string{"authorization", "Bearer " + key}, chatHeaders...)...)
	go func() {
		defer close(done)
		defer cancel()
		if err := s.Process(p); err != nil {
			t.Errorf("Process: %v", err)
		}
	}()
	return p, done, cancel
}

// answered is the gate's first answer on p, or nil when it has given none.
func answered(p *pipeStream) *extprocv3.ProcessingResponse {
	select {
	case r := <-p.out:
		return r
	default:
		return nil
	}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// A key that holds requests whose body does not come holds only its own
// share: past MaxWaitingBodiesPerPrincipal its next request is refused 429
// at its headers, while another tenant is served at once; each held
// request is answered 408 at BodyTimeout after its headers (virtual time),
// not before, its stream ended, and its share is free again.
func TestGateSlowBodiesHoldOnlyTheirCaller(t *testing.T) {
	s, _ := tenantsServer(t, [3]string{"sk-slow", "slow", "free"}, [3]string{"sk-other", "other", "paying"})
	s.waiting.max, s.opts.BodyTimeout = 2, 30*time.Second
	sink := &lockedSink{}
	s.sinks = []request.Sink{sink}
	synctest.Test(t, func(t *testing.T) {
		held := make([]*pipeStream, 0, 2)
		ended := make([]chan struct{}, 0, 2)
		for range 2 {
			p, done := open(t, s, "sk-slow")
			held, ended = append(held, p), append(ended, done)
		}
		synctest.Wait()
		for i, p := range held {
			if r := answered(p); r != nil {
				t.Fatalf("held request %d answered before its body: %v", i, r)
			}
		}
		third, done := open(t, s, "sk-slow")
		synctest.Wait()
		ir := answered(third).GetImmediateResponse()
		if ir.GetStatus().GetCode() != 429 || ir.GetHeaders() == nil ||
			string(ir.GetBody()) != `{"error":{"message":"this API key already has 2 requests whose body has not arrived; send or cancel them first","type":"rate_limit_error","param":null,"code":"too_many_waiting_bodies"}}` {
			t.Errorf("a third waiting request of the key: %v, want 429 too_many_waiting_bodies", ir)
		}
		close(third.in) // Envoy closes the stream it was answered on
		<-done

		other, done := open(t, s, "sk-other")
		other.in <- bodyMsg(chatBody, true)
		synctest.Wait()
		if r := answered(other); r.GetRequestHeaders() == nil {
			t.Errorf("another tenant, while the key holds its share: %v, want admitted", r)
		}
		close(other.in)
		<-done

		time.Sleep(s.opts.BodyTimeout - time.Nanosecond)
		synctest.Wait()
		for i, p := range held {
			if r := answered(p); r != nil {
				t.Fatalf("held request %d answered before the deadline: %v", i, r)
			}
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		for i, p := range held {
			ir := answered(p).GetImmediateResponse()
			if ir.GetStatus().GetCode() != 408 || string(ir.GetBody()) != `{"error":{"message":"the request body did not arrive within 30s","type":"invalid_request_error","param":null,"code":"request_body_timeout"}}` {
				t.Errorf("held request %d at the deadline: %v, want 408 request_body_timeout", i, ir)
			}
			<-ended[i] // the gate ended the stream itself
		}

		// Envoy resets a stream that waits for its body: it ends at
		// once, its share given back.
		reset, done, cancel := openCancellable(t, s, "sk-slow")
		synctest.Wait()
		if r := answered(reset); r != nil {
			t.Fatalf("a waiting request answered: %v", r)
		}
		cancel()
		<-done

		again, done := open(t, s, "sk-slow")
		again.in <- bodyMsg(chatBody, true)
		synctest.Wait()
		if r := answered(again); r.GetRequestHeaders() == nil {
			t.Errorf("the key once its held requests timed out: %v, want admitted", r)
		}
		close(again.in)
		<-done
	})
	if n := len(s.waiting.held); n != 0 {
		t.Errorf("%d callers still counted as waiting after every stream ended", n)
	}
	var reasons []string
	for _, st := range sink.all() {
		if st.Decision == "deny" {
			reasons = append(reasons, st.Tenant+":"+st.Reason)
		}
	}
	if want := []string{"free:too_many_waiting_bodies", "free:request_body_timeout", "free:request_body_timeout"}; !equalStrings(reasons, want) {
		t.Errorf("denials stamped %v, want %v (under the caller's tenant)", reasons, want)
	}
}

// lockedSink keeps the stamps of concurrent streams.
type lockedSink struct {
	mu     sync.Mutex
	stamps []*request.Stamp
}

func (l *lockedSink) Record(_ context.Context, st *request.Stamp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stamps = append(l.stamps, st)
}

func (l *lockedSink) all() []*request.Stamp {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.stamps)
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
