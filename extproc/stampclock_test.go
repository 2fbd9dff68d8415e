package extproc

import (
	"context"
	"io"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/wasmmeter"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/feed"
)

// scriptedStream is a meter stream whose messages infergate reads at the
// times given: a message read late sat in the queue since Envoy sent it.
type scriptedStream struct {
	grpc.ServerStream
	msgs  []*extprocv3.ProcessingRequest
	reads []time.Time
	now   *time.Time
	// runUntil runs the rest of the process (its stall watch) up to each read.
	runUntil func(time.Time)
}

func (s *scriptedStream) Context() context.Context                 { return context.Background() }
func (s *scriptedStream) Send(*extprocv3.ProcessingResponse) error { return nil }
func (s *scriptedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	msg := s.msgs[0]
	s.runUntil(s.reads[0])
	*s.now, s.msgs, s.reads = s.reads[0], s.msgs[1:], s.reads[1:]
	return msg, nil
}

// A meter that reads Envoy's messages late (infergate starved or stopped
// while the request passed) publishes a stamp that is right or marked
// late_read, never silently wrong. The request, on Envoy's side: received
// at 0, the gate answered at 2 ms and the request left at 2.5 ms, its
// response headers at 5 ms, its first token at 40 ms, its end at 50 ms.
// Before, a reader stalled from 2 to 176 ms stamped TTFT 0.07 ms and a
// gateway time of 176 ms, and one stalled from 10 to 160 ms a TTFT of
// 157 ms, as if they were measured.
func TestMeterStalledReader(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	const departure, firstToken = 2.5, 40.0
	for _, tc := range []struct {
		name  string
		reads [5]float64 // request headers, response headers, first token, second, end
		stall [2]float64 // when infergate did not run, as its stall watch saw it
		want  request.Timing
	}{
		{"read on time", [5]float64{2.6, 5.1, 40.1, 45.1, 50.1}, [2]float64{}, request.TimingOK},
		{"stalled over the whole request", [5]float64{176, 176.02, 176.07, 176.1, 176.12}, [2]float64{2, 176}, request.TimingLateRead},
		{"stalled until after the response headers", [5]float64{30, 30.01, 40.1, 45.1, 50.1}, [2]float64{2, 30}, request.TimingOK},
		{"stalled while the first token passed", [5]float64{2.6, 5.1, 160, 160.01, 160.02}, [2]float64{10, 160}, request.TimingLateRead},
		{"stalled after the first token", [5]float64{2.6, 5.1, 40.1, 120, 120.01}, [2]float64{41, 120}, request.TimingLateStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, sink := newTestServer(t, "")
			var now time.Time
			s.now = func() time.Time { return now }
			// The stall watch wakes every tick, except while infergate
			// does not run; it wakes as the stall ends.
			stallFrom, stallTo := at(tc.stall[0]), at(tc.stall[1])
			beat := t0
			runUntil := func(to time.Time) {
				for ; !beat.After(to); beat = beat.Add(meter.StallTick) {
					if beat.After(stallFrom) && beat.Before(stallTo) {
						beat = stallTo
					}
					s.stalls.Beat(beat)
				}
			}
			f := sampleField
			f.sent = at(2).UnixMicro()
			hdrs := headersMsg(false, "x-request-id", "r1")
			hdrs.ObservabilityMode = true
			hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
				request.MeterAttribute: structpb.NewStringValue(sealed(&f)),
				"request.time":         structpb.NewStringValue(t0.UTC().Format(time.RFC3339Nano))}}}
			stream := &scriptedStream{now: &now, runUntil: runUntil, msgs: []*extprocv3.ProcessingRequest{hdrs,
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
			// The controller counts the status; it weighs only the
			// times the meter vouched for.
			var obs []controller.Observation
			feed.Observations(st, func(o controller.Observation) { obs = append(obs, o) })
			if len(obs) != 1 || obs[0].Untimed != (st.Timing == request.TimingLateRead) ||
				obs[0].Untimed && obs[0].TTFT != 0 || !st.Timing.StreamTimed() && obs[0].ITLP95 != 0 {
				t.Errorf("controller observations %+v from a %q stamp", obs, st.Timing)
			}
			// Right: the departure within the handoff after the gate's
			// answer, the first token no later than the handoff after it
			// passed Envoy; the gateway's time the same way.
			sentOK := !st.Sent.Before(at(2)) && !st.Sent.After(at(departure).Add(meter.MaxHandoff))
			firstOK := !st.Sent.Add(st.TTFT).Before(at(firstToken)) && !st.Sent.Add(st.TTFT).After(at(firstToken).Add(meter.MaxHandoff))
			gatewayOK := st.Gateway.Total >= 2*time.Millisecond && st.Gateway.Total <= 2*time.Millisecond+meter.MaxHandoff
			if st.Timing.FirstTokenTimed() && !(sentOK && firstOK && gatewayOK) {
				t.Errorf("silently wrong: sent at %v, TTFT %v, gateway %v; the request left at %vms, its first token passed at %vms",
					st.Sent.Sub(t0), st.TTFT, st.Gateway.Total, departure, firstToken)
			}
		})
	}
}

// The in-Envoy meter's times are Envoy's own: a stall of infergate's while
// its summary's request passed, or after, marks nothing.
func TestEnvoyTimedStampIgnoresStalls(t *testing.T) {
	s, sink, _, reader := alsServer(t)
	start := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	s.stalls.Beat(start.Add(-meter.StallTick))
	s.stalls.Beat(start.Add(time.Second)) // infergate did not run for the whole request
	sum := wasmmeter.Summary{Start: start.Add(time.Millisecond), Complete: true, SSE: true, HasFirst: true,
		TTFT: 40 * time.Millisecond, E2E: 60 * time.Millisecond, ContentEvents: 1,
		Usage: &openai.Usage{PromptTokens: 1, CompletionTokens: 1}}
	s.meterEntry(context.Background(), entryWith(t, sum.Encode(), start, nil))
	if len(sink.stamps) != 1 {
		t.Fatalf("%d stamps", len(sink.stamps))
	}
	if st := sink.stamps[0]; st.Timing != request.TimingOK || st.TTFT != 40*time.Millisecond {
		t.Errorf("timing %q, TTFT %v; want ok, 40ms", st.Timing, st.TTFT)
	}
	if n := meterErrors(t, reader, "late_read"); n != 0 {
		t.Errorf("%d counted late_read", n)
	}
}

// With an Endpoint Picker between the gate and the meter, the stamp names
// the endpoint it chose and times it as a stage of its own: the gate
// answered at 2 ms, the picker chose (the meter read the headers) at
// 30 ms, the first token passed at 40 ms. Without the picker's endpoint
// on the headers, the same late read is a late_read whose departure is the
// gate's answer.
func TestMeterStampsThePicker(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	for _, endpoint := range []string{"10.0.0.7:8000", ""} {
		s, sink := newTestServer(t, "")
		spans := tracetest.NewSpanRecorder()
		s.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)).Tracer("test")
		var now time.Time
		s.now = func() time.Time { return now }
		f := sampleField
		f.sent = at(2).UnixMicro()
		kv := []string{"x-request-id", "r1"}
		if endpoint != "" {
			kv = append(kv, request.EndpointHeader, endpoint)
		}
		hdrs := headersMsg(false, kv...)
		hdrs.ObservabilityMode = true
		hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
			request.MeterAttribute: structpb.NewStringValue(sealed(&f)),
			"request.time":         structpb.NewStringValue(t0.UTC().Format(time.RFC3339Nano))}}}
		stream := &scriptedStream{now: &now, runUntil: func(to time.Time) {
			for beat := t0; !beat.After(to); beat = beat.Add(meter.StallTick) {
				s.stalls.Beat(beat) // infergate ran throughout
			}
		}, msgs: []*extprocv3.ProcessingRequest{hdrs, respHeaders("text/event-stream"), respBody(contentChunk, false),
			respBody(usageChunk+"data: [DONE]\n\n", true)}}
		for _, ms := range []float64{30, 31, 40, 50} {
			stream.reads = append(stream.reads, at(ms))
		}
		if err := s.Process(stream); err != nil {
			t.Fatal(err)
		}
		st := sink.stamps[0]
		if endpoint == "" {
			if st.Endpoint != "" || st.Gateway.Picker != 0 || st.Timing != request.TimingLateRead {
				t.Errorf("no picker: endpoint %q, picker %v, timing %q; want none, 0, late_read", st.Endpoint, st.Gateway.Picker, st.Timing)
			}
			continue
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, sp := range spans.Ended() {
			for _, a := range sp.Attributes() {
				attrs[a.Key] = a.Value
			}
		}
		if attrs["infergate.endpoint"].AsString() != endpoint || attrs["infergate.picker_ms"].AsFloat64() != 28 {
			t.Errorf("span: endpoint %q, picker_ms %v; want %s, 28", attrs["infergate.endpoint"].AsString(), attrs["infergate.picker_ms"].AsFloat64(), endpoint)
		}
		if st.Endpoint != endpoint || st.Gateway.Picker != 28*time.Millisecond || st.Timing != request.TimingOK ||
			!st.Sent.Equal(at(30)) || st.TTFT != 10*time.Millisecond || st.Gateway.Total != 30*time.Millisecond {
			t.Errorf("endpoint %q, picker %v, timing %q, sent %v, TTFT %v, gateway %v; want %s, 28ms, ok, 30ms, 10ms, 30ms",
				st.Endpoint, st.Gateway.Picker, st.Timing, st.Sent.Sub(t0), st.TTFT, st.Gateway.Total, endpoint)
		}
	}
}
