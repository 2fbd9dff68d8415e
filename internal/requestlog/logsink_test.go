package requestlog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

// slogSink is what LogSink replaced: the stamp through slog's JSON handler.
func slogSink(l *slog.Logger, s *request.Stamp) {
	attrs := []slog.Attr{
		slog.String("request_id", s.RequestID), slog.String("trace_id", s.TraceID), slog.String("principal", s.Principal),
		slog.String("tenant", s.Tenant), slog.String("model", s.Model), slog.String("api", string(s.API)), slog.String("response_model", s.ResponseModel),
		slog.String("pool", s.Pool), slog.String("upstream", s.Upstream), slog.Int("status", s.Status),
		slog.Int("attempts", s.Attempts), slog.Any("pools_tried", s.PoolsTried), slog.Bool("stream", s.Stream),
		slog.Int("prompt_tokens", s.PromptTokens), slog.Int("completion_tokens", s.CompletionTokens),
		slog.String("token_source", s.TokenSource), slog.Int("cached_tokens", s.CachedTokens)}
	if s.CacheWriteTokens > 0 {
		attrs = append(attrs, slog.Int("cache_write_tokens", s.CacheWriteTokens))
	}
	if c := s.Cost; c.Currency != "" {
		attrs = append(attrs, slog.Any("cost", json.Number(price.FormatCost(c.Amount))), slog.String("currency", c.Currency),
			slog.String("price_source", c.Price), slog.Bool("cost_counted", c.Counted))
	}
	attrs = append(attrs, slog.Float64("ttft_ms", stats.Ms(s.TTFT)),
		slog.Float64("itl_p50_ms", stats.Ms(s.ITLP50)), slog.Float64("itl_p95_ms", stats.Ms(s.ITLP95)), slog.Float64("itl_max_ms", stats.Ms(s.ITLMax)),
		slog.Int("content_events", s.ContentEvents), slog.Int("unread_events", s.UnreadEvents), slog.Float64("e2e_ms", stats.Ms(s.E2E)), slog.Float64("total_ms", stats.Ms(s.Total)),
		slog.Float64("gateway_ms", stats.Ms(s.Gateway.Total)), slog.Float64("gate_ms", stats.Ms(s.Gateway.Gate)),
		slog.Float64("auth_ms", stats.Ms(s.Gateway.Auth)), slog.Float64("policy_ms", stats.Ms(s.Gateway.Policy)),
		slog.Float64("ratelimit_ms", stats.Ms(s.Gateway.RateLimit)), slog.Float64("checks_ms", stats.Ms(s.Gateway.Checks)),
		slog.String("decision", s.Decision), slog.String("reason", s.Reason), slog.Bool("complete", s.Complete))
	l.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

var timeField = regexp.MustCompile(`^\{"time":"[^"]+",`)

// The stamp line is byte for byte what slog's JSON handler writes (but
// for the time, taken at a different instant).
func TestLogSinkMatchesSlog(t *testing.T) {
	stamps := []*request.Stamp{
		{},
		{RequestID: "26230273-b5a1", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Principal: "acme-prod", Tenant: "acme",
			Model: "llama-3-70b", ResponseModel: "meta/llama", Pool: "pool-a", Upstream: "127.0.0.1:47421", Status: 200,
			Attempts: 2, PoolsTried: []string{"pool-a", "pool-b"}, Stream: true, PromptTokens: 4, CompletionTokens: 8,
			TokenSource: "usage", TTFT: 121778 * time.Microsecond, ITLP50: 15390 * time.Microsecond, ITLP95: 16827 * time.Microsecond,
			ITLMax: 16827 * time.Microsecond, ContentEvents: 8, E2E: 228806 * time.Microsecond, Total: 234 * time.Millisecond,
			Gateway: request.GatewayTime{Total: 5650 * time.Microsecond, Gate: 171 * time.Microsecond,
				Timings: request.Timings{Auth: 4 * time.Microsecond, Policy: 61 * time.Microsecond, RateLimit: 32 * time.Microsecond}},
			Decision: "allow", Reason: "allowed on the premium tier", Complete: true},
		{Model: "gpt-4o-mini", Pool: "premium", Status: 200, PromptTokens: 2006, CachedTokens: 1920, CacheWriteTokens: 6, CompletionTokens: 1,
			TokenSource: "usage", Cost: request.Cost{Amount: 150_000, Currency: "USD", Price: "pool"}, Complete: true},
		{Model: "m", TokenSource: "events", Cost: request.Cost{Amount: 3_000_000_000_000, Currency: "EUR", Price: "model", Counted: true}},
		{Model: "quote\" back\\slash\n\r\t\x01 <html>&amp; \u2028\u2029 é 日本 \xff\xfe", PoolsTried: []string{}, Reason: "\x7f",
			TTFT: 1, E2E: 1 << 62, Total: -5 * time.Microsecond, Status: -1},
	}
	for _, st := range stamps {
		var want, got bytes.Buffer
		slogSink(slog.New(slog.NewJSONHandler(&want, nil)), st)
		NewLogSink(&got).Record(context.Background(), st)
		w, g := timeField.ReplaceAllString(want.String(), ""), timeField.ReplaceAllString(got.String(), "")
		if w != g {
			t.Errorf("stamp line differs from slog's:\n got %s\nwant %s", g, w)
		}
		var v map[string]any
		if err := json.Unmarshal(got.Bytes(), &v); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, got.String())
		}
		if _, err := time.Parse(time.RFC3339Nano, v["time"].(string)); err != nil {
			t.Errorf("time: %v", err)
		}
		if st.Cost.Currency != "" && !bytes.Contains(got.Bytes(), []byte(`"cost":`+price.FormatCost(st.Cost.Amount)+`,`)) {
			t.Errorf("cost not written exactly: %s", got.String())
		}
	}
}

func BenchmarkLogSink(b *testing.B) {
	st := &request.Stamp{RequestID: "26230273-b5a1", Principal: "acme-prod", Tenant: "acme", Model: "llama-3-70b", Pool: "pool-a",
		Upstream: "127.0.0.1:47421", Status: 200, Attempts: 1, PoolsTried: []string{"pool-a"}, Stream: true,
		TTFT: 121778 * time.Microsecond, E2E: 228806 * time.Microsecond, Decision: "allow", Reason: "allowed", Complete: true}
	l := NewLogSink(&bytes.Buffer{})
	b.ReportAllocs()
	for b.Loop() {
		l.w.(*bytes.Buffer).Reset()
		l.Record(context.Background(), st)
	}
}

// BenchmarkLogSinkSlog is the stamp line as it was written before: through
// slog's JSON handler (for comparison with BenchmarkLogSink).
func BenchmarkLogSinkSlog(b *testing.B) {
	st := &request.Stamp{RequestID: "26230273-b5a1", Principal: "acme-prod", Tenant: "acme", Model: "llama-3-70b", Pool: "pool-a",
		Upstream: "127.0.0.1:47421", Status: 200, Attempts: 1, PoolsTried: []string{"pool-a"}, Stream: true,
		TTFT: 121778 * time.Microsecond, E2E: 228806 * time.Microsecond, Decision: "allow", Reason: "allowed", Complete: true}
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, nil))
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		slogSink(l, st)
	}
}
