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
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/internal/tlsreload"
	"github.com/infergate/infergate/xds/feed"
	"github.com/infergate/infergate/xds/routing"
)

// ControllerService is the SLA controller and its xDS server on their own,
// fed by the observations every ext_proc replica publishes to Redis. Any
// number may run: each reads every observation and decides alike.
type ControllerService struct {
	cfg     *config.Config
	log     *slog.Logger
	metrics *telemetry.Metrics
	routing *routing.Service
	rdb     redis.UniversalClient
	certs   *tlsreload.Server // xDS's mTLS files; nil without xds.tls
	// gatewayExt is Envoy Gateway's extension server, served with xDS;
	// nil without gatewayExtension.enabled.
	gatewayExt []func(grpc.ServiceRegistrar)
}

// NewControllerService needs virtual models and the shared Redis
// (ratelimit.backend: redis).
func NewControllerService(cfg *config.Config, logger *slog.Logger) (*ControllerService, error) {
	if len(cfg.VirtualModels) == 0 {
		return nil, errors.New("controller: no virtualModels configured")
	}
	if cfg.RateLimit.Backend != "redis" {
		return nil, errors.New("controller: observations come from the shared Redis; set ratelimit.backend: redis")
	}
	if err := compose.CheckDebugToken(cfg.Admin); err != nil {
		return nil, err
	}
	certs, err := serverCerts(cfg.XDS.TLS, logger)
	if err != nil {
		return nil, fmt.Errorf("xds.tls: %w", err)
	}
	metrics, err := telemetry.New()
	if err != nil {
		return nil, err
	}
	if err := observeCertReloads(metrics.Meter(), nil, certs); err != nil {
		return nil, err
	}
	rdb, err := compose.RedisClient(cfg.RateLimit.Redis)
	if err != nil {
		return nil, err
	}
	rt, err := newRouting(context.Background(), cfg, logger, metrics.Meter(), rdb)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ext, err := newGatewayExtension(cfg, logger)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &ControllerService{cfg: cfg, log: logger, metrics: metrics, routing: rt, rdb: rdb, certs: certs, gatewayExt: ext}, nil
}

// Serve runs until ctx is done or a part fails; every goroutine it starts
// has ended when it returns, and Redis closes last. Envoy keeps the last
// routes while no controller serves them.
func (c *ControllerService) Serve(ctx context.Context, adminLis, xdsLis net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", c.metrics.Handler())
	compose.DebugPages(mux, c.cfg.Admin, func(debug *http.ServeMux) {
		debug.HandleFunc("GET /debug/controller", c.routing.DebugHandler)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
		if c.certs != nil {
			if err := c.certs.Health(); err != nil {
				io.WriteString(w, "serving the last good version: "+err.Error()+"\n")
			}
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := c.rdb.Ping(r.Context()).Err(); err != nil {
			http.Error(w, "not ready: redis: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	g, failed := errgroup.WithContext(ctx)
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	g.Go(func() error {
		if err := admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("admin: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		feed.Subscribe(runCtx, c.rdb, feed.DefaultStream, c.routing.Observe, c.log)
		return nil
	})
	if c.certs != nil {
		xdsLis = tls.NewListener(xdsLis, c.certs.Config())
		g.Go(func() error { c.certs.Run(runCtx, c.cfg.Policy.ReloadInterval); return nil })
	}
	g.Go(func() error { return c.routing.Run(runCtx, xdsLis, c.gatewayExt...) })
	c.log.Info("infergate controller serving", "xds", xdsLis.Addr().String(), "admin", adminLis.Addr().String())

	<-failed.Done()
	stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = admin.Shutdown(shutdownCtx)
	err := g.Wait()
	_ = c.metrics.Shutdown(shutdownCtx)
	c.rdb.Close()
	c.log.Info("infergate controller stopped")
	return err
}

func runController(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flagset.New("controller", `Run the SLA controller and its xDS server alone. It reads the observations that
ext_proc replicas publish to the shared Redis (ratelimit.backend: redis) and
serves the virtual-model routes to Envoy; run as many as you like.`, stderr)
	path := fs.String("config", "", "YAML config file with virtualModels and ratelimit.redis (required)")
	if err := flagset.Parse(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	logger := compose.NewLogger(stderr, cfg.Log)
	svc, err := NewControllerService(cfg, logger)
	if err != nil {
		return err
	}
	xl, err := net.Listen("tcp", cfg.XDS.Listen)
	if err != nil {
		return fmt.Errorf("xds listener: %w", err)
	}
	al, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		xl.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	return svc.Serve(ctx, al, xl)
}
