package extproc

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/telemetry"
)

// Stamp is the one record infergate keeps per request. Times are measured by
// infergate from message arrivals on one ext_proc stream, so transport skew
// between Envoy and infergate cancels; Gateway.Total compares Envoy's
// request.time with infergate's clock and assumes they are in sync.
type Stamp struct {
	RequestID     string
	TraceID       string // OpenTelemetry trace id, when traced
	Principal     string // key id or JWT subject, never a credential
	Tenant        string
	Model         string // the model the client asked for
	ResponseModel string // the model the upstream answered as
	Pool          string // the pool (Envoy cluster) that served it
	// PoolsTried are the pools the attempts went to, in order; the last
	// is Pool. More than one when a retry fell back to the next pool.
	PoolsTried       []string
	Upstream         string // upstream host:port
	Status           int
	Attempts         int
	Stream           bool
	PromptTokens     int
	CompletionTokens int
	TokenSource      string // "usage" (from the model server) or "events" (counted)
	// TTFT is from the request leaving the gateway to the first content
	// token arriving back at Envoy: upstream queueing + prefill + network.
	TTFT time.Duration
	// ITL summarises the gaps between content-bearing chunks.
	ITLP50, ITLP95, ITLMax time.Duration
	ContentEvents          int
	// Start is when Envoy received the request; Sent when it left the
	// gateway for the upstream (zero for requests the gate denied).
	Start, Sent time.Time
	// Total is Envoy receiving the request to the response's last byte:
	// Gateway.Total + Gateway.Checks + E2E.
	Total time.Duration
	// Model time: from the request leaving the gateway to the response's last byte.
	E2E time.Duration
	// Gaps are the inter-token gaps (up to meter.maxTrackedGaps), for the
	// request pages; sinks must not keep a reference they modify.
	Gaps     []time.Duration
	Gateway  GatewayTime
	Decision string
	Reason   string
	// Complete is false when the stream ended before the response did
	// (client gone, upstream reset).
	Complete bool
}

// GatewayTime is the time spent in the gateway before the upstream got the
// request, split by stage.
type GatewayTime struct {
	// Total is Envoy receiving the request to the request leaving for the
	// upstream, less external checks (Timings.Checks), which are neither
	// gateway nor model time.
	Total time.Duration
	Gate  time.Duration // the gate's decision: auth, policy, rate limits, mutations (not checks)
	Timings
}

// Sink receives every stamp. Implementations must not block.
type Sink interface {
	Record(ctx context.Context, s *Stamp)
}

func (s *Server) record(ctx context.Context, st *Stamp) {
	for _, sink := range s.sinks {
		sink.Record(ctx, st)
	}
}

// LogSink writes each stamp as one JSON log line ("msg":"request").
type LogSink struct{ Logger *slog.Logger }

// Record implements Sink.
func (l LogSink) Record(ctx context.Context, s *Stamp) {
	l.Logger.LogAttrs(ctx, slog.LevelInfo, "request",
		slog.String("request_id", s.RequestID),
		slog.String("trace_id", s.TraceID),
		slog.String("principal", s.Principal),
		slog.String("tenant", s.Tenant),
		slog.String("model", s.Model),
		slog.String("response_model", s.ResponseModel),
		slog.String("pool", s.Pool),
		slog.String("upstream", s.Upstream),
		slog.Int("status", s.Status),
		slog.Int("attempts", s.Attempts),
		slog.Any("pools_tried", s.PoolsTried),
		slog.Bool("stream", s.Stream),
		slog.Int("prompt_tokens", s.PromptTokens),
		slog.Int("completion_tokens", s.CompletionTokens),
		slog.String("token_source", s.TokenSource),
		slog.Float64("ttft_ms", ms(s.TTFT)),
		slog.Float64("itl_p50_ms", ms(s.ITLP50)),
		slog.Float64("itl_p95_ms", ms(s.ITLP95)),
		slog.Float64("itl_max_ms", ms(s.ITLMax)),
		slog.Int("content_events", s.ContentEvents),
		slog.Float64("e2e_ms", ms(s.E2E)),
		slog.Float64("total_ms", ms(s.Total)),
		slog.Float64("gateway_ms", ms(s.Gateway.Total)),
		slog.Float64("gate_ms", ms(s.Gateway.Gate)),
		slog.Float64("auth_ms", ms(s.Gateway.Auth)),
		slog.Float64("policy_ms", ms(s.Gateway.Policy)),
		slog.Float64("ratelimit_ms", ms(s.Gateway.RateLimit)),
		slog.Float64("checks_ms", ms(s.Gateway.Checks)),
		slog.String("decision", s.Decision),
		slog.String("reason", s.Reason),
		slog.Bool("complete", s.Complete),
	)
}

// ms renders a duration as milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// metricsSink records the GenAI histograms for admitted requests.
type metricsSink struct{ m *telemetry.Metrics }

func (ms metricsSink) Record(ctx context.Context, s *Stamp) {
	if s.Decision == "deny" {
		return // denials are counted by infergate.gate.decisions
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.request.model", s.Model),
		attribute.String("infergate.pool", s.Pool),
	}
	if s.Status >= 400 || !s.Complete {
		errType := strconv.Itoa(s.Status)
		if !s.Complete {
			errType = "incomplete"
		}
		attrs = append(attrs, attribute.String("error.type", errType))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	ms.m.RequestSeconds.Record(ctx, s.E2E.Seconds(), set)
	ms.m.GatewaySeconds.Record(ctx, s.Gateway.Total.Seconds(), set)
	if s.Gateway.Checks > 0 {
		ms.m.ChecksSeconds.Record(ctx, s.Gateway.Checks.Seconds(), set)
	}
	if s.Status >= 400 || s.ContentEvents == 0 {
		return
	}
	ms.m.TTFT.Record(ctx, s.TTFT.Seconds(), set)
	if s.CompletionTokens > 1 {
		ms.m.TimePerToken.Record(ctx, (s.E2E-s.TTFT).Seconds()/float64(s.CompletionTokens-1), set)
	}
	in := metric.WithAttributeSet(attribute.NewSet(append(attrs, attribute.String("gen_ai.token.type", "input"))...))
	out := metric.WithAttributeSet(attribute.NewSet(append(attrs, attribute.String("gen_ai.token.type", "output"))...))
	ms.m.TokenUsage.Record(ctx, int64(s.PromptTokens), in)
	ms.m.TokenUsage.Record(ctx, int64(s.CompletionTokens), out)
}

// decisionAttrs labels a decision by its OpenAI error code: a small, fixed
// set. Reasons are free text (a policy may quote the request) and would
// explode the metric's cardinality; they go to the stamp instead.
func decisionAttrs(decision, code string) metric.AddOption {
	return metric.WithAttributes(attribute.String("decision", decision), attribute.String("code", code))
}
