// Package extproc is infergate's Envoy external-processing service. One gRPC
// ExternalProcessor serves two filter roles, each on its own stream per
// HTTP request:
//
//   - the gate (blocking, fail-closed) reads the buffered request body and
//     headers, decides, and routes by setting x-infergate-model;
//   - the meter (observability_mode) receives copies of the response as it
//     streams and stamps the request with TTFT, ITL and tokens.
//
// Envoy protocol handling lives here; domain logic (body parsing, SSE,
// policy) lives in the packages they call.
package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/telemetry"
)

// RoleHeader is the gRPC initial metadata key Envoy's grpc_service sets to
// name the filter role ("gate" or "meter"). Without it the role is taken
// from the first message: observability-mode messages are the meter's.
const RoleHeader = "x-infergate-filter"

// MetadataNamespace is the dynamic-metadata namespace the gate writes and
// the meter (and access logs, and response-header formatters) read.
const MetadataNamespace = "infergate"

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     *config.Config
	log     *slog.Logger
	metrics *telemetry.Metrics
	policy  Policy
	sinks   []Sink
	tracer  trace.Tracer
	pool    func(string) string
	now     func() time.Time
}

// Options are the Server's collaborators; zero fields get defaults.
type Options struct {
	Logger  *slog.Logger
	Metrics *telemetry.Metrics // required
	Policy  Policy             // default: AllowAll
	Sinks   []Sink             // where stamps go, in addition to metrics
	Tracer  trace.Tracer       // default: no tracing
	// PoolName maps what Envoy reports as the serving cluster to the pool's
	// configured name (e.g. an Envoy Gateway locality to its backendRef);
	// default: unchanged.
	PoolName func(string) string
	Now      func() time.Time
}

// New returns a Server for cfg.
func New(cfg *config.Config, opts Options) *Server {
	s := &Server{cfg: cfg, log: opts.Logger, metrics: opts.Metrics, policy: opts.Policy,
		sinks: opts.Sinks, tracer: opts.Tracer, pool: opts.PoolName, now: opts.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.policy == nil {
		s.policy = AllowAll{}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.pool == nil {
		s.pool = func(p string) string { return p }
	}
	if s.tracer == nil {
		s.tracer = noop.NewTracerProvider().Tracer("")
	}
	s.sinks = append([]Sink{metricsSink{s.metrics}}, s.sinks...)
	return s
}

// Process serves one ext_proc stream: one HTTP request as seen by one filter.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return normalClose(err)
	}
	arrived := s.now()
	role := ""
	if v := metadata.ValueFromIncomingContext(ctx, RoleHeader); len(v) > 0 { // no copy of the whole metadata
		role = v[0]
	}
	if role == "" && first.GetObservabilityMode() {
		role = "meter"
	}
	if role == "meter" {
		err = s.meter(ctx, stream, first, arrived)
	} else {
		err = s.gate(ctx, stream, first, arrived)
	}
	return normalClose(err)
}

// normalClose maps the ways a stream ends normally (Envoy closing its side,
// the HTTP request finishing or being cancelled) to a clean return.
func normalClose(err error) error {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil
	}
	if st, ok := status.FromError(err); ok && (st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded) {
		return nil
	}
	return err
}
