package extproc

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// fieldHeaders is the request headers message with the gate's field for
// api (its estimate of the prompt: 40 tokens, reservation r-1); api ""
// sends no field, as a gate that wrote none.
func fieldHeaders(api openai.API, stream bool) *extprocv3.ProcessingRequest {
	msg := headersMsg(false, "x-request-id", "r-"+string(api), request.ModelHeader, "m")
	if api == "" {
		return msg
	}
	attrs, _ := structpb.NewStruct(map[string]any{request.MeterAttribute: sealed(testField(api, stream))})
	msg.Attributes = map[string]*structpb.Struct{attributesKey: attrs}
	return msg
}

// testField is the gate's field fieldHeaders sends.
func testField(api openai.API, stream bool) *gateField {
	return &gateField{stream: stream, promptTokens: 40, decision: "allow", requestID: "r-" + string(api), model: "m",
		reservation: "r-1", api: string(api)}
}

// named is one SSE event with an event: line.
func named(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }

// Streams of the Responses and Anthropic APIs, event by event, in their
// own formats (the mock's, bench/mock): at is each event's arrival in ms.
type timedEvent struct {
	at   int
	body string
}

var (
	responsesStream = []timedEvent{
		{5, named("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"m-2025","output":[],"usage":null}}`) +
			named("response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"m-2025","output":[],"usage":null}}`) +
			named("response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}`) +
			named("response.content_part.added", `{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}`)},
		{100, named("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel","logprobs":[]}`)},
		{120, named("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"lo","logprobs":[]}`)},
		{150, named("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":6,"item_id":"msg_1","output_index":0,"content_index":0,"delta":" you","logprobs":[]}`)},
		{151, named("response.output_text.done", `{"type":"response.output_text.done","sequence_number":7,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello you","logprobs":[]}`) +
			named("response.completed", `{"type":"response.completed","sequence_number":8,"response":{"id":"resp_1","object":"response","status":"completed","model":"m-2025","output":[{"id":"msg_1","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Hello you"}],"role":"assistant"}],"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":14}}}`)},
	}
	messagesStream = []timedEvent{
		{5, named("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`) +
			named("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
			named("ping", `{"type": "ping"}`)},
		{100, named("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`)},
		{110, named("ping", `{"type": "ping"}`)}, // not a token
		{120, named("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`)},
		{121, named("content_block_stop", `{"type":"content_block_stop","index":0}`) +
			named("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`) +
			named("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`)}, // empty: no token
		{150, named("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}`)},
		{151, named("content_block_stop", `{"type":"content_block_stop","index":1}`) +
			named("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}`) +
			named("message_stop", `{"type":"message_stop"}`)},
	}
)

// meterAPI runs events through a fresh meter (the gate's field naming api,
// or none) and finishes it at end ms, complete or not; it returns the stamp
// and the settlement.
func meterAPI(t *testing.T, api openai.API, ct string, events []timedEvent, end int, complete bool) (*request.Stamp, request.Settlement) {
	t.Helper()
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	m := testMeter(100, &s.orders)
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m.observe(fieldHeaders(api, ct == "text/event-stream"), at(0))
	m.observe(respHeaders(ct), at(1))
	for i, ev := range events {
		m.observe(respBody(ev.body, complete && i == len(events)-1), at(ev.at))
	}
	s.finish(context.Background(), m, at(end), complete)
	if len(p.settled) != 1 && api != "" {
		t.Fatalf("%d settlements", len(p.settled))
	}
	var settled request.Settlement
	if len(p.settled) == 1 {
		settled = p.settled[0]
	}
	return sink.stamps[0], settled
}

// The Responses API's stream: TTFT at the first output_text.delta (not at
// response.created), every gap between deltas, the usage of
// response.completed, settled; with the gate's field or without (the
// event names tell).
func TestMeterStampsResponsesStream(t *testing.T) {
	for _, api := range []openai.API{openai.APIResponses, ""} {
		st, settled := meterAPI(t, api, "text/event-stream", responsesStream, 152, true)
		if st.API != openai.APIResponses {
			t.Errorf("field %q: API %q", api, st.API)
		}
		if st.TTFT != 100*time.Millisecond || st.ContentEvents != 3 || st.ITLP50 != 20*time.Millisecond ||
			st.ITLMax != 30*time.Millisecond || st.E2E != 152*time.Millisecond {
			t.Errorf("field %q: TTFT %v, %d events, ITL p50 %v max %v, E2E %v", api, st.TTFT, st.ContentEvents, st.ITLP50, st.ITLMax, st.E2E)
		}
		if st.PromptTokens != 11 || st.CompletionTokens != 3 || st.TokenSource != "usage" || st.ResponseModel != "m-2025" || st.UnreadEvents != 0 {
			t.Errorf("field %q: tokens %d + %d (%s), model %q, unread %d", api, st.PromptTokens, st.CompletionTokens, st.TokenSource, st.ResponseModel, st.UnreadEvents)
		}
		if api != "" && (settled.Reservation != "r-1" || settled.PromptTokens != 11 || settled.CompletionTokens != 3 || !settled.UsageRead || settled.End != request.EndComplete || !settled.Terminal) {
			t.Errorf("settlement %+v, want r-1 settled with 11 + 3 from the usage", settled)
		}
	}
}

// Anthropic's stream: TTFT at the first content_block_delta, pings and an
// empty partial_json not tokens, tool input JSON a token; the input of
// message_start (cache reads included) and the output of message_delta.
func TestMeterStampsMessagesStream(t *testing.T) {
	for _, api := range []openai.API{openai.APIMessages, ""} {
		st, settled := meterAPI(t, api, "text/event-stream", messagesStream, 152, true)
		if st.API != openai.APIMessages {
			t.Errorf("field %q: API %q", api, st.API)
		}
		if st.TTFT != 100*time.Millisecond || st.ContentEvents != 3 || st.ITLP50 != 20*time.Millisecond ||
			st.ITLMax != 30*time.Millisecond {
			t.Errorf("field %q: TTFT %v, %d events, ITL p50 %v max %v", api, st.TTFT, st.ContentEvents, st.ITLP50, st.ITLMax)
		}
		if st.PromptTokens != 30 || st.CompletionTokens != 9 || st.TokenSource != "usage" || st.ResponseModel != "claude-m" || st.UnreadEvents != 0 {
			t.Errorf("field %q: tokens %d + %d (%s), model %q, unread %d", api, st.PromptTokens, st.CompletionTokens, st.TokenSource, st.ResponseModel, st.UnreadEvents)
		}
		if api != "" && (settled.PromptTokens != 30 || settled.CompletionTokens != 9 || !settled.UsageRead || !settled.Terminal) {
			t.Errorf("settlement %+v, want 30 + 9 from the usage", settled)
		}
	}
}

// An Anthropic stream cut before message_delta reports message_start's
// input (not the gate's estimate) and the output counted, and no end.
func TestMeterSettlesCutMessagesStream(t *testing.T) {
	st, settled := meterAPI(t, openai.APIMessages, "text/event-stream", messagesStream[:4], 130, false)
	if st.Complete || st.TokenSource != "events" || st.PromptTokens != 30 || st.CompletionTokens != 2 {
		t.Errorf("stamp: complete %v, tokens %d + %d (%s)", st.Complete, st.PromptTokens, st.CompletionTokens, st.TokenSource)
	}
	if settled.UsageRead || settled.End == request.EndComplete || settled.Terminal || !settled.InputReported ||
		settled.PromptTokens != 30 || settled.Events != 2 {
		t.Errorf("settlement %+v", settled)
	}
}

// Non-streamed answers of each API: the usage in the API's names; TTFT is
// E2E for an answer with content, none for embeddings (no first token) nor
// count_tokens, whose count the meter reports as it reads it (admission
// charges the request alone: the count is no usage).
func TestMeterStampsNonStreamedAPIs(t *testing.T) {
	for _, tc := range []struct {
		api           openai.API
		body          string
		prompt, comp  int
		ttft          bool
		settleP, setC int
	}{
		{openai.APIResponses, `{"id":"resp_1","object":"response","status":"completed","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":12,"output_tokens":4,"total_tokens":16}}`,
			12, 4, true, 12, 4},
		{openai.APIMessages, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":2,"output_tokens":4}}`,
			14, 4, true, 14, 4},
		{openai.APIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AACAPw=="}],"model":"m","usage":{"prompt_tokens":12,"total_tokens":12}}`,
			12, 0, false, 12, 0},
		{openai.APICountTokens, `{"input_tokens":12}`, 12, 0, false, 12, 0},
	} {
		for _, fromField := range []bool{true, false} {
			api := tc.api
			if !fromField {
				if api == openai.APICountTokens {
					continue // its answer does not name it
				}
				api = ""
			}
			body := tc.body
			st, settled := meterAPI(t, api, "application/json", []timedEvent{{30, body[:10]}, {80, body[10:]}}, 80, true)
			if st.API != tc.api || st.PromptTokens != tc.prompt || st.CompletionTokens != tc.comp || st.TokenSource != "usage" || st.E2E != 80*time.Millisecond {
				t.Errorf("%s (field %v): API %q, tokens %d + %d (%s), E2E %v", tc.api, fromField, st.API, st.PromptTokens, st.CompletionTokens, st.TokenSource, st.E2E)
			}
			if want := tc.ttft; (st.TTFT == 80*time.Millisecond) != want || !want && (st.TTFT != 0 || st.ContentEvents != 0) {
				t.Errorf("%s (field %v): TTFT %v, %d content events", tc.api, fromField, st.TTFT, st.ContentEvents)
			}
			if fromField && (settled.PromptTokens != tc.settleP || settled.CompletionTokens != tc.setC || settled.End != request.EndComplete || settled.API != tc.api) {
				t.Errorf("%s: settlement %+v, want %d + %d", tc.api, settled, tc.settleP, tc.setC)
			}
		}
	}
}

// BenchmarkMeterEvent is the per-chunk path of each API's content event,
// as BenchmarkMeterChunk is chat's.
func BenchmarkMeterEvent(b *testing.B) {
	for _, tc := range []struct {
		api  openai.API
		body string
	}{
		{openai.APIChat, contentChunk},
		{openai.APIResponses, responsesStream[1].body},
		{openai.APIMessages, messagesStream[1].body},
	} {
		b.Run(string(tc.api), func(b *testing.B) {
			m := testMeter(1<<30, nil)
			m.Tally.SSE, m.Tally.API = true, tc.api
			msg := respBody(tc.body, false)
			at := time.Now()
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				m.observe(msg, at)
				if len(m.Tally.Gaps) > 1<<16 {
					m.Tally.Gaps = m.Tally.Gaps[:0]
				}
			}
			if m.Tally.ContentEvents == 0 || m.Tally.BadEvents > 0 {
				b.Fatal("event not counted")
			}
		})
	}
}

// The Responses and Anthropic streams, however Envoy splits them, count
// the same (the stream fuzz target's seeds).
func apiStreamSeeds() []string {
	var out []string
	for _, evs := range [][]timedEvent{responsesStream, messagesStream} {
		var b strings.Builder
		for _, ev := range evs {
			b.WriteString(ev.body)
		}
		out = append(out, b.String())
	}
	return out
}

// histogramOps counts a histogram's recordings by gen_ai.operation.name.
func histogramOps(t *testing.T, r *sdkmetric.ManualReader, name string) map[string]uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			add := func(attrs attribute.Set, n uint64) {
				v, _ := attrs.Value("gen_ai.operation.name")
				out[v.AsString()] += n
			}
			switch h := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range h.DataPoints {
					add(dp.Attributes, dp.Count)
				}
			case metricdata.Histogram[int64]:
				for _, dp := range h.DataPoints {
					add(dp.Attributes, dp.Count)
				}
			}
		}
	}
	return out
}

// The GenAI metrics name each API's operation; embeddings have a duration
// and input tokens but no first token.
func TestMeterMetricsPerAPI(t *testing.T) {
	s, _, _, reader := alsServer(t)
	run := func(api openai.API, ct string, events []timedEvent) {
		m := testMeter(100, &s.orders)
		t0 := time.Unix(1000, 0)
		m.observe(fieldHeaders(api, ct == "text/event-stream"), t0)
		m.observe(respHeaders(ct), t0)
		for _, ev := range events {
			m.observe(respBody(ev.body, false), t0.Add(time.Duration(ev.at)*time.Millisecond))
		}
		s.finish(context.Background(), m, t0.Add(200*time.Millisecond), true)
	}
	run(openai.APIResponses, "text/event-stream", responsesStream)
	run(openai.APIMessages, "text/event-stream", messagesStream)
	run(openai.APICompletions, "text/event-stream", []timedEvent{{10, "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\"}]}\n\n"}})
	run(openai.APIEmbeddings, "application/json", []timedEvent{{50, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"m","usage":{"prompt_tokens":4,"total_tokens":4}}`}})
	if got := histogramOps(t, reader, "gen_ai.server.time_to_first_token"); !maps.Equal(got, map[string]uint64{"chat": 2, "text_completion": 1}) {
		t.Errorf("TTFT recordings by operation: %v", got)
	}
	if got := histogramOps(t, reader, "gen_ai.server.request.duration"); !maps.Equal(got, map[string]uint64{"chat": 2, "text_completion": 1, "embeddings": 1}) {
		t.Errorf("durations by operation: %v", got)
	}
	// Input and output for each generating API, input alone for embeddings.
	if got := histogramOps(t, reader, "gen_ai.client.token.usage"); !maps.Equal(got, map[string]uint64{"chat": 4, "text_completion": 2, "embeddings": 1}) {
		t.Errorf("token usage by operation: %v", got)
	}
}

// claimsFirst is a sealer whose seals are always claimed first, so a
// benchmark may replay one sealed field as many fresh requests.
type claimsFirst struct{ FieldSealer }

func (claimsFirst) Claim(context.Context, string, string, string, time.Time) (bool, error) {
	return true, nil
}

// BenchmarkMeterRequest is the meter's whole work for a streamed chat
// request: the gate's sealed field read, 20 content events, the usage and
// [DONE], then the stamp, the settlement, the metrics and the sinks.
func BenchmarkMeterRequest(b *testing.B) {
	s, sink := newTestServer(b, "log: {requests: false}")
	s.policy = &capPolicy{}
	hdrs := fieldHeaders(openai.APIChat, true)
	resp := respHeaders("text/event-stream")
	content := respBody(contentChunk, false)
	last := respBody(usageChunk+"data: [DONE]\n\n", true)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	b.ReportAllocs()
	for b.Loop() {
		m := s.newMeterRequest()
		m.sealer = claimsFirst{m.sealer}
		m.observe(hdrs, t0)
		m.observe(resp, t0.Add(time.Millisecond))
		for i := range 20 {
			m.observe(content, t0.Add(time.Duration(10+i)*time.Millisecond))
		}
		if !m.observe(last, t0.Add(31*time.Millisecond)) {
			b.Fatal("the response did not end")
		}
		s.finish(ctx, m, t0.Add(31*time.Millisecond), true)
		if st := sink.stamps[len(sink.stamps)-1]; st.Unverified || st.CompletionTokens != 3 {
			b.Fatalf("stamp %+v", st)
		}
		sink.stamps = sink.stamps[:0]
		s.policy.(*capPolicy).settled = s.policy.(*capPolicy).settled[:0]
	}
}
