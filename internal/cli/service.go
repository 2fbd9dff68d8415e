package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/poolmodels"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/requestlog"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/internal/tlsreload"
	"github.com/infergate/infergate/xds/feed"
	"github.com/infergate/infergate/xds/routing"
	"github.com/infergate/infergate/xds/server"
)

// streamWorkers serve ext_proc streams (each HTTP request holds two, the
// meter's for the whole response). A stream beyond them gets a fresh
// goroutine whose stack grows by copying as the gate evaluates: at 64
// requests in flight (128 streams) with 16 workers, stack growth was 14 %
// of infergate's CPU; 256 idle workers cost a few MiB and cut CPU per
// request 6 % (bench-overhead, variant previous on rps-c64).
const streamWorkers = 256

// drainTimeout bounds a graceful stop: in-flight streams (long LLM
// responses) get this long before they are cut.
const drainTimeout = 30 * time.Second

// Service is the ext_proc gRPC server plus the admin HTTP server and, with
// virtual models, the SLA routing service.
type Service struct {
	cfg       *config.Config
	log       *slog.Logger
	metrics   *telemetry.Metrics
	grpc      *grpc.Server
	ready     atomic.Bool
	adm       *compose.Admission
	routing   *routing.Service // nil without virtual models
	publisher *feed.Publisher  // observations to the shared Redis; nil without Redis
	recent    *requestlog.Ring // nil when admin.recentRequests is 0
	tracing   *telemetry.Tracing
	certs     *tlsreload.Server // ext_proc's mTLS files; nil without extproc.tls
	extproc   *extproc.Server
	xdsCerts  *tlsreload.Server // xDS's mTLS files; nil without xds.tls
	stopLogs  func()            // ends the in-Envoy meter's access-log streams
	// listen opens the configured listeners (net.Listen; tests bind the
	// configured host on a free port).
	listen func(network, addr string) (net.Listener, error)
	// models are what the pools serve; nil without poolModels.pools.
	models *poolmodels.Lister
	// gatewayExt is Envoy Gateway's extension server, on the xDS
	// listener; nil without gatewayExtension.enabled.
	gatewayExt []func(grpc.ServiceRegistrar)
}

// Option changes how NewService composes the service; the command line
// uses none.
type Option func(*options)

type options struct {
	budgetClock ratelimit.Clock // nil: time.Now
}

// WithBudgetClock reads the budget windows from clock instead of time.Now.
// For tests only: the end-to-end harness shifts it so that a test starts
// at a window's start instead of sleeping until one.
func WithBudgetClock(clock func() time.Time) Option {
	return func(o *options) { o.budgetClock = clock }
}

// NewService builds the service; stamps go to requests as JSON lines.
// Policies, keys and the rate-limit backend are loaded now, so a broken
// configuration fails at start, not at the first request. Nothing runs
// until Serve.
func NewService(cfg *config.Config, logger *slog.Logger, requests io.Writer, opts ...Option) (*Service, error) {
	ctx := context.Background()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	metrics, err := telemetry.New()
	if err != nil {
		return nil, err
	}
	obs, err := compose.NewObservers(ctx, cfg, metrics, requests, Version)
	if err != nil {
		return nil, err
	}
	adm, err := compose.NewAdmission(ctx, cfg, logger, metrics, o.budgetClock)
	if err != nil {
		return nil, err
	}
	var store redis.UniversalClient
	if adm.Redis != nil {
		store = adm.Redis
	}
	rt, err := newRouting(ctx, cfg, logger, metrics.Meter(), store)
	if err != nil {
		adm.Close()
		return nil, err
	}
	s := &Service{cfg: cfg, log: logger, metrics: metrics, adm: adm, routing: rt, recent: obs.Recent, tracing: obs.Tracing, listen: net.Listen}
	if s.gatewayExt, err = newGatewayExtension(cfg, logger); err != nil {
		adm.Close()
		return nil, err
	}
	if err := compose.CheckDebugToken(cfg.Admin); err != nil {
		adm.Close()
		return nil, err
	}
	// Replicas share Redis: every one publishes its observations and
	// every controller reads them all, so they decide alike.
	var local request.Sink
	if rt != nil {
		local = rt
	}
	obs.ObserveSLA(adm, local, logger)
	s.publisher = obs.Publisher
	var poolModels func() []string
	if pm := cfg.PoolModels; len(pm.Pools) > 0 {
		s.models = compose.NewPoolModels(pm, logger)
		poolModels = s.models.Models
	}
	srv, err := extproc.New(extproc.Options{
		CompletionPaths:   cfg.Gate.Paths,
		MaxBodyBytes:      cfg.Gate.MaxBodyBytes,
		KeepUsageOption:   !*cfg.Gate.InjectUsage,
		HonourUsageOptOut: cfg.Gate.HonourUsageOptOut,
		ChatOutputLimit:   cfg.Gate.ChatOutputLimit,
		MaxEventBytes:     cfg.Meter.MaxEventBytes,
		MaxTrackedGaps:    cfg.Meter.MaxTrackedGaps,
		Prices:            cfg.Prices.Table(),
		Logger:            logger,
		Meter:             metrics.Meter(),
		Sinks:             obs.Sinks,
		Policy:            adm.Controller,
		Catalog:           cfg.Catalog(),
		PoolModels:        poolModels,
		Tracer:            obs.Tracing.Tracer(),
		PoolName:          rt.PoolName,
		Sealer:            adm.Fields,

		MaxGateStreamsPerPeer:        int(cfg.ExtProc.MaxGateStreamsPerPeer),
		MaxWaitingBodiesPerPrincipal: int(cfg.ExtProc.MaxWaitingBodiesPerPrincipal),
		BodyTimeout:                  cfg.Gate.BodyTimeout,
	})
	if err != nil {
		adm.Close()
		return nil, err
	}
	if s.certs, err = extprocCerts(cfg, logger); err != nil {
		adm.Close()
		return nil, err
	}
	if s.needsXDSListener() {
		if s.xdsCerts, err = serverCerts(cfg.XDS.TLS, logger); err != nil {
			adm.Close()
			return nil, fmt.Errorf("xds.tls: %w", err)
		}
	}
	if err := observeCertReloads(metrics.Meter(), s.certs, s.xdsCerts); err != nil {
		adm.Close()
		return nil, err
	}
	s.grpc = grpc.NewServer(
		extprocCreds(s.certs),
		grpc.MaxConcurrentStreams(cfg.ExtProc.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(cfg.Gate.MaxBodyBytes+1<<20),
		// Streams are served by long-lived goroutines: the stack a policy
		// evaluation grew is reused, not grown again by copying for every
		// stream. Streams beyond them get a goroutine of their own.
		grpc.NumStreamWorkers(streamWorkers),
		// Fixed flow-control windows (1 MiB holds a request body): no
		// bandwidth-probing pings on Envoy's long-lived connections.
		grpc.InitialWindowSize(1<<20),
		grpc.InitialConnWindowSize(16<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// ProcessingRequest decoded by hand (a streamed token is one).
		grpc.ForceServerCodecV2(extproc.NewCodec()),
	)
	extprocv3.RegisterExternalProcessorServer(s.grpc, srv)
	s.extproc = srv
	s.stopLogs = func() {}
	if cfg.Meter.Wasm {
		// The in-Envoy meter's summaries (envoy/wasm-meter.yaml), on the
		// same port; without it nothing may send summaries.
		als, stopLogs := srv.AccessLogService()
		accesslogv3.RegisterAccessLogServiceServer(s.grpc, als)
		s.stopLogs = stopLogs
	}
	return s, nil
}

// The gate lists GET /v1/models by asking the controller per model.
var _ gate.ModelPolicy = (*admission.Controller)(nil)

// extprocCerts loads extproc.tls, or returns nil without it. A unix:
// socket takes no TLS (its file permissions are its boundary); the
// configuration file cannot combine them, a --extproc-listen flag can.
func extprocCerts(cfg *config.Config, logger *slog.Logger) (*tlsreload.Server, error) {
	t := cfg.ExtProc.TLS
	if !t.Enabled() {
		return nil, nil
	}
	if strings.HasPrefix(cfg.ExtProc.Listen, config.UnixPrefix) {
		return nil, fmt.Errorf("extproc.tls is not used on a unix: socket (%s)", cfg.ExtProc.Listen)
	}
	return serverCerts(t, logger)
}

// serverCerts loads a listener's mTLS files, or returns nil without them.
func serverCerts(t config.TLS, logger *slog.Logger) (*tlsreload.Server, error) {
	if !t.Enabled() {
		return nil, nil
	}
	return tlsreload.New(tlsreload.Files{Cert: t.CertFile, Key: t.KeyFile, ClientCA: t.ClientCAFile}, logger)
}

// observeCertReloads counts the refused reloads of each listener's files
// (nil: none).
func observeCertReloads(meter metric.Meter, extproc, xds *tlsreload.Server) error {
	if extproc == nil && xds == nil {
		return nil
	}
	_, err := meter.Int64ObservableCounter("infergate.reload.errors", metric.WithDescription(compose.ReloadErrorsHelp),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if extproc != nil {
				o.Observe(extproc.Refused(), reloadTLS)
			}
			if xds != nil {
				o.Observe(xds.Refused(), reloadXDSTLS)
			}
			return nil
		}))
	return err
}

// extprocCreds serves mTLS with certs' current files, or plaintext.
func extprocCreds(certs *tlsreload.Server) grpc.ServerOption {
	if certs == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.Creds(credentials.NewTLS(certs.Config()))
}

var (
	reloadTLS    = metric.WithAttributes(attribute.String("source", "extproc_tls"))
	reloadXDSTLS = metric.WithAttributes(attribute.String("source", "xds_tls"))
)

// health is nil, or why the last reload of keys, policies or the ext_proc
// certificates was refused (the last good version keeps serving).
func (s *Service) health() error {
	err := s.adm.Health()
	if s.certs != nil {
		err = errors.Join(err, s.certs.Health())
	}
	if s.xdsCerts != nil {
		err = errors.Join(err, s.xdsCerts.Health())
	}
	return err
}

// AdminHandler serves /metrics, /healthz and /readyz, and the /debug
// pages admin.debug and admin.pprof turn on.
func (s *Service) AdminHandler() http.Handler {
	return compose.Admin{Config: s.cfg.Admin, Tracing: s.cfg.Tracing, Metrics: s.metrics, Adm: s.adm, Recent: s.recent,
		Controller: s.routing.DebugHandler, // safe on a nil Service: no virtual model
		Health:     s.health, Ready: func() bool { return s.ready.Load() && s.modelsPrimed() }}.Handler()
}

// modelsPrimed reports whether the pools' model lists have had their
// first round (every pool answered or timed out), or there are none. The
// gate never waits for them (Envoy gives it a second); readiness does, so
// a load balancer sends no listing before there is one to give.
func (s *Service) modelsPrimed() bool {
	if s.models == nil {
		return true
	}
	select {
	case <-s.models.Primed():
		return true
	default:
		return false
	}
}

// Serve runs until ctx is done or a part fails, then stops in order:
// readiness goes false (load balancers stop sending), the control plane
// stops (Envoy keeps its last routes), in-flight ext_proc streams drain
// (long LLM responses get drainTimeout), the observations they produced
// are flushed to the feed, the watchers stop, and Redis closes last. Every
// goroutine it starts has ended when it returns. xdsLis serves the
// virtual-model routes and Envoy Gateway's extension; it is only used (and
// required) when routing serves xDS or gatewayExtension is on.
func (s *Service) Serve(ctx context.Context, extprocLis, adminLis, xdsLis net.Listener) error {
	if s.needsXDSListener() && xdsLis == nil {
		return errors.New("virtual models or gatewayExtension are configured but there is no xDS listener")
	}
	if s.routing == nil && s.gatewayExt == nil && xdsLis != nil {
		xdsLis.Close()
	}
	if s.xdsCerts != nil && xdsLis != nil {
		xdsLis = tls.NewListener(xdsLis, s.xdsCerts.Config())
	}
	admin := &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
	// Each part stops on its own signal, in the order above; the group's
	// context only tells that one of them failed.
	g, failed := errgroup.WithContext(ctx)
	routingCtx, stopRouting := context.WithCancel(context.Background())
	feedCtx, stopFeed := context.WithCancel(context.Background())
	watchCtx, stopWatching := context.WithCancel(context.Background())
	defer stopRouting()
	defer stopFeed()
	defer stopWatching()

	g.Go(func() error {
		// A stop that comes before Serve runs makes it return at once
		// (and close the listener): that is a clean stop too.
		if err := s.grpc.Serve(extprocLis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	for _, certs := range []*tlsreload.Server{s.certs, s.xdsCerts} {
		if certs != nil {
			g.Go(func() error { certs.Run(watchCtx, s.cfg.Policy.ReloadInterval); return nil })
		}
	}
	g.Go(func() error {
		if err := admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("admin: %w", err)
		}
		return nil
	})
	g.Go(func() error { s.adm.Run(watchCtx); return nil })
	g.Go(func() error { s.extproc.WatchStalls(watchCtx); return nil })
	if s.models != nil {
		g.Go(func() error { s.models.Run(watchCtx); return nil })
	}
	if s.publisher != nil {
		g.Go(func() error { s.publisher.Run(feedCtx); return nil })
	}
	if s.routing == nil && s.gatewayExt != nil {
		g.Go(func() error {
			return server.ServeGRPC(routingCtx, xdsLis, server.GRPCOptions{Logger: s.log}, s.gatewayExt...)
		})
	}
	if s.routing != nil {
		g.Go(func() error { return s.routing.Run(routingCtx, xdsLis, s.gatewayExt...) })
		if s.adm.Redis != nil {
			g.Go(func() error {
				feed.Subscribe(routingCtx, s.adm.Redis, feed.DefaultStream, s.routing.Observe, s.log)
				return nil
			})
		}
	}
	s.ready.Store(true)
	s.log.Info("infergate serving", "extproc", extprocLis.Addr().String(), "admin", adminLis.Addr().String())
	if w := unauthenticatedWarning(s.cfg); w != "" {
		s.log.Warn(w)
	}

	<-failed.Done()
	s.ready.Store(false)
	stopRouting()
	drained := make(chan struct{})
	s.stopLogs() // Envoy never ends them: a graceful stop would wait for them
	go func() { s.grpc.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		s.grpc.Stop()
		<-drained
	}
	stopFeed()
	stopWatching()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = admin.Shutdown(shutdownCtx)
	err := g.Wait()
	_ = s.metrics.Shutdown(shutdownCtx)
	_ = s.tracing.Shutdown(shutdownCtx)
	s.adm.Close()
	s.log.Info("infergate stopped")
	if err != nil {
		return fmt.Errorf("server stopped: %w", err)
	}
	return nil
}

// needsXDSListener reports whether xds.listen serves: xDS for the virtual
// models, or Envoy Gateway's extension.
func (s *Service) needsXDSListener() bool { return s.routing.NeedsListener() || s.gatewayExt != nil }

// ListenAndServe opens the configured listeners and serves.
func (s *Service) ListenAndServe(ctx context.Context) error {
	ep, err := listenExtProc(s.listen, s.cfg.ExtProc.Listen)
	if err != nil {
		return fmt.Errorf("extproc listener: %w", err)
	}
	ad, err := s.listen("tcp", s.cfg.Admin.Listen)
	if err != nil {
		ep.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	var xl net.Listener
	if s.needsXDSListener() {
		if xl, err = s.listen("tcp", s.cfg.XDS.Listen); err != nil {
			ep.Close()
			ad.Close()
			return fmt.Errorf("xds listener: %w", err)
		}
	}
	return s.Serve(ctx, ep, ad, xl)
}

// listenExtProc listens on host:port, or on a Unix domain socket for
// unix:PATH (a stale socket file left by a killed process is replaced; the
// listener removes the file when it closes).
func listenExtProc(listen func(network, addr string) (net.Listener, error), addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, config.UnixPrefix)
	if !ok {
		return listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	return net.Listen("unix", path)
}

// unauthenticatedWarning is what serve says, loudly, when nothing
// identifies a caller: every well-formed request is then admitted as
// nobody, which is right for a first try and wrong anywhere else.
func unauthenticatedWarning(cfg *config.Config) string {
	if cfg.Auth.Keys != "" || cfg.Auth.JWT.Enabled {
		return ""
	}
	w := "NOTHING AUTHENTICATES: no auth.keys and no auth.jwt, so every caller is anonymous"
	if cfg.Policy.Dir == "" {
		return w + " and, with no policy.dir, every well-formed request is admitted; set auth.keys (infergate keys create) or auth.jwt"
	}
	return w + " (policy.dir decides alone); set auth.keys (infergate keys create) or auth.jwt"
}
