package compose

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/module"
)

// The dynamic module's composition (cmd/infergate-module): the filter
// config names an infergate configuration file, the same one serve reads,
// and its admission (keys, policies, the limiter) is built as serve
// builds it. One per file and process: every listener, and every config
// update Envoy makes, shares one controller (one memory limiter, one
// Redis pool), watched for reloads until the process ends.

var (
	modulesMu sync.Mutex
	modules   = map[string]*module.Options{}
)

// ModuleOptions maps the configuration file named by a dynamic module's
// filter config to the module's options.
func ModuleOptions(filterConfig []byte) (*module.Options, error) {
	path := strings.TrimSpace(string(filterConfig))
	if path == "" {
		return nil, fmt.Errorf("the infergate filter config must name an infergate configuration file")
	}
	modulesMu.Lock()
	defer modulesMu.Unlock()
	if o, ok := modules[path]; ok {
		return o, nil
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	logger := NewLogger(os.Stderr, cfg.Log)
	o, err := newModule(cfg, logger)
	if err != nil {
		return nil, err
	}
	modules[path] = o
	logger.Info("infergate module configured", "config", path, "ratelimit", cfg.RateLimit.Backend)
	return o, nil
}

// newModule composes the module's options as serve composes the ext_proc
// adapter's (admission, observers, the admin port), and starts what runs
// with them for as long as the process does: reloads, the stall watch, the
// SLA feed's publisher and the admin listener.
func newModule(cfg *config.Config, logger *slog.Logger) (*module.Options, error) {
	ctx := context.Background()
	if len(cfg.VirtualModels) > 0 && cfg.RateLimit.Backend != "redis" {
		// The controller serves xDS and may follow pods through the
		// Kubernetes API: not in Envoy's process. It runs in serve or
		// `infergate controller`, fed through the shared Redis.
		return nil, errors.New("virtualModels through the module need ratelimit.backend: redis: the module publishes its " +
			"observations to the shared feed, which the SLA controller (infergate controller, or serve) reads")
	}
	if cfg.Auth.JWT.Enabled {
		// jwt_authn leaves the claims as one Struct (payload_in_metadata);
		// the pinned SDK's ABI (v0.1.0) reads a metadata key's string,
		// number or bool only, so the claims cannot reach the module. Refused
		// at start rather than every JWT caller denied at request time.
		return nil, errors.New("auth.jwt through the module: Envoy's dynamic-module ABI (v0.1.0) reads no metadata Struct, " +
			"and jwt_authn's payload is one; use the ext_proc path (infergate serve) for JWT callers, or API keys (auth.keys)")
	}
	if err := CheckDebugToken(cfg.Admin); err != nil {
		return nil, err
	}
	metrics, err := telemetry.New()
	if err != nil {
		return nil, err
	}
	obs, err := NewObservers(ctx, cfg, metrics, os.Stdout, BuildVersion("dev"))
	if err != nil {
		return nil, err
	}
	adm, err := NewAdmission(ctx, cfg, logger, metrics, nil)
	if err != nil {
		return nil, err
	}
	obs.ObserveSLA(adm, nil, logger)
	currency := cmp.Or(cfg.Prices.Table().Currency, "USD")
	inst, err := observe.NewInstruments(metrics.Meter(), currency)
	if err != nil {
		adm.Close()
		return nil, err
	}
	stalls := meter.NewStallWatch()
	go adm.Run(ctx) // reloads of keys and policies, the seals' keys: as long as Envoy runs
	go stalls.Run(ctx, time.Now)
	if obs.Publisher != nil {
		go obs.Publisher.Run(ctx)
	}
	handler := Admin{Config: cfg.Admin, Tracing: cfg.Tracing, Metrics: metrics, Adm: adm, Recent: obs.Recent,
		Health: adm.Health, Ready: func() bool { return true }}.Handler()
	go serveAdmin(ctx, cfg.Admin.Listen, handler, logger)
	catalog := gate.Catalog{Models: cfg.Catalog(), CompletionPaths: cfg.Gate.Paths}
	if pm := cfg.PoolModels; len(pm.Pools) > 0 {
		models := NewPoolModels(pm, logger)
		go models.Run(ctx)
		catalog.PoolModels = models.Models
	}
	return &module.Options{
		Intake: gate.Intake{CompletionPaths: cfg.Gate.Paths, MaxBodyBytes: cfg.Gate.MaxBodyBytes},
		Rules: gate.Rules{KeepUsageOption: !*cfg.Gate.InjectUsage, HonourUsageOptOut: cfg.Gate.HonourUsageOptOut,
			ChatOutputLimit: cfg.Gate.ChatOutputLimit},
		Catalog:        catalog,
		Policy:         adm.Controller,
		Sinks:          obs.Sinks,
		Meters:         observe.NewMeters(inst, nil, nil, nil),
		Tracer:         obs.Tracing.Tracer(),
		Stalls:         stalls,
		Prices:         cfg.Prices.Table(),
		MaxTrackedGaps: cfg.Meter.MaxTrackedGaps,
		MaxEventBytes:  cfg.Meter.MaxEventBytes,
		Logger:         logger,
	}, nil
}

// adminRetry is how long the module waits to bind the admin address
// again: a restarting Envoy (hot restart) may hold it for a while.
const adminRetry = 5 * time.Second

// serveAdmin serves the module's admin port (admin.listen, loopback by
// default) for as long as ctx lasts. Envoy's process may not bind it at
// once (its previous process holds it): it tries again, never failing a
// request for it.
func serveAdmin(ctx context.Context, addr string, h http.Handler, logger *slog.Logger) {
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			logger.Info("infergate module admin serving", "admin", lis.Addr().String())
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
			err = srv.Serve(lis)
		}
		logger.Error("infergate module admin listener; trying again", "admin", addr, "err", err, "in", adminRetry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(adminRetry):
		}
	}
}
