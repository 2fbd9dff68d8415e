package extproc

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/request"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// syncSink is a captureSink safe for the server's goroutines.
type syncSink struct {
	mu     sync.Mutex
	stamps []*request.Stamp
}

func (c *syncSink) Record(_ context.Context, s *request.Stamp) {
	c.mu.Lock()
	c.stamps = append(c.stamps, s)
	c.mu.Unlock()
}

// serveGRPC serves s over gRPC on a random port until the test ends and
// returns a client connection to it.
func serveGRPC(t *testing.T, s *Server, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A meter configured as a blocking filter (no observability_mode) answers
// every part Envoy holds, unchanged, and still stamps the request.
func TestMeterBlockingAnswersEveryPart(t *testing.T) {
	s, _ := newTestServer(t, "")
	sink := &syncSink{}
	s.sinks = append(s.sinks, sink)
	conn := serveGRPC(t, s)
	ctx := metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "meter")
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*extprocv3.ProcessingRequest{
		headersMsg(false, "x-request-id", "blocking", request.ModelHeader, "m"),
		respHeaders("text/event-stream"),
		respBody(roleChunk, false),
		respBody(contentChunk, false),
		respBody(contentChunk+"data: [DONE]\n\n", true),
	}
	for _, msg := range msgs {
		msg.ObservabilityMode = false
		if err := stream.Send(msg); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		switch msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			ok = resp.GetRequestHeaders() != nil && resp.GetRequestHeaders().GetResponse() == nil
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			ok = resp.GetResponseHeaders() != nil && resp.GetResponseHeaders().GetResponse() == nil
		case *extprocv3.ProcessingRequest_ResponseBody:
			ok = resp.GetResponseBody() != nil && resp.GetResponseBody().GetResponse() == nil
		}
		if !ok {
			t.Fatalf("answer to %T: %v", msg.Request, resp)
		}
	}
	stream.CloseSend()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		sink.mu.Lock()
		n := len(sink.stamps)
		sink.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no stamp")
		}
	}
	if st := sink.stamps[0]; st.RequestID != "blocking" || st.ContentEvents != 2 || !st.Complete {
		t.Fatalf("stamp %+v", st)
	}
}

// settleRecorder is a Policy that records each settlement and whether its
// context was still live.
type settleRecorder struct {
	request.AllowAll
	settled chan settled
}

type settled struct {
	s   request.Settlement
	err error
}

func (p *settleRecorder) Settle(ctx context.Context, s *request.Settlement) {
	p.settled <- settled{*s, ctx.Err()}
}

// A response that ends early is settled anyway, on a context of its own.
// Envoy closing the meter's stream (the client or the pool reset the
// response) marks it cut. A stream that breaks (cancelled) may have carried
// on unseen: lost. A client that leaves at [DONE] (the OpenAI SDKs close
// there, before the response's end reaches Envoy) had it all: complete.
func TestMeterSettlesWhenTheResponseEndsEarly(t *testing.T) {
	closeSend := func(c extprocv3.ExternalProcessor_ProcessClient, _ context.CancelFunc) { _ = c.CloseSend() }
	for _, tc := range []struct {
		name    string
		done    bool // [DONE] arrived before the end
		end     func(extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc)
		wantEnd request.End
	}{
		{"envoy closes the stream", false, closeSend, request.EndCut},
		{"the stream breaks", false, func(_ extprocv3.ExternalProcessor_ProcessClient, reset context.CancelFunc) { reset() }, request.EndLost},
		{"the client leaves at [DONE]", true, closeSend, request.EndComplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestServer(t, "")
			rec := &settleRecorder{settled: make(chan settled, 1)}
			s.policy = rec
			// awaiting receives once the server asks for a message it has
			// not been sent: it has handled every one before.
			var asked atomic.Int64
			awaiting := make(chan int64, 16)
			conn := serveGRPC(t, s, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				return h(srv, recvNotifier{ss, func() { awaiting <- asked.Add(1) }})
			}))
			ctx, reset := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "meter"))
			defer reset()
			stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hdrs := headersMsg(false, "x-request-id", "reset", request.ModelHeader, "m")
			withGateField(hdrs, &gateField{decision: "allow", tenant: "acme", reservation: "r-1"})
			msgs := []*extprocv3.ProcessingRequest{hdrs, respHeaders("text/event-stream"), respBody(roleChunk, false), respBody(contentChunk, false)}
			if tc.done {
				msgs = append(msgs, respBody("data: [DONE]\n\n", false))
			}
			for _, msg := range msgs {
				msg.ObservabilityMode = true
				if err := stream.Send(msg); err != nil {
					t.Fatal(err)
				}
			}
			for n := int64(0); n <= int64(len(msgs)); n = <-awaiting {
			}
			tc.end(stream, reset)
			select {
			case got := <-rec.settled:
				if got.err != nil {
					t.Errorf("settled on a dead context: %v", got.err)
				}
				if got.s.Reservation != "r-1" || got.s.Terminal != tc.done || got.s.Events != 1 || got.s.End != tc.wantEnd {
					t.Errorf("settlement %+v, want reservation r-1, terminal %v, 1 event counted, end %v", got.s, tc.done, tc.wantEnd)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the reservation was never settled")
			}
		})
	}
}

type panicPolicy struct{ request.AllowAll }

func (panicPolicy) Decide(context.Context, *request.Admission) request.Verdict { panic("policy bug") }

// A panic while deciding answers that request 503 and leaves the process
// (and the next request) alone.
func TestGatePanicAnswers503(t *testing.T) {
	s, _ := newTestServer(t, "")
	s.policy = panicPolicy{}
	g := &gateRequest{started: time.Now(), eager: true}
	out, err := s.safeGateStep(context.Background(), g, headersMsg(false, chatHeaders...))
	if err != nil || len(out) != 0 {
		t.Fatalf("headers: %v, %v", out, err)
	}
	out, err = s.safeGateStep(context.Background(), g, bodyMsg(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, true))
	if err == nil || len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 503 {
		t.Fatalf("a panicking policy: answers %v, err %v; want one immediate 503 and the panic as an error", out, err)
	}
	s.policy = request.AllowAll{}
	g = &gateRequest{started: time.Now(), eager: true}
	s.safeGateStep(context.Background(), g, headersMsg(false, chatHeaders...))
	if out, err := s.safeGateStep(context.Background(), g, bodyMsg(`{"model":"m1","messages":[]}`, true)); err != nil || len(out) != 2 {
		t.Fatalf("the next request: %v, %v", out, err)
	}
}

// The client's gateway credential never leaves for the upstream.
func TestGateRemovesClientCredentials(t *testing.T) {
	s, _ := newTestServer(t, "")
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, append(chatHeaders[:len(chatHeaders):len(chatHeaders)],
		"authorization", "Bearer sk-secret", "x-api-key", "sk-other", "x_infergate_model", "spoofed")...))
	out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"m1","messages":[]}`, true))
	removed := out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	for _, want := range []string{"authorization", "x-api-key", "x_infergate_model", "x-infergate-model"} {
		if !slices.Contains(removed, want) {
			t.Errorf("%s not removed: %v", want, removed)
		}
	}
}

// A model name past MaxModelBytes is refused before anything keeps it.
func TestGateRefusesHugeModelNames(t *testing.T) {
	s, sink := newTestServer(t, "")
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
	model := strings.Repeat("m", 900<<10)
	out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"`+model+`","messages":[]}`, true))
	if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 400 {
		t.Fatalf("answers %v, want one 400", out)
	}
	if !strings.Contains(string(out[0].GetImmediateResponse().GetBody()), "the limit is 256") {
		t.Errorf("body %s", out[0].GetImmediateResponse().GetBody())
	}
	if st := sink.stamps[0]; len(st.Model) > request.MaxStampField {
		t.Errorf("the stamp keeps a %d-byte model", len(st.Model))
	}
}

// testMeter is a meter's state as Server.meter starts it.
func testMeter(maxGaps int, orders *meter.PoolOrders) *meterRequest {
	m := &meterRequest{orders: orders, sealer: testSealer()}
	m.Tally.MaxGaps = maxGaps
	return m
}

// Envoy's response.code_details tells the pool's answer from Envoy's own
// local replies; without it the origin is unknown (and the reservation
// of an error stays).
func TestOriginOfCodeDetails(t *testing.T) {
	for details, want := range map[string]request.Origin{
		"":                           request.OriginUnknown,
		"via_upstream":               request.OriginPool,
		"upstream_response_timeout":  request.OriginEnvoy,
		"stream_idle_timeout":        request.OriginEnvoy,
		"request_overall_timeout":    request.OriginEnvoy,
		"no_healthy_upstream":        request.OriginEnvoy,
		"via_upstream_but_not_quite": request.OriginEnvoy,
	} {
		if got := meter.OriginOf(details); got != want {
			t.Errorf("meter.OriginOf(%q) = %v, want %v", details, got, want)
		}
	}
}

// recvNotifier calls asking each time its stream's handler asks for a
// message.
type recvNotifier struct {
	grpc.ServerStream
	asking func()
}

func (r recvNotifier) RecvMsg(m any) error {
	r.asking()
	return r.ServerStream.RecvMsg(m)
}

// Only the local replies that Envoy's router writes before any upstream
// request prove that no pool was asked, and only with no upstream address
// and at most the first attempt beside them.
func TestUnsentBy(t *testing.T) {
	for _, tc := range []struct {
		details  string
		attempts int
		upstream string
		want     string
	}{
		{"route_not_found", 0, "", "route_not_found"},
		{"cluster_not_found", 0, "", "cluster_not_found"},
		{"no_healthy_upstream", 1, "", "no_healthy_upstream"},
		{"no_healthy_upstream", 2, "", ""},              // a retry: an attempt went before
		{"no_healthy_upstream", 1, "10.0.0.1:8000", ""}, // a host was picked
		{"upstream_reset_before_response_started{connection_failure}", 1, "", ""},
		{"request_overall_timeout", 0, "", ""},
		{"via_upstream", 1, "10.0.0.1:8000", ""},
		{"", 0, "", ""},
	} {
		if got := meter.UnsentBy(tc.details, tc.attempts, tc.upstream); got != tc.want {
			t.Errorf("meter.UnsentBy(%q, %d, %q) = %q, want %q", tc.details, tc.attempts, tc.upstream, got, tc.want)
		}
	}
}
