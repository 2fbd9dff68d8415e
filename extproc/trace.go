package extproc

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
	"github.com/infergate/infergate/internal/telemetry"
)

// Tracing. Spans are built once a phase is over, from the timestamps the
// gate and the meter keep anyway, so the per-chunk path does no tracing
// work at all.
//
// Parentage: Envoy's OpenTelemetry tracer sends its ext_proc call span as
// traceparent in the gRPC metadata of each ext_proc stream, so the gate's
// and the meter's spans sit under Envoy's request span. Without Envoy
// tracing the client's traceparent header is the parent, and the meter
// follows the gate's span (passed in dynamic metadata), so a request is
// still one trace.

// formatTraceparent renders sc as a W3C traceparent value.
func formatTraceparent(sc trace.SpanContext) string {
	c := propagation.MapCarrier{}
	telemetry.Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[request.TraceparentKey]
}

// mdCarrier reads trace context from a stream's incoming gRPC metadata,
// key by key (metadata.FromIncomingContext would copy all of it).
type mdCarrier struct{ ctx context.Context }

func (c mdCarrier) Get(k string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, k); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (c mdCarrier) Set(string, string) {}
func (c mdCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	out := make([]string, 0, len(md))
	for k := range md {
		out = append(out, k)
	}
	return out
}

// traceParent returns ctx with the parent for this request's spans: the
// ext_proc stream's (Envoy's span), else the first valid of fallbacks (the
// meter's: the gate's span). A client's own traceparent header is never a
// parent: only Envoy's tracer decides which traces a client may join.
func traceParent(ctx context.Context, fallbacks ...map[string]string) context.Context {
	if c := telemetry.Propagator.Extract(ctx, mdCarrier{ctx}); trace.SpanContextFromContext(c).IsValid() {
		return c
	}
	for _, h := range fallbacks {
		if h[request.TraceparentKey] == "" {
			continue
		}
		if c := telemetry.Propagator.Extract(ctx, propagation.MapCarrier(h)); trace.SpanContextFromContext(c).IsValid() {
			return c
		}
	}
	return ctx
}

// traceGate records the gate's span and, when the policy ran (policyAt set),
// one child per stage. It returns the gate span's context, for the meter.
func (s *Server) traceGate(ctx context.Context, g *gateRequest, policyAt, end time.Time, st *request.Stamp) trace.SpanContext {
	ctx, span := s.tracer.Start(traceParent(ctx), "infergate.gate", trace.WithTimestamp(g.started))
	if !span.IsRecording() {
		span.End(trace.WithTimestamp(end))
		return span.SpanContext()
	}
	span.SetAttributes(
		attribute.String("gen_ai.request.model", st.Model),
		attribute.String("infergate.request_id", st.RequestID),
		attribute.String("infergate.decision", st.Decision),
		attribute.String("infergate.reason", st.Reason),
		attribute.String("infergate.tenant", st.Tenant),
	)
	if op := st.API.Operation(); op != "" {
		span.SetAttributes(attribute.String("gen_ai.operation.name", op))
	}
	if st.Decision == "deny" {
		span.SetAttributes(attribute.Int("http.response.status_code", st.Status))
		span.SetStatus(codes.Error, st.Reason)
	}
	if !policyAt.IsZero() {
		// The stages run back to back from policyAt (internal/admission).
		at := policyAt
		for _, stage := range []struct {
			name string
			d    time.Duration
		}{
			{"infergate.auth", st.Gateway.Auth},
			{"infergate.policy", st.Gateway.Policy},
			{"infergate.ratelimit", st.Gateway.RateLimit},
			{"infergate.moderation", st.Gateway.Checks},
		} {
			if stage.d <= 0 {
				continue
			}
			_, child := s.tracer.Start(ctx, stage.name, trace.WithTimestamp(at))
			at = at.Add(stage.d)
			child.End(trace.WithTimestamp(at))
		}
	}
	span.End(trace.WithTimestamp(end))
	return span.SpanContext()
}

// traceMeter records the upstream's part of the request: a GenAI client
// span from the request leaving the gateway to the response's end, split
// into the wait for the first token (queueing and prefill) and the stream
// (decode), with the stamp's breakdown as attributes.
func (s *Server) traceMeter(ctx context.Context, m *meterRequest, end time.Time) trace.SpanContext {
	var gate map[string]string
	if m.GateTraceparent != "" {
		gate = map[string]string{request.TraceparentKey: m.GateTraceparent}
	}
	st := &m.Stamp
	name := operation(st.API) // the GenAI span name: "{operation} {model}"
	if st.Model != "" {
		name += " " + st.Model
	}
	ctx, span := s.tracer.Start(traceParent(ctx, gate), name, trace.WithTimestamp(m.Sent), trace.WithSpanKind(trace.SpanKindClient))
	if !span.IsRecording() {
		span.End(trace.WithTimestamp(end))
		return span.SpanContext()
	}
	span.SetAttributes(
		attribute.String("gen_ai.operation.name", operation(st.API)),
		attribute.String("infergate.api", string(st.API)),
		attribute.String("gen_ai.request.model", st.Model),
		attribute.String("gen_ai.response.model", st.ResponseModel),
		attribute.Int("gen_ai.usage.input_tokens", st.PromptTokens),
		attribute.Int("gen_ai.usage.output_tokens", st.CompletionTokens),
		attribute.Int("gen_ai.usage.cache_read.input_tokens", st.CachedTokens),
		attribute.Int("gen_ai.usage.cache_creation.input_tokens", st.CacheWriteTokens),
		attribute.String("server.address", st.Upstream),
		attribute.Int("http.response.status_code", st.Status),
		attribute.String("infergate.request_id", st.RequestID),
		attribute.String("infergate.pool", st.Pool),
		attribute.Int("infergate.attempts", st.Attempts),
		attribute.String("infergate.pools_tried", strings.Join(st.PoolsTried, ",")),
		attribute.String("infergate.decision", st.Decision),
		attribute.String("infergate.token_source", st.TokenSource),
		attribute.Float64("infergate.ttft_ms", stats.Ms(st.TTFT)),
		attribute.Float64("infergate.itl_p50_ms", stats.Ms(st.ITLP50)),
		attribute.Float64("infergate.itl_p95_ms", stats.Ms(st.ITLP95)),
		attribute.Float64("infergate.itl_max_ms", stats.Ms(st.ITLMax)),
		attribute.Float64("infergate.total_ms", stats.Ms(st.Total)),
		attribute.Float64("infergate.gateway_ms", stats.Ms(st.Gateway.Total)),
		attribute.Float64("infergate.model_ms", stats.Ms(st.E2E)),
		attribute.Float64("infergate.moderation_ms", stats.Ms(st.Gateway.Checks)),
		attribute.Bool("infergate.complete", st.Complete),
		attribute.String("infergate.timing", string(st.Timing)),
	)
	if st.Endpoint != "" { // an Endpoint Picker chose the pod
		span.SetAttributes(attribute.String("infergate.endpoint", st.Endpoint),
			attribute.Float64("infergate.picker_ms", stats.Ms(st.Gateway.Picker)))
	}
	if c := st.Cost; c.Currency != "" {
		span.SetAttributes(attribute.String("infergate.cost", price.FormatCost(c.Amount)),
			attribute.String("infergate.cost.currency", c.Currency), attribute.String("infergate.price_source", c.Price))
	}
	for i, p := range st.PoolsTried {
		span.AddEvent("attempt", trace.WithTimestamp(m.Sent),
			trace.WithAttributes(attribute.Int("infergate.attempt", i+1), attribute.String("infergate.pool", p)))
	}
	if st.Status >= 500 || !st.Complete {
		span.SetStatus(codes.Error, "upstream error or incomplete response")
	}
	if !m.Tally.First.IsZero() {
		_, wait := s.tracer.Start(ctx, "infergate.upstream.first_token", trace.WithTimestamp(m.Sent))
		wait.End(trace.WithTimestamp(m.Tally.First))
		_, decode := s.tracer.Start(ctx, "infergate.upstream.stream", trace.WithTimestamp(m.Tally.First))
		decode.End(trace.WithTimestamp(end))
	}
	span.End(trace.WithTimestamp(end))
	return span.SpanContext()
}
