package extproc

import (
	"context"
	"io"
	"math"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/wasmmeter"
)

// alsServer is a Server whose metrics can be read, with a recording policy.
func alsServer(t testing.TB) (*Server, *captureSink, *capPolicy, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	sink, policy := &captureSink{}, &capPolicy{}
	s, err := New(Options{Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("t"),
		Sinks: []request.Sink{sink}, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return s, sink, policy, reader
}

// meterErrors is infergate.meter.errors{reason}.
func meterErrors(t *testing.T, r *sdkmetric.ManualReader, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "infergate.meter.errors" {
				for _, dp := range sum.DataPoints {
					if v, _ := dp.Attributes.Value("reason"); v.AsString() == reason {
						return dp.Value
					}
				}
			}
		}
	}
	return 0
}

// histogramCount is how many values the histogram name holds, all series.
func histogramCount(t *testing.T, r *sdkmetric.ManualReader, name string) uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	n := uint64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, dp := range h.DataPoints {
					n += dp.Count
				}
			}
			if h, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == name {
				for _, dp := range h.DataPoints {
					n += dp.Count
				}
			}
		}
	}
	return n
}

// entry is an access-log entry as envoy/wasm-meter.yaml has Envoy send it.
func entry(t testing.TB, summary string, start time.Time) *accesslogdatav3.HTTPAccessLogEntry {
	t.Helper()
	return entryWith(t, summary, start, &gateField{sent: start.Add(time.Millisecond).UnixMicro(), stream: true, promptTokens: 17,
		gateUS: 500, decision: "allow", requestID: "req-1", model: "pool-a", tenant: "t1", reservation: "r-1"})
}

// entryWith is an entry with the gate's field f (nil: none).
func entryWith(t testing.TB, summary string, start time.Time, f *gateField) *accesslogdatav3.HTTPAccessLogEntry {
	t.Helper()
	var field string
	if f != nil {
		field = sealed(f)
	}
	md, err := structpb.NewStruct(map[string]any{request.MeterKey: field})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := anypb.New(wrapperspb.Bytes([]byte(summary)))
	if err != nil {
		t.Fatal(err)
	}
	return &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			StartTime: timestamppb.New(start),
			UpstreamRemoteAddress: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8001}}}},
			UpstreamCluster:             "pool-a",
			UpstreamRequestAttemptCount: 1,
			FilterStateObjects:          map[string]*anypb.Any{wasmmeter.FilterStateKey: fs},
			Metadata:                    &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MeterNamespace: md}},
		},
		Request:  &accesslogdatav3.HTTPRequestProperties{RequestId: "envoy-id"},
		Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200)},
	}
}

// One summary becomes the stamp and the settlement the ext_proc meter
// would make of the same stream.
func TestAccessLogEntryStampsAndSettles(t *testing.T) {
	s, sink, policy, _ := alsServer(t)
	start := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	sent := start.Add(3 * time.Millisecond)
	sum := wasmmeter.Summary{Start: sent, Complete: true, SSE: true, HasFirst: true, TTFT: 200 * time.Millisecond,
		E2E: 530 * time.Millisecond, ContentEvents: 12, Usage: &openai.Usage{PromptTokens: 6, CompletionTokens: 12},
		ITLMax: 31 * time.Millisecond, ResponseModel: "pool-a-v1"}
	for range 11 {
		sum.Gaps = append(sum.Gaps, 30*time.Millisecond)
	}
	s.meterEntry(context.Background(), entry(t, sum.Encode(), start))
	if len(sink.stamps) != 1 {
		t.Fatalf("%d stamps", len(sink.stamps))
	}
	st := sink.stamps[0]
	if st.RequestID != "req-1" || st.Tenant != "t1" || st.Model != "pool-a" || st.ResponseModel != "pool-a-v1" || !st.Stream ||
		st.Pool != "pool-a" || st.Upstream != "127.0.0.1:8001" || st.Status != 200 || st.Attempts != 1 || !st.Complete ||
		st.TokenSource != "usage" || st.PromptTokens != 6 || st.CompletionTokens != 12 || st.ContentEvents != 12 {
		t.Errorf("stamp %+v", st)
	}
	if st.TTFT != 200*time.Millisecond || st.E2E != 530*time.Millisecond || st.ITLP50 != 30*time.Millisecond ||
		st.ITLMax != 31*time.Millisecond || st.Gateway.Total != 3*time.Millisecond || st.Gateway.Gate != 500*time.Microsecond {
		t.Errorf("stamp times: ttft %v e2e %v itl %v/%v gateway %v gate %v", st.TTFT, st.E2E, st.ITLP50, st.ITLMax,
			st.Gateway.Total, st.Gateway.Gate)
	}
	if len(policy.settled) != 1 {
		t.Fatalf("%d settlements", len(policy.settled))
	}
	if got := policy.settled[0]; got.Reservation != "r-1" || got.PromptTokens != 6 || got.CompletionTokens != 12 ||
		got.End != request.EndComplete || !got.UsageRead || !got.Terminal || !got.SSE || got.Status != 200 {
		t.Errorf("settlement %+v", got)
	}

	// Cut by the client: reported as a cut the meter saw, what passed
	// counted (admission keeps the reservation: the stream did not end).
	sum.Complete, sum.Usage, sum.ContentEvents = false, nil, 4
	s.meterEntry(context.Background(), entry(t, sum.Encode(), start))
	if got := policy.settled[1]; got.End != request.EndCut || got.Terminal || got.UsageRead || got.Events != 4 ||
		got.CompletionTokens != 0 || got.PromptTokens != 17 {
		t.Errorf("cut settlement %+v", got)
	}
}

// Not the meter's (no summary), malformed, or out of range: nothing is
// stamped or settled; a malformed one is counted. Nothing panics.
func TestAccessLogEntryRefusesMalformed(t *testing.T) {
	s, sink, policy, reader := alsServer(t)
	now := time.Now()
	none := entry(t, "", now)
	delete(none.CommonProperties.FilterStateObjects, wasmmeter.FilterStateKey)
	s.meterEntry(context.Background(), none)
	s.meterEntry(context.Background(), &accesslogdatav3.HTTPAccessLogEntry{})
	s.meterEntry(context.Background(), nil)
	old := wasmmeter.Summary{Start: now.Add(-48 * time.Hour)}
	for _, bad := range []string{"", "1|garbage", "2|0|1|0|0|0|0|0|0|0|0|0||", old.Encode()} {
		s.meterEntry(context.Background(), entry(t, bad, now))
	}
	if len(sink.stamps) != 0 || len(policy.settled) != 0 {
		t.Errorf("%d stamps, %d settlements from entries without a valid summary", len(sink.stamps), len(policy.settled))
	}
	if n := meterErrors(t, reader, "bad_summary"); n != 4 {
		t.Errorf("bad_summary errors %d, want 4", n)
	}
}

// fakeLogStream is Envoy's end of an access-log stream.
type fakeLogStream struct {
	grpc.ServerStream
	ctx    context.Context
	msgs   chan *accesslogv3.StreamAccessLogsMessage
	closed bool
}

func (f *fakeLogStream) Context() context.Context { return f.ctx }

func (f *fakeLogStream) Recv() (*accesslogv3.StreamAccessLogsMessage, error) {
	select {
	case m, ok := <-f.msgs:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
}

func (f *fakeLogStream) SendAndClose(*accesslogv3.StreamAccessLogsResponse) error {
	f.closed = true
	return nil
}

// Entries are stamped as they come; the stream ends when Envoy ends it, or
// at once when infergate stops.
func TestStreamAccessLogs(t *testing.T) {
	s, sink, _, _ := alsServer(t)
	svc, stop := s.AccessLogService()
	sum := wasmmeter.Summary{Start: time.Now(), Complete: true, SSE: true, E2E: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &fakeLogStream{ctx: ctx, msgs: make(chan *accesslogv3.StreamAccessLogsMessage, 2)}
	f.msgs <- &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{
			entry(t, sum.Encode(), sum.Start), entry(t, sum.Encode(), sum.Start)}}}}
	close(f.msgs)
	if err := svc.StreamAccessLogs(f); err != nil || !f.closed || len(sink.stamps) != 2 {
		t.Errorf("stream: %v, closed %v, %d stamps", err, f.closed, len(sink.stamps))
	}

	open := &fakeLogStream{ctx: ctx, msgs: make(chan *accesslogv3.StreamAccessLogsMessage)}
	done := make(chan error, 1)
	go func() { done <- svc.StreamAccessLogs(open) }()
	stop()
	stop() // idempotent
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("stopped stream: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an open stream outlived the stop")
	}
}

// Whatever the summary, an entry is stamped within bounds or refused, and
// never panics (meterSummary: without meterEntry's recover).
func FuzzAccessLogSummary(f *testing.F) {
	now := time.Now()
	sum := wasmmeter.Summary{Start: now, Complete: true, SSE: true, HasFirst: true, TTFT: time.Millisecond, E2E: time.Second,
		ContentEvents: 2, Usage: &openai.Usage{PromptTokens: 1, CompletionTokens: 2}, Gaps: []time.Duration{time.Millisecond}}
	f.Add(sum.Encode())
	sum.Usage, sum.Complete = nil, false
	f.Add(sum.Encode())
	f.Add("1|15|1|0|0|0|0|0|0|0|0|0||")
	f.Add("1|15|" + time.Now().Format("20060102150405") + "|999|1|1073741824|1073741824|1073741824|0|0|0|0|%7C|0,0")
	s, sink, _, _ := alsServer(f)
	f.Fuzz(func(t *testing.T, summary string) {
		sink.stamps = sink.stamps[:0]
		s.meterSummary(context.Background(), entry(t, summary, now))
		for _, st := range sink.stamps {
			if st.TTFT < 0 || st.E2E < 0 || st.CompletionTokens < 0 || st.CompletionTokens > meter.MaxTokens ||
				math.IsNaN(st.ITLP50.Seconds()) || len(st.ResponseModel) > request.MaxStampField {
				t.Fatalf("stamp out of bounds: %+v", st)
			}
		}
	})
}

// The in-Envoy meter's summary becomes the stamp and the settlement the
// ext_proc meter makes of the same response, for every API: streamed
// (whole, cut, with the gate's field naming the API or without), and
// non-streamed.
func TestAccessLogMatchesExtProcPerAPI(t *testing.T) {
	chat := []timedEvent{{50, roleChunk + contentChunk}, {80, contentChunk}, {90, usageChunk + "data: [DONE]\n\n"}}
	// message_delta without message_start: the output alone, its input the gate's estimate.
	outputOnly := append([]timedEvent{{5, named("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)}},
		messagesStream[1:]...)
	for _, tc := range []struct {
		name     string
		api      openai.API
		ct       string
		events   []timedEvent
		end      int
		complete bool
	}{
		{"chat", openai.APIChat, "text/event-stream", chat, 95, true},
		{"responses", openai.APIResponses, "text/event-stream", responsesStream, 152, true},
		{"messages", openai.APIMessages, "text/event-stream", messagesStream, 152, true},
		{"messages cut", openai.APIMessages, "text/event-stream", messagesStream[:4], 130, false},
		{"messages output only", openai.APIMessages, "text/event-stream", outputOnly, 152, true},
		{"responses cut", openai.APIResponses, "text/event-stream", responsesStream[:3], 130, false},
		{"responses body", openai.APIResponses, "application/json", []timedEvent{{40, `{"id":"resp_1","object":"response","status":"completed","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":12,"output_tokens":4,"total_tokens":16}}`}}, 40, true},
		{"messages body", openai.APIMessages, "application/json", []timedEvent{{40, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":12,"cache_creation_input_tokens":2,"output_tokens":4}}`}}, 40, true},
		{"embeddings", openai.APIEmbeddings, "application/json", []timedEvent{{40, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"e","usage":{"prompt_tokens":4,"total_tokens":4}}`}}, 40, true},
		{"count_tokens", openai.APICountTokens, "application/json", []timedEvent{{40, `{"input_tokens":21}`}}, 40, true},
	} {
		for _, withField := range []bool{true, false} {
			api := tc.api
			if !withField {
				api = ""
			}
			want, wantSettled := meterAPI(t, api, tc.ct, tc.events, tc.end, tc.complete)

			s, sink, policy, _ := alsServer(t)
			t0 := time.Now().Add(-time.Second).Truncate(time.Microsecond)
			at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
			var r wasmmeter.Recorder
			r.Start(at(0), api) // the module names the API from the request's path
			r.ResponseHeaders(tc.ct)
			for _, ev := range tc.events {
				r.Body([]byte(ev.body), at(ev.at))
			}
			sum, _ := r.End(tc.complete, at(tc.end))
			var f *gateField
			if withField {
				f = testField(api, tc.ct == "text/event-stream")
			}
			s.meterEntry(context.Background(), entryWith(t, sum.Encode(), t0, f))
			if len(sink.stamps) != 1 {
				t.Fatalf("%s (field %v): %d stamps", tc.name, withField, len(sink.stamps))
			}
			got := sink.stamps[0]
			if got.API != want.API || got.TTFT != want.TTFT || got.E2E != want.E2E || got.ContentEvents != want.ContentEvents ||
				got.ITLP50 != want.ITLP50 || got.ITLMax != want.ITLMax || got.PromptTokens != want.PromptTokens ||
				got.CompletionTokens != want.CompletionTokens || got.TokenSource != want.TokenSource ||
				got.ResponseModel != want.ResponseModel || got.UnreadEvents != want.UnreadEvents || got.Complete != want.Complete {
				t.Errorf("%s (field %v):\n wasm %+v\n  ext %+v", tc.name, withField, got, want)
			}
			if !withField {
				continue // nothing reserved: nothing settled
			}
			if len(policy.settled) != 1 {
				t.Fatalf("%s: %d settlements", tc.name, len(policy.settled))
			}
			// (meterAPI finishes without Envoy's EOF: its stream is lost,
			// never cut; the module's, incomplete, was cut by Envoy.)
			g := policy.settled[0]
			if g.PromptTokens != wantSettled.PromptTokens || g.CompletionTokens != wantSettled.CompletionTokens ||
				g.UsageRead != wantSettled.UsageRead || g.Events != wantSettled.Events || g.API != wantSettled.API ||
				(g.End == request.EndComplete) != (wantSettled.End == request.EndComplete) || (g.End == request.EndCut) == tc.complete {
				t.Errorf("%s: settlement\n wasm %+v\n  ext %+v", tc.name, g, wantSettled)
			}
		}
	}
}
