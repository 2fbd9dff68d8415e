// Package extproc is infergate's Envoy external-processing service. One gRPC
// ExternalProcessor serves two filter roles, each on its own stream per
// HTTP request:
//
//   - the gate (blocking, fail-closed) reads the buffered request body and
//     headers, decides, and routes by setting x-infergate-model;
//   - the meter (observability_mode) receives copies of the response as it
//     streams and stamps the request with TTFT, ITL and tokens.
//
// Envoy protocol handling lives here: it is the adapter over the gate's
// and the meter's cores (internal/gate, internal/meter), which know no
// Envoy type; domain logic (body parsing, SSE, policy) lives in the
// packages they call.
package extproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	opts    Options
	log     *slog.Logger
	metrics *observe.Instruments
	policy  request.Policy
	sinks   []request.Sink
	tracer  trace.Tracer
	pool    func(string) string
	now     func() time.Time
	meters  *observe.Meters
	orders  meter.PoolOrders
	peers   peerStreams
	waiting waitingBodies
	sealer  FieldSealer
	stalls  *meter.StallWatch // when infergate did not run (WatchStalls)
	// lastUnverified: Unix seconds of the last log line on an unverified stamp.
	lastUnverified atomic.Int64
}

// WatchStalls notes, until ctx is done, when infergate itself stops
// running (its CPU starved, the process stopped): a meter read after such
// a stall may have waited through it, and its stamp is marked late_read
// rather than published as measured. Without it the meter trusts its reads.
func (s *Server) WatchStalls(ctx context.Context) { s.stalls.Run(ctx, s.now) }

// DefaultCompletionPaths are the paths whose bodies the gate parses: one
// per API it knows (openai.APIOf).
var DefaultCompletionPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}

// Options are the Server's settings and collaborators; zero fields get
// defaults.
type Options struct {
	// CompletionPaths are the request paths whose JSON body the gate
	// parses and validates (default DefaultCompletionPaths); other paths
	// get the policy's decision without a parsed body.
	CompletionPaths []string
	// MaxBodyBytes bounds a request body (413 above it; default 1 MiB).
	MaxBodyBytes int
	// MaxGateStreamsPerPeer bounds the gate streams one peer (an IP
	// address) holds open at once; a stream beyond it is answered 503
	// gate_overloaded. Default DefaultMaxGateStreamsPerPeer.
	MaxGateStreamsPerPeer int
	// MaxWaitingBodiesPerPrincipal bounds the gate streams one key, and
	// one tenant, holds between its request headers and its body's end;
	// beyond it the caller's new request is answered 429
	// too_many_waiting_bodies (others are served as ever). Default
	// DefaultMaxWaitingBodiesPerPrincipal. A caller the policy names
	// no one (no authentication) is bounded per peer only.
	MaxWaitingBodiesPerPrincipal int
	// BodyTimeout is how long the gate waits for a request's body after
	// its headers; past it the request is answered 408
	// request_body_timeout. Default DefaultBodyTimeout.
	BodyTimeout time.Duration
	// KeepUsageOption leaves a streaming body without
	// stream_options.include_usage as it is; by default the gate asks the
	// model server for usage, so the meter can count tokens exactly.
	KeepUsageOption bool
	// HonourUsageOptOut leaves a client's explicit
	// stream_options.include_usage: false in place. By default usage is
	// asked for on every stream, so the charge is the model server's count
	// whatever the client asked; the client then receives the final usage
	// chunk (empty choices) as OpenAI sends it to clients that ask.
	HonourUsageOptOut bool
	// ChatOutputLimit is the key the gate adds to a chat completion that
	// names no output cap when the policy caps it: "max_tokens" (the
	// default, which every OpenAI-compatible server reads) or
	// "max_completion_tokens" (OpenAI's reasoning models refuse
	// max_tokens).
	ChatOutputLimit string
	// MaxEventBytes bounds one SSE line the meter keeps across chunks
	// (default 1 MiB); MaxTrackedGaps the inter-token gaps kept per
	// request for the stamp (default 16384).
	MaxEventBytes  int
	MaxTrackedGaps int
	// Prices are the models' prices: the stamp, the request log and
	// infergate.cost carry each request's cost at them. Nil: no cost.
	Prices *price.Table
	// Models and Pools are the names used as metric label values (e.g.
	// the virtual models and the models the pools serve; the configured
	// pools); other names are labelled "other". Without them, the first 64
	// names of responses a pool answered successfully are used.
	Models, Pools []string
	// Tenants are the tenant names used as label values of infergate.cost,
	// bounded the same way (without them, the first 64 tenants served).
	Tenants []string
	// Catalog are the model names GET /v1/models lists (config models and
	// virtualModels), each to the callers the policy lets call it (see
	// gate.ModelPolicy). Empty: the gate does not answer /v1/models; the path
	// is the policy's, like any other.
	Catalog []string
	// PoolModels, with Catalog empty, returns what the pools serve now
	// (internal/poolmodels): the gate lists those on GET /v1/models
	// instead, alike. Called per listing; the slice is not modified.
	PoolModels func() []string

	Logger *slog.Logger
	Meter  metric.Meter   // where the gate's and meter's instruments go; default: none
	Policy request.Policy // default: request.AllowAll
	Sinks  []request.Sink // where stamps go, in addition to metrics
	Tracer trace.Tracer   // default: no tracing
	// PoolName maps what Envoy reports as the serving cluster to the pool's
	// configured name (e.g. an Envoy Gateway locality to its backendRef);
	// default: unchanged.
	PoolName func(string) string
	Now      func() time.Time
	// Sealer seals the gate's field for the meter and verifies it there
	// (see meterfield.go); every replica whose meter may read another's
	// gate field must share its keys. Default: keys of this process.
	Sealer FieldSealer
}

// New returns a Server; it fails only if its instruments cannot be
// registered on opts.Meter.
func New(opts Options) (*Server, error) {
	if opts.CompletionPaths == nil {
		opts.CompletionPaths = DefaultCompletionPaths
	}
	opts.MaxBodyBytes = cmp.Or(opts.MaxBodyBytes, 1<<20)
	opts.MaxEventBytes = cmp.Or(opts.MaxEventBytes, 1<<20)
	opts.MaxTrackedGaps = cmp.Or(opts.MaxTrackedGaps, 16384)
	opts.MaxGateStreamsPerPeer = cmp.Or(opts.MaxGateStreamsPerPeer, DefaultMaxGateStreamsPerPeer)
	opts.MaxWaitingBodiesPerPrincipal = cmp.Or(opts.MaxWaitingBodiesPerPrincipal, DefaultMaxWaitingBodiesPerPrincipal)
	opts.BodyTimeout = cmp.Or(opts.BodyTimeout, DefaultBodyTimeout)
	s := &Server{opts: opts, log: opts.Logger, policy: opts.Policy, sinks: opts.Sinks, tracer: opts.Tracer,
		pool: opts.PoolName, now: opts.Now, sealer: opts.Sealer, stalls: meter.NewStallWatch(),
		peers:   peerStreams{max: opts.MaxGateStreamsPerPeer, open: map[netip.Addr]int{}},
		waiting: waitingBodies{max: opts.MaxWaitingBodiesPerPrincipal, held: map[waiter]int{}}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.policy == nil {
		s.policy = request.AllowAll{}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.sealer == nil {
		s.sealer = seal.Fields{Ring: processKeys(), Once: processOnce(), Longest: defaultLongestStream}
	}
	if s.pool == nil {
		s.pool = func(p string) string { return p }
	}
	if s.tracer == nil {
		s.tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	meter := opts.Meter
	if meter == nil {
		meter = metricnoop.NewMeterProvider().Meter("")
	}
	var err error
	currency := "USD"
	if opts.Prices != nil && opts.Prices.Currency != "" {
		currency = opts.Prices.Currency
	}
	if s.metrics, err = observe.NewInstruments(meter, currency); err != nil {
		return nil, err
	}
	s.meters = observe.NewMeters(s.metrics, opts.Models, opts.Pools, opts.Tenants)
	s.sinks = append([]request.Sink{s.meters}, s.sinks...)
	return s, nil
}

// Without Options.Sealer: the fields outstanding at most, all tenants'
// (each holds at most seal.DefaultTenantShare; past either, new requests
// are refused until some are read or expire), and how long a field is
// valid.
const (
	defaultMaxFieldClaims = 1 << 20
	defaultLongestStream  = time.Hour
)

// processKeys seal the fields of Servers without Options.Sealer.
var processKeys = sync.OnceValue(func() *seal.Keyring {
	ring := seal.NewKeyring(&seal.MemoryStore{}, seal.Options{})
	_ = ring.Refresh(context.Background()) // a MemoryStore does not fail
	return ring
})

// processOnce keeps the fields of Servers without Options.Sealer
// outstanding until the meter reads them.
var processOnce = sync.OnceValue(func() *seal.MemoryOnce {
	return &seal.MemoryOnce{Max: defaultMaxFieldClaims, Now: time.Now}
})

// Process serves one ext_proc stream: one HTTP request as seen by one filter.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return normalClose(err)
	}
	arrived := s.now()
	role := ""
	if v := metadata.ValueFromIncomingContext(ctx, request.RoleHeader); len(v) > 0 { // no copy of the whole metadata
		role = v[0]
	}
	if role == "" && first.GetObservabilityMode() {
		role = "meter"
	}
	if role == "meter" {
		return normalClose(s.meter(ctx, stream, first, arrived))
	}
	peer := peerAddr(ctx)
	if !s.peers.acquire(peer) {
		return normalClose(s.overloaded(ctx, stream, first))
	}
	defer s.peers.release(peer)
	return normalClose(s.gate(ctx, stream, first, arrived))
}

// recovered counts and logs a panic a stream survived, and returns it as
// an error.
func (s *Server) recovered(ctx context.Context, role string, r any) error {
	s.metrics.Panics.Add(ctx, 1, metric.WithAttributes(attribute.String("role", role)))
	stack := debug.Stack()
	s.log.Error("ext_proc stream panicked; the process carries on", "role", role, "panic", fmt.Sprint(r),
		"stack", request.Truncate(string(stack), 4096))
	return fmt.Errorf("%s: panic: %v", role, r)
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
