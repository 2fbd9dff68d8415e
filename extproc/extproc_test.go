package extproc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/telemetry"
)

type captureSink struct{ stamps []*request.Stamp }

func (c *captureSink) Record(_ context.Context, s *request.Stamp) { c.stamps = append(c.stamps, s) }

func newTestServer(t testing.TB, yaml string) (*Server, *captureSink) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	sink := &captureSink{}
	s, err := New(Options{CompletionPaths: cfg.Gate.Paths, MaxBodyBytes: cfg.Gate.MaxBodyBytes, KeepUsageOption: !*cfg.Gate.InjectUsage,
		HonourUsageOptOut: cfg.Gate.HonourUsageOptOut, ChatOutputLimit: cfg.Gate.ChatOutputLimit,
		MaxEventBytes: cfg.Meter.MaxEventBytes, MaxTrackedGaps: cfg.Meter.MaxTrackedGaps,
		Meter: m.Meter(), Sinks: []request.Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	return s, sink
}

func headersMsg(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:                         modes.ProcessingMode_STREAMED,
			SendBodyWithoutWaitingForHeaderResponse: true,
		},
	}
}

func bodyMsg(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}}
}

var chatHeaders = []string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json",
	"x-request-id", "req-1", "x-infergate-model", "spoofed"}

// In the recommended mode the gate answers headers and every body chunk
// together, once, after the last chunk: one round trip.
func TestGateEagerModeIsOneRoundTrip(t *testing.T) {
	s, _ := newTestServer(t, "")
	g := &gateRequest{started: time.Now(), eager: true}
	ctx := context.Background()
	if out := s.gateStep(ctx, g, headersMsg(false, chatHeaders...)); out != nil {
		t.Fatalf("answered headers before the body: %v", out)
	}
	if out := s.gateStep(ctx, g, bodyMsg(`{"model":"m1","stream":true,`, false)); out != nil {
		t.Fatalf("answered a partial body: %v", out)
	}
	out := s.gateStep(ctx, g, bodyMsg(`"messages":[{"role":"user","content":"hi"}]}`, true))
	if len(out) != 3 {
		t.Fatalf("got %d answers, want headers + 2 body chunks", len(out))
	}
	hr := out[0].GetRequestHeaders().GetResponse()
	if !hr.GetClearRouteCache() {
		t.Error("route cache not cleared: Envoy would route on stale headers")
	}
	set := map[string]string{}
	for _, h := range hr.GetHeaderMutation().GetSetHeaders() {
		set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if set[request.ModelHeader] != "m1" {
		t.Errorf("%s = %q, want m1", request.ModelHeader, set[request.ModelHeader])
	}
	if got := hr.GetHeaderMutation().GetRemoveHeaders(); !slices.Equal(got, append([]string{"x-infergate-model"}, request.PickerHeaders...)) {
		t.Errorf("removed %v, want the spoofed x-infergate-model and the Inference Extension's headers", got)
	}
	first := out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody()
	if !strings.Contains(string(first), `"stream_options":{"include_usage":true}`) {
		t.Errorf("first chunk should carry the whole rewritten body, got %q", first)
	}
	if set["content-length"] != fmt.Sprint(len(first)) {
		t.Errorf("content-length %q for a %d-byte body", set["content-length"], len(first))
	}
	if !out[2].GetRequestBody().GetResponse().GetBodyMutation().GetClearBody() {
		t.Error("second chunk must be cleared: its bytes are already in the first")
	}
	md := out[0].GetDynamicMetadata().GetFields()[request.MetadataNamespace].GetStructValue().GetFields()
	if md["model"].GetStringValue() != "m1" || !md["stream"].GetBoolValue() {
		t.Errorf("metadata for the meter = %v", md)
	}
}

// With a BUFFERED body the decision rides on the body answer.
func TestGateBufferedMode(t *testing.T) {
	s, _ := newTestServer(t, "")
	g := &gateRequest{started: time.Now()}
	ctx := context.Background()
	out := s.gateStep(ctx, g, headersMsg(false, chatHeaders...))
	if len(out) != 1 || out[0].GetRequestHeaders() == nil {
		t.Fatalf("headers must be answered at once in buffered mode: %v", out)
	}
	out = s.gateStep(ctx, g, bodyMsg(`{"model":"m2","stream":false}`, true))
	if len(out) != 1 {
		t.Fatalf("got %d answers", len(out))
	}
	common := out[0].GetRequestBody().GetResponse()
	if common.GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetKey() != request.ModelHeader || !common.GetClearRouteCache() {
		t.Errorf("body answer lacks the routing mutation: %v", common)
	}
	if common.GetBodyMutation() != nil {
		t.Error("non-streaming body must not be rewritten")
	}
}

func TestGateDenials(t *testing.T) {
	s, sink := newTestServer(t, "gate: {maxBodyBytes: 64}")
	cases := []struct {
		name    string
		headers []string
		body    string
		status  int
		code    string
	}{
		{"bad json", chatHeaders, `{"model":`, 400, "invalid_json"},
		{"no model", chatHeaders, `{"messages":[]}`, 400, "missing_model"},
		{"too large", chatHeaders, `{"model":"m","messages":[{"content":"` + strings.Repeat("x", 100) + `"}]}`, 413, "request_too_large"},
		{"text/plain", []string{":method", "POST", ":path", "/v1/completions", "content-type", "text/plain"}, `{"model":"m"}`, 415, "unsupported_media_type"},
		{"unknown path", []string{":method", "POST", ":path", "/admin", "content-type", "application/json"}, `{"model":"m"}`, 404, "unknown_url"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := &gateRequest{started: time.Now(), eager: true}
			s.gateStep(context.Background(), g, headersMsg(false, c.headers...))
			out := s.gateStep(context.Background(), g, bodyMsg(c.body, true))
			if len(out) != 1 || out[0].GetImmediateResponse() == nil {
				t.Fatalf("want one immediate response, got %v", out)
			}
			ir := out[0].GetImmediateResponse()
			if int(ir.GetStatus().GetCode()) != c.status || !strings.Contains(string(ir.GetBody()), `"code":"`+c.code+`"`) {
				t.Errorf("got %d %s", ir.GetStatus().GetCode(), ir.GetBody())
			}
			last := sink.stamps[len(sink.stamps)-1]
			if last.Decision != "deny" || last.Reason != c.code || last.Status != c.status {
				t.Errorf("stamp = %+v", last)
			}
		})
	}
	// A request with no body at all still gets a decision.
	g := &gateRequest{started: time.Now(), eager: true}
	out := s.gateStep(context.Background(), g, headersMsg(true, ":method", "GET", ":path", "/v1/chat/completions"))
	if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 405 {
		t.Fatalf("body-less GET: %v", out)
	}
}

func respHeaders(ct string) *extprocv3.ProcessingRequest {
	attrs, _ := structpb.NewStruct(map[string]any{"response.code": 200, "upstream.address": "10.0.0.1:8000",
		"xds.cluster_name": "pool-a", "upstream.request_attempt_count": 1})
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "content-type", RawValue: []byte(ct)}}}}},
		Attributes: map[string]*structpb.Struct{attributesKey: attrs},
	}
}

func respBody(s string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: eos}}}
}

const (
	roleChunk    = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
	contentChunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n"
	usageChunk   = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n"
)

// The meter times the first content token, not the role-only chunk, and
// keeps every gap; an event split across chunks is counted once.
func TestMeterTimings(t *testing.T) {
	s, sink := newTestServer(t, "")
	m := testMeter(100, nil)
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m.observe(headersMsg(false, "x-request-id", "r1", request.ModelHeader, "m"), at(0))
	m.observe(respHeaders("text/event-stream"), at(1))
	m.observe(respBody(roleChunk, false), at(2))
	m.observe(respBody(contentChunk, false), at(100))
	m.observe(respBody(contentChunk[:30], false), at(120))
	m.observe(respBody(contentChunk[30:], false), at(121)) // completes at 121
	m.observe(respBody(contentChunk+usageChunk, false), at(150))
	done := m.observe(respBody("data: [DONE]\n\n", true), at(151))
	if !done {
		t.Fatal("end of stream not detected")
	}
	s.finish(context.Background(), m, at(151), true)
	st := sink.stamps[0]
	if st.TTFT != 100*time.Millisecond {
		t.Errorf("TTFT %v, want 100ms (the role chunk at 2ms must not count)", st.TTFT)
	}
	if st.ITLP50 != 21*time.Millisecond || st.ITLMax != 29*time.Millisecond || st.ContentEvents != 3 {
		t.Errorf("ITL p50 %v max %v events %d; want 21ms, 29ms, 3", st.ITLP50, st.ITLMax, st.ContentEvents)
	}
	if st.CompletionTokens != 3 || st.PromptTokens != 7 || st.TokenSource != "usage" {
		t.Errorf("tokens %d/%d from %q", st.PromptTokens, st.CompletionTokens, st.TokenSource)
	}
	if st.Pool != "pool-a" || st.Upstream != "10.0.0.1:8000" || st.Status != 200 || st.Attempts != 1 || !st.Complete {
		t.Errorf("stamp = %+v", st)
	}
	if st.E2E != 151*time.Millisecond {
		t.Errorf("E2E %v", st.E2E)
	}
}

// A stream that dies early is still stamped, as incomplete, with tokens
// counted from the events seen.
func TestMeterIncompleteStream(t *testing.T) {
	s, sink := newTestServer(t, "")
	m := testMeter(100, nil)
	t0 := time.Unix(1000, 0)
	m.observe(headersMsg(false, "x-request-id", "r2"), t0)
	m.observe(respHeaders("text/event-stream"), t0)
	m.observe(respBody(contentChunk+contentChunk, false), t0.Add(50*time.Millisecond))
	s.finish(context.Background(), m, t0.Add(60*time.Millisecond), false)
	st := sink.stamps[0]
	if st.Complete || st.TokenSource != "events" || st.CompletionTokens != 2 {
		t.Errorf("stamp = %+v", st)
	}
}

// Non-streamed responses: TTFT is E2E and tokens come from usage.
func TestMeterNonStreaming(t *testing.T) {
	s, sink := newTestServer(t, "")
	m := testMeter(100, nil)
	t0 := time.Unix(1000, 0)
	m.observe(headersMsg(false, "x-request-id", "r3"), t0)
	m.observe(respHeaders("application/json"), t0)
	body := `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`
	m.observe(respBody(body[:40], false), t0.Add(10*time.Millisecond))
	m.observe(respBody(body[40:], true), t0.Add(80*time.Millisecond))
	s.finish(context.Background(), m, t0.Add(80*time.Millisecond), true)
	st := sink.stamps[0]
	if st.TTFT != 80*time.Millisecond || st.E2E != 80*time.Millisecond || st.CompletionTokens != 9 || st.PromptTokens != 5 {
		t.Errorf("stamp = %+v", st)
	}
}

// BenchmarkGateDecide is the gate's whole per-request work for a typical
// streaming chat request in the one-round-trip mode.
func BenchmarkGateDecide(b *testing.B) {
	s, _ := newTestServer(b, "log: {requests: false}")
	body := `{"model":"llama-3-70b","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` +
		strings.Repeat("Explain how Envoy streams tokens. ", 30) + `"}]}`
	h := headersMsg(false, chatHeaders...)
	bm := bodyMsg(body, true)
	ctx := context.Background()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		g := &gateRequest{started: time.Now(), eager: true}
		s.gateStep(ctx, g, h)
		if out := s.gateStep(ctx, g, bm); len(out) != 2 {
			b.Fatal(out)
		}
	}
}

// BenchmarkMeterChunk is the meter's per-chunk path: one SSE content event
// per response-body message, as Envoy delivers a streamed token.
func BenchmarkMeterChunk(b *testing.B) {
	m := testMeter(1<<30, nil)
	m.Tally.SSE = true
	msg := respBody(contentChunk, false)
	at := time.Now()
	b.SetBytes(int64(len(contentChunk)))
	b.ReportAllocs()
	for b.Loop() {
		m.observe(msg, at)
		if m.Tally.ContentEvents == 0 {
			b.Fatal("event not counted")
		}
		if len(m.Tally.Gaps) > 1<<16 {
			m.Tally.Gaps = m.Tally.Gaps[:0]
		}
	}
}

// FuzzMeterStream: whatever an upstream streams, split wherever Envoy
// splits it, the meter counts the same content events and never panics.
func FuzzMeterStream(f *testing.F) {
	f.Add([]byte(roleChunk+contentChunk+contentChunk+usageChunk+"data: [DONE]\n\n"), 40)
	f.Add([]byte("data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n: ping\n\ndata: [DONE]\n\n"), 7)
	f.Add([]byte("data: {not json}\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n"), 3)
	for i, seed := range apiStreamSeeds() { // the Responses and Anthropic APIs' named events
		f.Add([]byte(seed), 97*(i+1))
	}
	f.Fuzz(func(t *testing.T, stream []byte, split int) {
		count := func(chunks ...[]byte) (int, *request.Stamp) {
			s, sink := newTestServer(t, "")
			m := testMeter(100, nil)
			now := time.Unix(1, 0)
			m.observe(headersMsg(false, "x-request-id", "f"), now)
			m.observe(respHeaders("text/event-stream"), now)
			for _, c := range chunks {
				m.observe(respBody(string(c), false), now)
			}
			s.finish(context.Background(), m, now, true)
			return sink.stamps[0].ContentEvents, sink.stamps[0]
		}
		whole, st := count(stream)
		if split < 0 {
			split = -split
		}
		split %= len(stream) + 1
		parts, _ := count(stream[:split], stream[split:])
		if whole != parts {
			t.Fatalf("%d content events whole, %d split at %d", whole, parts, split)
		}
		if st.TTFT < 0 || st.E2E < 0 || st.ITLMax < 0 {
			t.Fatalf("negative timing in %+v", st)
		}
	})
}
