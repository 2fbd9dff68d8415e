package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/feed"
	"github.com/infergate/infergate/xds/loadsignal"
	"github.com/infergate/infergate/xds/server"
	"github.com/infergate/infergate/xds/weightsink"
)

// routing is SLA-driven routing: the meter's stamps feed the controller,
// each interval the controller decides weights, and the xDS server hands
// them to Envoy as the virtual-model routes.
type routing struct {
	cfg       []config.VirtualModel
	ctrl      *controller.Controller
	xds       *server.Server
	log       *slog.Logger
	interval  time.Duration
	decisions metric.Int64Counter
	// store keeps the weights in the shared Redis, so a restarted
	// controller resumes where it was instead of jumping to the primary.
	store redis.UniversalClient
	// sink, when set, replaces the xDS server: the weights go into a
	// gateway's own routing resource (an HTTPRoute, a VirtualService).
	sink weightSink
}

// weightSink is a routing resource the weights are written to.
type weightSink interface {
	Load() error
	Apply(weights map[string]map[string]uint32) error
	Resolve(pool string) string
}

// newWeightSink returns the configured sink, or nil for infergate's own
// xDS. It reads the resource once, so a wrong name fails at start.
func newWeightSink(c config.WeightSink) (weightSink, error) {
	var sink weightSink
	switch c.Type {
	case "httpRouteFile":
		sink = &weightsink.File{Path: c.HTTPRoute.File, Namespace: c.HTTPRoute.Namespace, Name: c.HTTPRoute.Name}
	case "httpRoute", "virtualService":
		kube, err := weightsink.InCluster()
		if err != nil {
			return nil, fmt.Errorf("weightSink: %w", err)
		}
		if c.Type == "httpRoute" {
			sink = &weightsink.HTTPRoute{Kube: kube, Namespace: c.HTTPRoute.Namespace, Name: c.HTTPRoute.Name}
		} else {
			sink = &weightsink.VirtualService{Kube: kube, Namespace: c.VirtualService.Namespace, Name: c.VirtualService.Name}
		}
	default:
		return nil, nil
	}
	if err := sink.Load(); err != nil {
		return nil, fmt.Errorf("weightSink: %w", err)
	}
	return sink, nil
}

// weightsKey is the Redis hash of the weights in force, by virtual model.
const weightsKey = "ig:weights"

// newRouting returns nil when no virtual model is configured.
func newRouting(cfg *config.Config, log *slog.Logger, meter metric.Meter, store redis.UniversalClient) (*routing, error) {
	if len(cfg.VirtualModels) == 0 {
		return nil, nil
	}
	models := make([]controller.VirtualModel, len(cfg.VirtualModels))
	interval := time.Duration(0)
	for i, vm := range cfg.VirtualModels {
		m := controller.VirtualModel{
			Name: vm.Name,
			SLA:  controller.SLA{TTFTP95: vm.SLA.TTFTP95, ITLP95: vm.SLA.ITLP95, ErrorRate: vm.SLA.ErrorRate, QueueDepth: vm.SLA.QueueDepth},
			Tuning: controller.Tuning{Window: vm.Tuning.Window, MinSamples: vm.Tuning.MinSamples, Interval: vm.Tuning.Interval,
				Step: vm.Tuning.Step, Hysteresis: vm.Tuning.Hysteresis, Cooldown: vm.Tuning.Cooldown,
				ProbeWeight: vm.Tuning.ProbeWeight, PrefillPerToken: vm.Tuning.PrefillPerToken}.WithDefaults(),
		}
		for _, p := range vm.Pools {
			m.Pools = append(m.Pools, controller.Pool{Name: p.Cluster, Priority: p.Priority})
		}
		if interval == 0 || m.Tuning.Interval < interval {
			interval = m.Tuning.Interval
		}
		models[i] = m
	}
	ctrl, err := controller.New(models, time.Now)
	if err != nil {
		return nil, fmt.Errorf("virtualModels: %w", err)
	}
	// The same x-ratelimit-* response headers as envoy/demo.yaml's static
	// routes: written by Envoy from the gate's metadata.
	var headers []*corev3.HeaderValueOption
	for _, h := range []string{"limit-requests", "remaining-requests", "reset-requests", "limit-tokens", "remaining-tokens", "reset-tokens"} {
		name := "x-ratelimit-" + h
		headers = append(headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{
			Key: name, Value: "%DYNAMIC_METADATA(" + extproc.MetadataNamespace + ":" + name + ")%"}})
	}
	r := &routing{cfg: cfg.VirtualModels, ctrl: ctrl, log: log, interval: interval, store: store}
	if r.sink, err = newWeightSink(cfg.WeightSink); err != nil {
		return nil, err
	}
	if r.sink == nil {
		r.xds = server.New(server.Options{RouteConfigName: cfg.XDS.RouteConfigName, Logger: log, ResponseHeadersToAdd: headers})
	}
	if r.decisions, err = meter.Int64Counter("infergate.sla.decisions",
		metric.WithDescription("Weight changes made by the SLA controller, by virtual model.")); err != nil {
		return nil, err
	}
	if _, err = meter.Int64ObservableGauge("infergate.pool.weight",
		metric.WithDescription("Route weight of each pool of a virtual model (of 100)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, st := range r.ctrl.State() {
				for pool, w := range st.Weights {
					o.Observe(int64(w), metric.WithAttributes(attribute.String("virtual_model", st.Name),
						attribute.String("infergate.pool", pool)))
				}
			}
			return nil
		})); err != nil {
		return nil, err
	}
	r.restore()
	if _, err := r.push(); err != nil {
		return nil, err
	}
	return r, nil
}

// restore resumes the weights saved in Redis, if any.
func (r *routing) restore() {
	if r.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	saved, err := r.store.HGetAll(ctx, weightsKey).Result()
	if err != nil {
		r.log.Warn("could not read saved weights; starting from the primaries", "err", err)
		return
	}
	for vm, raw := range saved {
		var w map[string]uint32
		if err := json.Unmarshal([]byte(raw), &w); err != nil {
			continue
		}
		if err := r.ctrl.Restore(vm, w); err != nil {
			r.log.Warn("saved weights not restored", "virtual_model", vm, "err", err)
			continue
		}
		r.log.Info("weights restored", "virtual_model", vm, "weights", w)
	}
}

// save records the weights in force for the next controller to start.
func (r *routing) save(ctx context.Context) {
	if r.store == nil {
		return
	}
	fields := make([]any, 0, 2*len(r.cfg))
	for _, vm := range r.cfg {
		b, _ := json.Marshal(r.ctrl.Weights(vm.Name))
		fields = append(fields, vm.Name, string(b))
	}
	if err := r.store.HSet(ctx, weightsKey, fields...).Err(); err != nil {
		r.log.Warn("could not save weights", "err", err)
	}
}

// Record implements extproc.Sink: every metered request is an observation.
func (r *routing) Record(_ context.Context, st *extproc.Stamp) {
	observations(st, r.observe)
}

// observe hands an observation to the controller, naming its pool as the
// configuration does.
func (r *routing) observe(o controller.Observation) {
	o.Pool = r.poolName(o.Pool)
	r.ctrl.Observe(o)
}

// poolName maps what Envoy reports as the serving cluster to the pool's
// configured name: with an HTTPRoute sink, an Envoy Gateway locality
// becomes its backendRef. Safe on a nil routing.
func (r *routing) poolName(p string) string {
	if r == nil || r.sink == nil {
		return p
	}
	return r.sink.Resolve(p)
}

// observations turns a stamp into what the controller judges pools by: the
// serving pool's latency and status, and a failure for each pool an
// earlier attempt failed on.
func observations(st *extproc.Stamp, observe func(controller.Observation)) {
	if st.Decision == "deny" || st.Pool == "" {
		return
	}
	now := time.Now()
	for _, p := range st.PoolsTried[:max(len(st.PoolsTried)-1, 0)] {
		observe(controller.Observation{At: now, VirtualModel: st.Model, Pool: p,
			PromptTokens: st.PromptTokens, Status: controller.FailedAttempt})
	}
	observe(controller.Observation{At: now, VirtualModel: st.Model, Pool: st.Pool,
		PromptTokens: st.PromptTokens, TTFT: st.TTFT, ITLP95: st.ITLP95, Status: st.Status})
}

// publishSink sends observations to the shared Redis stream, for the
// controllers of every replica (see xds/feed).
type publishSink struct{ p *feed.Publisher }

func (s publishSink) Record(_ context.Context, st *extproc.Stamp) {
	observations(st, s.p.Publish)
}

// push publishes the current weights as routes; unchanged routes publish
// nothing new.
func (r *routing) push() (string, error) {
	routes := make([]server.Route, 0, len(r.cfg))
	for _, vm := range r.cfg {
		route := server.Route{VirtualModel: vm.Name, Weights: r.ctrl.Weights(vm.Name)}
		if vm.Retry != nil {
			route.Retry = &server.Retry{Attempts: vm.Retry.Attempts, On: vm.Retry.On, RetriableStatusCodes: vm.Retry.StatusCodes}
		}
		if vm.RetriesAcrossPools() {
			pools := slices.Clone(vm.Pools)
			slices.SortStableFunc(pools, func(a, b config.PoolRef) int { return a.Priority - b.Priority })
			for _, p := range pools {
				route.Fallback = append(route.Fallback, p.Cluster)
			}
		}
		routes = append(routes, route)
	}
	if r.sink != nil {
		weights := make(map[string]map[string]uint32, len(routes))
		for _, rt := range routes {
			weights[rt.VirtualModel] = rt.Weights
		}
		return "", r.sink.Apply(weights)
	}
	return r.xds.SetRoutes(routes)
}

// scrapeLoads reads each pool's model-server metrics every interval and
// reports the load to the controller, until ctx is done. A pool whose
// scrape fails keeps its last load until it ages out of the window.
func (r *routing) scrapeLoads(ctx context.Context) {
	targets := map[string][]string{}
	for _, vm := range r.cfg {
		for _, p := range vm.Pools {
			if len(p.Metrics) > 0 {
				targets[p.Cluster] = p.Metrics
			}
		}
	}
	if len(targets) == 0 {
		return
	}
	client := &http.Client{Timeout: max(r.interval, time.Second)}
	failing := map[string]bool{}
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		for pool, urls := range targets {
			l, err := loadsignal.Scrape(ctx, client, urls)
			if err != nil {
				if !failing[pool] && ctx.Err() == nil {
					r.log.Warn("pool metrics scrape failing; its queue depth is not judged until it recovers", "pool", pool, "err", err)
				}
				failing[pool] = true
				continue
			}
			if failing[pool] {
				r.log.Info("pool metrics scrape recovered", "pool", pool)
			}
			failing[pool] = false
			r.ctrl.ObserveLoad(pool, controller.Load{At: l.At, Waiting: l.Waiting, KVCacheUsage: l.KVCacheUsage})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// run ticks the controller until ctx is done.
func (r *routing) run(ctx context.Context) {
	go r.scrapeLoads(ctx)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		decisions := r.ctrl.Tick()
		for _, d := range decisions {
			r.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("virtual_model", d.VirtualModel)))
			r.log.Info("route weights changed", "virtual_model", d.VirtualModel, "from", d.From, "to", d.To, "reason", d.Reason)
		}
		if len(decisions) > 0 {
			if v, err := r.push(); err != nil {
				r.log.Error("publishing routes failed; Envoy keeps the previous weights", "err", err)
			} else {
				r.log.Info("routes published", "version", v)
				r.save(ctx)
			}
		}
	}
}

// serve runs the xDS server and the controller loop.
func (r *routing) serve(ctx context.Context, lis net.Listener) error {
	go r.run(ctx)
	if r.xds == nil { // the weights go to a file; nothing to serve
		if lis != nil {
			lis.Close()
		}
		<-ctx.Done()
		return nil
	}
	return r.xds.Serve(ctx, lis)
}

// needsListener reports whether routing serves xDS.
func (r *routing) needsListener() bool { return r != nil && r.xds != nil }

var debugPage = template.Must(template.New("controller").Funcs(template.FuncMap{
	"ms":  func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) },
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"sorted": func(m map[string]uint32) []string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return keys
	},
}).Parse(`<!doctype html><html><head><meta charset="utf-8"><title>infergate controller</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:600}.ok{color:#070}</style></head><body>
<h1>SLA controller</h1>
{{range $m := .}}<h2>{{.Name}}</h2>
<p>SLA: excess TTFT p95 &le; {{ms .SLA.TTFTP95}}, ITL p95 &le; {{ms .SLA.ITLP95}}, error rate &le; {{pct .SLA.ErrorRate}}, queue depth &le; {{.SLA.QueueDepth}} (0 = off)</p>
<table><tr><th class="l">pool</th><th>weight</th><th>samples</th><th>excess TTFT p95</th><th>TTFT p95</th><th>ITL p95</th><th>errors</th><th>queue</th><th>KV cache</th><th>slope/token</th><th class="l">state</th></tr>
{{$pools := .Pools}}{{range $p := sorted .Weights}}{{$s := index $pools $p}}<tr><td class="l">{{$p}}</td><td>{{index $m.Weights $p}}</td>
<td>{{$s.Samples}}</td><td>{{ms $s.ExcessTTFTP95}}</td><td>{{ms $s.TTFTP95}}</td><td>{{ms $s.ITLP95}}</td><td>{{pct $s.ErrorRate}}</td><td>{{if ge $s.QueueDepth 0.0}}{{$s.QueueDepth}}{{else}}-{{end}}</td><td>{{if ge $s.KVCacheUsage 0.0}}{{pct $s.KVCacheUsage}}{{else}}-{{end}}</td><td>{{ms $s.Slope}}</td>
<td class="l {{if $s.Breached}}bad{{else if $s.Healthy}}ok{{end}}">{{if $s.Breached}}breached{{else if $s.Healthy}}healthy{{else}}unknown{{end}} {{$s.Why}}</td></tr>{{end}}</table>
<table><tr><th class="l">time</th><th class="l">weights</th><th class="l">why</th></tr>
{{range .History}}<tr><td class="l">{{.At.Format "15:04:05"}}</td><td class="l">{{.From}} &rarr; {{.To}}</td><td class="l">{{.Reason}}</td></tr>{{else}}<tr><td class="l" colspan="3">no changes yet</td></tr>{{end}}</table>
{{else}}<p>No virtual models configured.</p>{{end}}</body></html>`))

// debugHandler renders /debug/controller; ?format=json gives the same
// state as JSON (durations in nanoseconds).
func (r *routing) debugHandler(w http.ResponseWriter, req *http.Request) {
	states := []controller.ModelState{}
	if r != nil {
		states = r.ctrl.State()
	}
	if req.URL.Query().Get("format") == "json" {
		w.Header().Set("content-type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(states)
		return
	}
	w.Header().Set("content-type", "text/html; charset=utf-8")
	if err := debugPage.Execute(w, states); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
