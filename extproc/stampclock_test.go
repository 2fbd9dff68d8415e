package extproc

import (
	"context"
	"io"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/routing"
)

func TestStampClock(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	ok, late := request.TimingOK, request.TimingLateRead
	for _, tc := range []struct {
		name string
		f    clockFacts
		want clockVerdict
	}{
		{"read as the gate answered",
			clockFacts{envoyStart: at(0), gateSent: at(2), headersRead: at(2.5), firstRead: at(20), endRead: at(40)},
			clockVerdict{at(2.5), ok}},
		{"read just within the handoff",
			clockFacts{envoyStart: at(0), gateSent: at(2), headersRead: at(12), firstRead: at(12.1), endRead: at(40)},
			clockVerdict{at(12), ok}},
		{"read late, the first token in its backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), headersRead: at(176), firstRead: at(176.07), endRead: at(176.1)},
			clockVerdict{at(2), late}},
		{"read late, no token, the end in its backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), headersRead: at(176), endRead: at(180)},
			clockVerdict{at(2), late}},
		{"read late, the first token read after the backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), headersRead: at(15), firstRead: at(40.1), endRead: at(60)},
			clockVerdict{at(2), ok}},
		{"no gate answer to compare with",
			clockFacts{envoyStart: at(0), headersRead: at(176), firstRead: at(176.07), endRead: at(176.1)},
			clockVerdict{at(176), ok}},
		{"a gate clock ahead of the read",
			clockFacts{envoyStart: at(0), gateSent: at(80), headersRead: at(50), firstRead: at(60), endRead: at(70)},
			clockVerdict{at(50), ok}},
		{"a gate clock behind Envoy's",
			clockFacts{envoyStart: at(0), gateSent: at(-30), headersRead: at(3), firstRead: at(4), endRead: at(5)},
			clockVerdict{at(3), ok}},
		{"a gate answer over an hour old",
			clockFacts{gateSent: at(-3_600_001), headersRead: at(3), firstRead: at(4), endRead: at(5)},
			clockVerdict{at(3), ok}},
		{"request headers skipped",
			clockFacts{envoyStart: at(0), gateSent: at(2), firstRead: at(176), endRead: at(180)},
			clockVerdict{time.Time{}, ok}},
	} {
		if got := stampClock(tc.f); !got.sent.Equal(tc.want.sent) || got.timing != tc.want.timing {
			t.Errorf("%s: sent %v %s; want %v %s", tc.name, got.sent.Sub(t0), got.timing, tc.want.sent.Sub(t0), tc.want.timing)
		}
	}
}

// scriptedStream is a meter stream whose messages infergate reads at the
// times given: a message read late sat in the queue since Envoy sent it.
type scriptedStream struct {
	grpc.ServerStream
	msgs  []*extprocv3.ProcessingRequest
	reads []time.Time
	now   *time.Time
}

func (s *scriptedStream) Context() context.Context                 { return context.Background() }
func (s *scriptedStream) Send(*extprocv3.ProcessingResponse) error { return nil }
func (s *scriptedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	msg := s.msgs[0]
	*s.now, s.msgs, s.reads = s.reads[0], s.msgs[1:], s.reads[1:]
	return msg, nil
}

// A meter that reads Envoy's messages late (infergate starved or stopped
// while the request passed) publishes a stamp that is right or marked
// late_read, never silently wrong. The request, on Envoy's side: received
// at 0, the gate answered at 2 ms and the request left at 2.5 ms, its
// response headers at 5 ms, its first token at 40 ms, its end at 50 ms.
// Before, a reader stalled from 2 to 176 ms stamped TTFT 0.1 ms and a
// gateway time of 174 ms, as if they were measured.
func TestMeterStalledReader(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	const departure, firstToken = 2.5, 40.0
	for _, tc := range []struct {
		name  string
		reads [5]float64 // request headers, response headers, first token, second, end
		want  request.Timing
	}{
		{"read on time", [5]float64{2.6, 5.1, 40.1, 45.1, 50.1}, request.TimingOK},
		{"stalled over the whole request", [5]float64{176, 176.02, 176.07, 176.1, 176.12}, request.TimingLateRead},
		{"stalled until after the response headers", [5]float64{30, 30.01, 40.1, 45.1, 50.1}, request.TimingOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, sink := newTestServer(t, "")
			var now time.Time
			s.now = func() time.Time { return now }
			f := sampleField
			f.sent = at(2).UnixMicro()
			hdrs := headersMsg(false, "x-request-id", "r1")
			hdrs.ObservabilityMode = true
			hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
				request.MeterAttribute: structpb.NewStringValue(sealed(&f)),
				"request.time":         structpb.NewStringValue(t0.UTC().Format(time.RFC3339Nano))}}}
			stream := &scriptedStream{now: &now, msgs: []*extprocv3.ProcessingRequest{hdrs,
				respHeaders("text/event-stream"), respBody(contentChunk, false), respBody(contentChunk, false),
				respBody(usageChunk+"data: [DONE]\n\n", true)}}
			for _, ms := range tc.reads {
				stream.reads = append(stream.reads, at(ms))
			}
			if err := s.Process(stream); err != nil {
				t.Fatal(err)
			}
			st := sink.stamps[0]
			if st.Timing != tc.want {
				t.Errorf("timing %q, want %q (TTFT %v, gateway %v)", st.Timing, tc.want, st.TTFT, st.Gateway.Total)
			}
			observed := 0
			routing.Observations(st, func(controller.Observation) { observed++ })
			if want := map[bool]int{true: 0, false: 1}[st.Timing == request.TimingLateRead]; observed != want {
				t.Errorf("%d controller observations from a %q stamp, want %d", observed, st.Timing, want)
			}
			// Right: the departure within the handoff after the gate's
			// answer, the first token no later than the handoff after it
			// passed Envoy; the gateway's time the same way.
			sentOK := !st.Sent.Before(at(2)) && !st.Sent.After(at(departure).Add(maxHandoff))
			firstOK := !st.Sent.Add(st.TTFT).Before(at(firstToken)) && !st.Sent.Add(st.TTFT).After(at(firstToken).Add(maxHandoff))
			gatewayOK := st.Gateway.Total >= 2*time.Millisecond && st.Gateway.Total <= 2*time.Millisecond+maxHandoff
			if st.Timing != request.TimingLateRead && !(sentOK && firstOK && gatewayOK) {
				t.Errorf("silently wrong: sent at %v, TTFT %v, gateway %v; the request left at %vms, its first token passed at %vms",
					st.Sent.Sub(t0), st.TTFT, st.Gateway.Total, departure, firstToken)
			}
		})
	}
}
