package compose

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/poolmodels"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/requestlog"
	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/xds/feed"
)

// Observers are where a request's stamp goes besides the metrics, and
// what the admin port shows of them: serve (around the ext_proc adapter)
// and the dynamic module (inside Envoy) build them here alike.
type Observers struct {
	Sinks   []request.Sink
	Recent  *requestlog.Ring // nil when admin.recentRequests is 0 or debug is off
	Tracing *telemetry.Tracing
	// Publisher sends the SLA observations to the shared Redis; nil
	// without Redis. Run it (publisher.Run) for as long as stamps come.
	Publisher *feed.Publisher
}

// NewObservers builds the request log (JSON lines to requests), the
// /debug/requests ring and the tracer of cfg; version is the traces' service
// version.
func NewObservers(ctx context.Context, cfg *config.Config, metrics *telemetry.Metrics, requests io.Writer, version string) (*Observers, error) {
	o := &Observers{}
	if *cfg.Log.Requests {
		o.Sinks = append(o.Sinks, requestlog.NewLogSink(requests))
	}
	if cfg.Admin.Debug.Enabled && *cfg.Admin.RecentRequests > 0 {
		o.Recent = requestlog.NewRing(*cfg.Admin.RecentRequests)
		o.Sinks = append(o.Sinks, o.Recent)
	}
	var err error
	o.Tracing, err = telemetry.NewTracing(ctx, telemetry.TracingOptions{Endpoint: cfg.Tracing.Endpoint, Protocol: cfg.Tracing.Protocol,
		Insecure: cfg.Tracing.Insecure, SampleRatio: cfg.Tracing.SampleRatio, QueueSize: cfg.Tracing.QueueSize}, version, metrics)
	return o, err
}

// ObserveSLA sends the stamps to the SLA controller: with Redis to the
// shared feed (every controller, in serve or `infergate controller`,
// reads every replica's), else to local, the controller in this process
// (nil: no virtual models, nothing to observe).
func (o *Observers) ObserveSLA(adm *Admission, local request.Sink, log *slog.Logger) {
	switch {
	case adm.Redis != nil:
		o.Publisher = feed.NewPublisher(adm.Redis, feed.DefaultStream, log)
		o.Sinks = append(o.Sinks, feed.Sink(o.Publisher))
	case local != nil:
		o.Sinks = append(o.Sinks, local)
	}
}

// Admin is what the admin port serves: serve's and the module's.
type Admin struct {
	Config  config.Admin
	Tracing config.Tracing
	Metrics *telemetry.Metrics
	Adm     *Admission
	Recent  *requestlog.Ring
	// Controller serves /debug/controller: the SLA controller in this
	// process (serve's); nil where there is none (the module's, whose
	// controller runs in serve or `infergate controller`).
	Controller http.HandlerFunc
	Health     func() error // why the last reload was refused, if it was
	Ready      func() bool
}

// Handler serves /metrics, /healthz and /readyz, and the /debug pages
// admin.debug and admin.pprof turn on.
func (a Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", adminIndex(a.Config, a.Controller != nil, a.Adm.Controller.Keys != nil, a.Recent != nil))
	mux.Handle("GET /metrics", a.Metrics.Handler())
	DebugPages(mux, a.Config, func(debug *http.ServeMux) {
		if a.Controller != nil {
			debug.HandleFunc("GET /debug/controller", a.Controller)
		}
		if keys := a.Adm.Controller.Keys; keys != nil {
			debug.Handle("GET /debug/keys", KeysHandler(keys))
		}
		debug.Handle("GET /debug/spend", spend.Handler(a.Adm.Spend))
		if a.Recent != nil {
			pages := requestlog.Handler(a.Recent, a.Tracing.TraceURL)
			debug.Handle("GET /debug/requests", pages)
			debug.Handle("GET /debug/requests/{id}", pages)
		}
	})
	// Health and readiness mean "can decide": a refused reload of keys or
	// policies keeps the last good version serving, so the pod stays ready
	// (a bad shared ConfigMap must not take every replica out of rotation
	// at once); the refusal shows in /healthz, the log and
	// infergate_reload_errors_total.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
		if err := a.Health(); err != nil {
			io.WriteString(w, "serving the last good version: "+err.Error()+"\n")
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}

// KeysHandler serves GET /debug/keys: the loaded keys (never a key nor a
// hash), their expiry, revocation and this replica's last use of each.
func KeysHandler(keys *identity.KeySet) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(keys.Load().Status())
	}
}

// NewLogger is the process's logger, as cfg's log section says.
func NewLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// NewPoolModels lists what the pools of pm serve.
func NewPoolModels(pm config.PoolModels, logger *slog.Logger) *poolmodels.Lister {
	pools := make([]poolmodels.Pool, len(pm.Pools))
	for i, p := range pm.Pools {
		pools[i] = poolmodels.Pool{Name: p.Name, URL: p.URL, APIKeyFile: p.APIKeyFile}
	}
	return poolmodels.New(poolmodels.Options{Pools: pools, Interval: pm.Interval, KeepFor: pm.KeepFor,
		Timeout: pm.Timeout, Logger: logger})
}

// BuildVersion is stamped, or, for a binary built without the Makefile's
// -X stamp (`go install ...@v0.1.0`, the module's library), the module
// version the go command recorded in the build info.
func BuildVersion(stamped string) string {
	if stamped != "dev" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Path == "github.com/infergate/infergate" &&
		bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return stamped
}
