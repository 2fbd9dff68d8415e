package extproc

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/telemetry"
)

// Tracing: the spans are internal/observe's, shared with the dynamic
// module; what is ext_proc's is where their parent comes from.
//
// Parentage: Envoy's OpenTelemetry tracer sends its ext_proc call span as
// traceparent in the gRPC metadata of each ext_proc stream, so the gate's
// and the meter's spans sit under Envoy's request span. Without Envoy
// tracing the client's traceparent header is the parent, and the meter
// follows the gate's span (passed in dynamic metadata), so a request is
// still one trace.

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
	return observe.Parent(ctx, fallbacks...)
}

// traceGate records the gate's span (observe.GateSpan).
func (s *Server) traceGate(ctx context.Context, g *gateRequest, policyAt, end time.Time, st *request.Stamp) trace.SpanContext {
	return observe.GateSpan(traceParent(ctx), s.tracer, g.started, policyAt, end, st)
}

// traceMeter records the upstream's part of the request (observe.MeterSpan).
func (s *Server) traceMeter(ctx context.Context, m *meterRequest, end time.Time) trace.SpanContext {
	var gate map[string]string
	if m.GateTraceparent != "" {
		gate = map[string]string{request.TraceparentKey: m.GateTraceparent}
	}
	return observe.MeterSpan(traceParent(ctx, gate), s.tracer, m.Sent, m.Tally.First, end, &m.Stamp)
}
