package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/requestlog"
	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/xds/feed"
	"github.com/infergate/infergate/xds/routing"
)

// observers are where a request's stamp goes besides the metrics, and
// what the admin port shows of them: serve (around the ext_proc adapter)
// and the dynamic module (inside Envoy) build them here alike.
type observers struct {
	sinks   []request.Sink
	recent  *requestlog.Ring // nil when admin.recentRequests is 0 or debug is off
	tracing *telemetry.Tracing
	// publisher sends the SLA observations to the shared Redis; nil
	// without Redis. Run it (publisher.Run) for as long as stamps come.
	publisher *feed.Publisher
}

// newObservers builds the request log (JSON lines to requests), the
// /debug/requests ring and the tracer of cfg.
func newObservers(ctx context.Context, cfg *config.Config, metrics *telemetry.Metrics, requests io.Writer) (*observers, error) {
	o := &observers{}
	if *cfg.Log.Requests {
		o.sinks = append(o.sinks, requestlog.NewLogSink(requests))
	}
	if cfg.Admin.Debug.Enabled && *cfg.Admin.RecentRequests > 0 {
		o.recent = requestlog.NewRing(*cfg.Admin.RecentRequests)
		o.sinks = append(o.sinks, o.recent)
	}
	var err error
	o.tracing, err = telemetry.NewTracing(ctx, telemetry.TracingOptions{Endpoint: cfg.Tracing.Endpoint, Protocol: cfg.Tracing.Protocol,
		Insecure: cfg.Tracing.Insecure, SampleRatio: cfg.Tracing.SampleRatio, QueueSize: cfg.Tracing.QueueSize}, Version, metrics)
	return o, err
}

// observeSLA sends the stamps to the SLA controller: with Redis to the
// shared feed (every controller, in serve or `infergate controller`,
// reads every replica's), else to rt in this process (nil: no virtual
// models, nothing to observe).
func (o *observers) observeSLA(adm *admissionParts, rt *routing.Service, log *slog.Logger) {
	switch {
	case adm.redis != nil:
		o.publisher = feed.NewPublisher(adm.redis, feed.DefaultStream, log)
		o.sinks = append(o.sinks, routing.PublishSink(o.publisher))
	case rt != nil:
		o.sinks = append(o.sinks, rt)
	}
}

// admin is what the admin port serves: serve's and the module's.
type admin struct {
	cfg     config.Admin
	tracing config.Tracing
	metrics *telemetry.Metrics
	adm     *admissionParts
	recent  *requestlog.Ring
	routing *routing.Service // nil: /debug/controller shows no virtual model
	health  func() error     // why the last reload was refused, if it was
	ready   func() bool
}

// handler serves /metrics, /healthz and /readyz, and the /debug pages
// admin.debug and admin.pprof turn on.
func (a admin) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", adminIndex(a.cfg, a.adm.controller.Keys != nil, a.recent != nil))
	mux.Handle("GET /metrics", a.metrics.Handler())
	debugPages(mux, a.cfg, func(debug *http.ServeMux) {
		debug.HandleFunc("GET /debug/controller", a.routing.DebugHandler)
		if keys := a.adm.controller.Keys; keys != nil {
			debug.Handle("GET /debug/keys", keysHandler(keys))
		}
		debug.Handle("GET /debug/spend", spend.Handler(a.adm.spend))
		if a.recent != nil {
			pages := requestlog.Handler(a.recent, a.tracing.TraceURL)
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
		if err := a.health(); err != nil {
			io.WriteString(w, "serving the last good version: "+err.Error()+"\n")
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}
