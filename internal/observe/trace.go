package observe

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
	"github.com/infergate/infergate/internal/telemetry"
)

// Tracing. Spans are built once a phase is over, from the timestamps the
// gate and the meter keep anyway, so the per-chunk path does no tracing
// work at all. Where the parent comes from is the adapter's (ext_proc's
// stream metadata; the module's request headers).

// Traceparent renders sc as a W3C traceparent value.
func Traceparent(sc trace.SpanContext) string {
	c := propagation.MapCarrier{}
	telemetry.Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[request.TraceparentKey]
}

// Parent returns ctx with the first valid parent of carriers (each a map
// holding a traceparent), or ctx unchanged.
func Parent(ctx context.Context, carriers ...map[string]string) context.Context {
	for _, h := range carriers {
		if h[request.TraceparentKey] == "" {
			continue
		}
		if c := telemetry.Propagator.Extract(ctx, propagation.MapCarrier(h)); trace.SpanContextFromContext(c).IsValid() {
			return c
		}
	}
	return ctx
}

// GateSpan records the gate's span, from started to end, under ctx's
// parent and, when the policy ran (policyAt set), one child per stage. It
// returns the gate span's context, for the meter.
func GateSpan(ctx context.Context, tracer trace.Tracer, started, policyAt, end time.Time, st *request.Stamp) trace.SpanContext {
	ctx, span := tracer.Start(ctx, "infergate.gate", trace.WithTimestamp(started))
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
			_, child := tracer.Start(ctx, stage.name, trace.WithTimestamp(at))
			at = at.Add(stage.d)
			child.End(trace.WithTimestamp(at))
		}
	}
	span.End(trace.WithTimestamp(end))
	return span.SpanContext()
}

// MeterSpan records the upstream's part of the request under ctx's
// parent: a GenAI client span from the request leaving the gateway (sent)
// to the response's end, split into the wait for the first token
// (queueing and prefill, until first; none when zero) and the stream
// (decode), with the stamp's breakdown as attributes.
func MeterSpan(ctx context.Context, tracer trace.Tracer, sent, first, end time.Time, st *request.Stamp) trace.SpanContext {
	name := Operation(st.API) // the GenAI span name: "{operation} {model}"
	if st.Model != "" {
		name += " " + st.Model
	}
	ctx, span := tracer.Start(ctx, name, trace.WithTimestamp(sent), trace.WithSpanKind(trace.SpanKindClient))
	if !span.IsRecording() {
		span.End(trace.WithTimestamp(end))
		return span.SpanContext()
	}
	span.SetAttributes(
		attribute.String("gen_ai.operation.name", Operation(st.API)),
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
		span.AddEvent("attempt", trace.WithTimestamp(sent),
			trace.WithAttributes(attribute.Int("infergate.attempt", i+1), attribute.String("infergate.pool", p)))
	}
	if st.Status >= 500 || !st.Complete {
		span.SetStatus(codes.Error, "upstream error or incomplete response")
	}
	if !first.IsZero() {
		_, wait := tracer.Start(ctx, "infergate.upstream.first_token", trace.WithTimestamp(sent))
		wait.End(trace.WithTimestamp(first))
		_, decode := tracer.Start(ctx, "infergate.upstream.stream", trace.WithTimestamp(first))
		decode.End(trace.WithTimestamp(end))
	}
	span.End(trace.WithTimestamp(end))
	return span.SpanContext()
}
