package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/requestlog"
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
	logger := newLogger(os.Stderr, cfg.Log)
	metrics, err := telemetry.New()
	if err != nil {
		return nil, err
	}
	adm, err := newAdmission(context.Background(), cfg, logger, metrics, nil)
	if err != nil {
		return nil, err
	}
	go adm.run(context.Background()) // reloads of keys and policies, the seals' keys: as long as Envoy runs
	var sinks []request.Sink
	if *cfg.Log.Requests {
		sinks = append(sinks, requestlog.NewLogSink(os.Stdout))
	}
	o := &module.Options{
		Intake: gate.Intake{CompletionPaths: cfg.Gate.Paths, MaxBodyBytes: cfg.Gate.MaxBodyBytes},
		Rules: gate.Rules{KeepUsageOption: !*cfg.Gate.InjectUsage, HonourUsageOptOut: cfg.Gate.HonourUsageOptOut,
			ChatOutputLimit: cfg.Gate.ChatOutputLimit},
		Policy:         adm.controller,
		Sinks:          sinks,
		Prices:         cfg.Prices.Table(),
		MaxTrackedGaps: cfg.Meter.MaxTrackedGaps,
		MaxEventBytes:  cfg.Meter.MaxEventBytes,
		Logger:         logger,
	}
	modules[path] = o
	logger.Info("infergate module configured", "config", path, "ratelimit", cfg.RateLimit.Backend)
	return o, nil
}
