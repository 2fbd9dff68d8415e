package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/requestlog"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/xds/feed"
)

// streamWorkers serve ext_proc streams (each HTTP request holds two, the
// meter's for the whole response).
const streamWorkers = 16

// drainTimeout bounds a graceful stop: in-flight streams (long LLM
// responses) get this long before they are cut.
const drainTimeout = 30 * time.Second

// Service is the ext_proc gRPC server plus the admin HTTP server.
type Service struct {
	cfg     *config.Config
	log     *slog.Logger
	metrics *telemetry.Metrics
	grpc    *grpc.Server
	ready   atomic.Bool
	adm     *admissionParts
	routing *routing         // nil without virtual models
	recent  *requestlog.Ring // nil when admin.recentRequests is 0
	tracing *telemetry.Tracing
	stop    context.CancelFunc // ends the watchers
}

// NewService builds the service; stamps go to requests as JSON lines.
// Policies, keys and the rate-limit backend are loaded now, so a broken
// configuration fails at start, not at the first request.
func NewService(cfg *config.Config, logger *slog.Logger, requests io.Writer) (*Service, error) {
	metrics, err := telemetry.New()
	if err != nil {
		return nil, err
	}
	var sinks []extproc.Sink
	if *cfg.Log.Requests {
		sinks = append(sinks, extproc.NewLogSink(requests))
	}
	var recent *requestlog.Ring
	if cfg.Admin.RecentRequests > 0 {
		recent = requestlog.NewRing(cfg.Admin.RecentRequests)
		sinks = append(sinks, recent)
	}
	ctx, stop := context.WithCancel(context.Background())
	tracing, err := telemetry.NewTracing(ctx, cfg.Tracing, Version, metrics)
	if err != nil {
		stop()
		return nil, err
	}
	adm, err := newAdmission(ctx, cfg, logger, metrics)
	if err != nil {
		stop()
		return nil, err
	}
	var store redis.UniversalClient
	if adm.redis != nil {
		store = adm.redis
	}
	rt, err := newRouting(cfg, logger, metrics.Meter(), store)
	if err != nil {
		stop()
		return nil, err
	}
	switch {
	case adm.redis != nil:
		// Replicas share Redis: every one publishes its observations and
		// every controller reads them all, so they decide alike.
		pub := feed.NewPublisher(adm.redis, feed.DefaultStream, logger)
		go pub.Run(ctx)
		sinks = append(sinks, publishSink{pub})
		if rt != nil {
			go feed.Subscribe(ctx, adm.redis, feed.DefaultStream, rt.observe, logger)
		}
	case rt != nil:
		sinks = append(sinks, rt)
	}
	srv := extproc.New(cfg, extproc.Options{Logger: logger, Metrics: metrics, Sinks: sinks, Policy: adm.controller,
		Tracer: tracing.Tracer(), PoolName: rt.poolName})
	g := grpc.NewServer(
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
	)
	extprocv3.RegisterExternalProcessorServer(g, srv)
	return &Service{cfg: cfg, log: logger, metrics: metrics, grpc: g, adm: adm, routing: rt, recent: recent,
		tracing: tracing, stop: stop}, nil
}

// AdminHandler serves /metrics, /healthz and /readyz.
func (s *Service) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /debug/controller", s.routing.debugHandler)
	if s.recent != nil {
		pages := requestlog.Handler(s.recent, s.cfg.Tracing.TraceURL)
		mux.Handle("GET /debug/requests", pages)
		mux.Handle("GET /debug/requests/{id}", pages)
	}
	if s.cfg.Admin.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		// Still serving (the last good policy and keys), but say why a
		// reload was refused so a rollout notices.
		if err := s.adm.health(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}

// Serve runs until ctx is done, then drains: readiness goes false first so
// load balancers stop sending, then in-flight streams get drainTimeout.
// xdsLis serves the virtual-model routes; it is only used (and required)
// when virtual models are configured.
func (s *Service) Serve(ctx context.Context, extprocLis, adminLis, xdsLis net.Listener) error {
	admin := &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 3)
	xdsCtx, stopXDS := context.WithCancel(context.Background())
	defer stopXDS()
	if s.routing != nil {
		if xdsLis == nil && s.routing.needsListener() {
			return errors.New("virtual models are configured but there is no xDS listener")
		}
		go func() {
			if err := s.routing.serve(xdsCtx, xdsLis); err != nil {
				errc <- fmt.Errorf("xds: %w", err)
			}
		}()
	} else if xdsLis != nil {
		xdsLis.Close()
	}
	go func() { errc <- s.grpc.Serve(extprocLis) }()
	go func() {
		if err := admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	s.ready.Store(true)
	s.log.Info("infergate serving", "extproc", extprocLis.Addr().String(), "admin", adminLis.Addr().String())

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("server stopped: %w", err)
	}
	s.ready.Store(false)
	// Envoy keeps its last routes while the control plane is away.
	stopXDS()
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(drainTimeout):
		s.grpc.Stop()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = admin.Shutdown(shutdownCtx)
	_ = s.metrics.Shutdown(shutdownCtx)
	_ = s.tracing.Shutdown(shutdownCtx)
	s.stop()
	s.adm.close()
	s.log.Info("infergate stopped")
	return err
}

// ListenAndServe opens the configured listeners and serves.
func (s *Service) ListenAndServe(ctx context.Context) error {
	ep, err := listenExtProc(s.cfg.ExtProc.Listen)
	if err != nil {
		return fmt.Errorf("extproc listener: %w", err)
	}
	ad, err := net.Listen("tcp", s.cfg.Admin.Listen)
	if err != nil {
		ep.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	var xl net.Listener
	if s.routing.needsListener() {
		if xl, err = net.Listen("tcp", s.cfg.XDS.Listen); err != nil {
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
func listenExtProc(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, config.UnixPrefix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	return net.Listen("unix", path)
}
