// Package routing is the control plane's service loop: observations in,
// weights out. The meter's stamps (in-process, or through the shared Redis
// feed from every ext_proc replica) become controller observations; every
// interval the controller decides weights, and they go to Envoy as the
// virtual-model routes of infergate's xDS server, or into a gateway's own
// routing resource (an HTTPRoute, a VirtualService). The pools' model-server
// metrics (listed, or an InferencePool's ready pods, followed through the
// Kubernetes API) are scraped for queue depth, and the weights in force are
// kept in Redis so a restarted controller resumes where it was.
package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/feed"
	"github.com/infergate/infergate/xds/loadsignal"
	"github.com/infergate/infergate/xds/poolpods"
	"github.com/infergate/infergate/xds/server"
	"github.com/infergate/infergate/xds/weightsink"
)

// Options are the virtual models routed and where their weights go.
type Options struct {
	VirtualModels []VirtualModel
	// RouteConfigName names the route configuration infergate's xDS serves.
	RouteConfigName string
	// WeightSink, when its Type is set, takes the weights instead of
	// infergate's xDS.
	WeightSink WeightSinkOptions
}

// VirtualModel is one routed name and its pools.
type VirtualModel struct {
	Name  string
	Pools []Pool
	// SLA thresholds; a zero value disables that check.
	SLA controller.SLA
	// Tuning of the weight controller; zero values take the defaults.
	Tuning controller.Tuning
	// Retry is the route's retry policy; nil retries nothing.
	Retry *server.Retry
	// RetriesAcrossPools sends each retry to the next pool by priority
	// instead of the same pool.
	RetriesAcrossPools bool
}

// Pool is an Envoy cluster serving a virtual model; priority 0 is the
// primary, higher numbers are backups.
type Pool struct {
	Cluster  string
	Priority int
	// Metrics are the pool's model servers' Prometheus endpoints, scraped
	// every interval for queue depth and KV-cache usage; optional.
	Metrics []string
	// InferencePool, instead of Metrics, follows the pods of an Inference
	// Extension pool through the Kubernetes API and scrapes the ready ones.
	InferencePool *poolpods.Pool
	// EndpointPicker is the ext_proc filter of the pool's Endpoint Picker
	// (an InferencePool); the routes turn it off for the other pools.
	EndpointPicker string
}

// WeightSinkOptions name the gateway resource the weights are written to.
type WeightSinkOptions struct {
	// Type is "" or xds (infergate's own xDS server), httpRouteFile (an
	// HTTPRoute in File), httpRoute (an HTTPRoute through the Kubernetes
	// API) or virtualService (an Istio VirtualService through it).
	Type            string
	File            string // for httpRouteFile
	Namespace, Name string // the resource's
}

// Service is SLA-driven routing for the configured virtual models.
type Service struct {
	cfg       []VirtualModel
	ctrl      *controller.Controller
	xds       *server.Server // nil when a weight sink takes the weights
	log       *slog.Logger
	interval  time.Duration
	decisions metric.Int64Counter
	// store keeps the weights in the shared Redis, so a restarted
	// controller resumes where it was instead of jumping to the primary.
	store redis.UniversalClient
	// sink, when set, replaces the xDS server: the weights go into a
	// gateway's own routing resource (an HTTPRoute, a VirtualService).
	sink WeightSink
	// scrape reads a pool's model-server metrics; nil is an HTTP scrape
	// (loadsignal.Scrape). Tests replace it to run the loop in virtual time.
	scrape func(ctx context.Context, urls []string) (loadsignal.Load, error)
	// targets are the scraped pools' metrics URLs, by pool; followers
	// are the InferencePools among them, run with the loop.
	targets   map[string]metricsTargets
	followers []*poolpods.Follower
}

// metricsTargets are a pool's model servers' metrics URLs, asked at every
// scrape.
type metricsTargets interface{ URLs() []string }

// staticTargets are the URLs the configuration lists.
type staticTargets []string

func (s staticTargets) URLs() []string { return s }

// errNoReadyPods is a followed pool's scrape with no pod to read: no load,
// as when a scrape fails. A zero queue would claim health nothing showed.
var errNoReadyPods = errors.New("no ready pod")

// WeightSink is a gateway's routing resource the weights are written to.
type WeightSink interface {
	Load(ctx context.Context) error
	Apply(ctx context.Context, weights map[string]map[string]uint32) error
	// Resolve names a pool as the configuration does, from what Envoy
	// reports as the serving cluster.
	Resolve(pool string) string
}

// newWeightSink returns the configured sink, or nil for infergate's own
// xDS. It reads the resource once, so a wrong name fails at start.
func newWeightSink(ctx context.Context, c WeightSinkOptions) (WeightSink, error) {
	var sink WeightSink
	switch c.Type {
	case "httpRouteFile":
		sink = &weightsink.File{Path: c.File, Namespace: c.Namespace, Name: c.Name}
	case "httpRoute", "virtualService":
		kube, err := weightsink.Connect()
		if err != nil {
			return nil, fmt.Errorf("weightSink: %w", err)
		}
		if c.Type == "httpRoute" {
			sink = &weightsink.HTTPRoute{Kube: kube, Namespace: c.Namespace, Name: c.Name}
		} else {
			sink = &weightsink.VirtualService{Kube: kube, Namespace: c.Namespace, Name: c.Name}
		}
	default:
		return nil, nil
	}
	if err := sink.Load(ctx); err != nil {
		return nil, fmt.Errorf("weightSink: %w", err)
	}
	return sink, nil
}

// weightsKey is the Redis hash of the weights in force, by virtual model.
const weightsKey = "ig:weights"

// ioTimeout bounds one call to Redis or a weight sink.
const ioTimeout = 30 * time.Second

// New builds the routing for o's virtual models (nil, nil when there are
// none): it restores saved weights from store (optional) and publishes the
// first routes. Nothing runs until Run.
func New(ctx context.Context, o Options, log *slog.Logger, meter metric.Meter, store redis.UniversalClient) (*Service, error) {
	if len(o.VirtualModels) == 0 {
		return nil, nil
	}
	models := make([]controller.VirtualModel, len(o.VirtualModels))
	interval := time.Duration(0)
	for i, vm := range o.VirtualModels {
		m := controller.VirtualModel{Name: vm.Name, SLA: vm.SLA, Tuning: vm.Tuning.WithDefaults()}
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
	r := &Service{cfg: o.VirtualModels, ctrl: ctrl, log: log, interval: interval, store: store}
	if r.sink, err = newWeightSink(ctx, o.WeightSink); err != nil {
		return nil, err
	}
	if err := r.followPools(ctx); err != nil {
		return nil, err
	}
	if r.sink == nil {
		// The same x-ratelimit-* response headers as envoy/demo.yaml's
		// static routes: written by Envoy from the gate's metadata.
		var headers []*corev3.HeaderValueOption
		for _, name := range request.RateLimitHeaders {
			headers = append(headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{
				Key: name, Value: "%DYNAMIC_METADATA(" + request.MetadataNamespace + ":" + name + ")%"}})
		}
		r.xds = server.New(server.Options{RouteConfigName: o.RouteConfigName, Logger: log, ResponseHeadersToAdd: headers})
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
	r.restore(ctx)
	if _, err := r.push(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// restore resumes the weights saved in Redis, if any.
func (r *Service) restore(ctx context.Context) {
	if r.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
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
func (r *Service) save(ctx context.Context) {
	if r.store == nil {
		return
	}
	fields := make([]any, 0, 2*len(r.cfg))
	for _, vm := range r.cfg {
		b, _ := json.Marshal(r.ctrl.Weights(vm.Name))
		fields = append(fields, vm.Name, string(b))
	}
	ctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	if err := r.store.HSet(ctx, weightsKey, fields...).Err(); err != nil {
		r.log.Warn("could not save weights", "err", err)
	}
}

// Record implements request.Sink: every metered request of this process is
// an observation. Its pools are already named as configured (the meter
// resolved them with PoolName).
func (r *Service) Record(_ context.Context, st *request.Stamp) {
	feed.Observations(st, r.ctrl.Observe)
}

// Observe takes an observation from another process (the shared feed),
// naming its pool as the configuration does.
func (r *Service) Observe(o controller.Observation) {
	o.Pool = r.PoolName(o.Pool)
	r.ctrl.Observe(o)
}

// PoolName maps what Envoy reports as the serving cluster to the pool's
// configured name: with an HTTPRoute sink, an Envoy Gateway locality
// becomes its backendRef. Safe on a nil Service.
func (r *Service) PoolName(p string) string {
	if r == nil || r.sink == nil {
		return p
	}
	return r.sink.Resolve(p)
}

// push publishes the current weights as routes; unchanged routes publish
// nothing new.
func (r *Service) push(ctx context.Context) (string, error) {
	routes := make([]server.Route, 0, len(r.cfg))
	for _, vm := range r.cfg {
		route := server.Route{VirtualModel: vm.Name, Weights: r.ctrl.Weights(vm.Name)}
		for _, p := range vm.Pools {
			if p.EndpointPicker != "" {
				if route.Pickers == nil {
					route.Pickers = map[string]string{}
				}
				route.Pickers[p.Cluster] = p.EndpointPicker
			}
		}
		if vm.Retry != nil {
			retry := *vm.Retry
			route.Retry = &retry
		}
		if vm.RetriesAcrossPools {
			pools := slices.Clone(vm.Pools)
			slices.SortStableFunc(pools, func(a, b Pool) int { return a.Priority - b.Priority })
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
		ctx, cancel := context.WithTimeout(ctx, ioTimeout)
		defer cancel()
		return "", r.sink.Apply(ctx, weights)
	}
	return r.xds.SetRoutes(routes)
}

// followPools finds each pool's metrics URLs: listed, or followed through
// an InferencePool's pods (read once here, so a wrong name or a missing
// permission fails at start).
func (r *Service) followPools(ctx context.Context) error {
	r.targets = map[string]metricsTargets{}
	var kube *weightsink.Kube
	for _, vm := range r.cfg {
		for _, p := range vm.Pools {
			if _, ok := r.targets[p.Cluster]; ok {
				continue // a pool of several virtual models is scraped once
			}
			switch {
			case p.InferencePool != nil:
				if kube == nil {
					var err error
					if kube, err = weightsink.Connect(); err != nil {
						return fmt.Errorf("pool %s: %w", p.Cluster, err)
					}
				}
				rctx, cancel := context.WithTimeout(ctx, ioTimeout)
				f, err := poolpods.New(rctx, kube.Client, *p.InferencePool)
				cancel()
				if err != nil {
					return fmt.Errorf("pool %s: %w", p.Cluster, err)
				}
				r.targets[p.Cluster] = f
				r.followers = append(r.followers, f)
			case len(p.Metrics) > 0:
				r.targets[p.Cluster] = staticTargets(p.Metrics)
			}
		}
	}
	return nil
}

// scrapeLoads reads each pool's model-server metrics every interval and
// reports the load to the controller, until ctx is done. A pool whose
// scrape fails, or that has no ready pod, keeps its last load until it
// ages out of the window: its queue depth is then not judged.
func (r *Service) scrapeLoads(ctx context.Context) {
	targets := r.targets
	if len(targets) == 0 {
		return
	}
	for _, f := range r.followers {
		if !f.WaitSynced(ctx) {
			return
		}
	}
	scrape := r.scrape
	if scrape == nil {
		client := &http.Client{Timeout: max(r.interval, time.Second)}
		scrape = func(ctx context.Context, urls []string) (loadsignal.Load, error) {
			return loadsignal.Scrape(ctx, client, urls)
		}
	}
	failing := map[string]bool{}
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		for pool, src := range targets {
			var l loadsignal.Load
			err := errNoReadyPods
			if urls := src.URLs(); len(urls) > 0 {
				l, err = scrape(ctx, urls)
			}
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

// tick runs the controller every interval until ctx is done, publishing
// and saving the weights whenever they change.
func (r *Service) tick(ctx context.Context) {
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
			if v, err := r.push(ctx); err != nil {
				r.log.Error("publishing routes failed; Envoy keeps the previous weights", "err", err)
			} else {
				r.log.Info("routes published", "version", v)
				r.save(ctx)
			}
		}
	}
}

// Run runs the controller loop, the pools' metrics scrape and (without a
// weight sink) the xDS server on lis, until ctx is done; it returns when
// all of them have stopped. Envoy keeps the last routes it was given.
// extra are more gRPC services for lis (Envoy Gateway's extension): served
// there with or without xDS.
func (r *Service) Run(ctx context.Context, lis net.Listener, extra ...func(grpc.ServiceRegistrar)) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { r.tick(ctx); return nil })
	g.Go(func() error { r.scrapeLoads(ctx); return nil })
	for _, f := range r.followers {
		g.Go(func() error { f.Run(ctx); return nil })
	}
	switch {
	case r.xds != nil:
		g.Go(func() error {
			if err := r.xds.Serve(ctx, lis, extra...); err != nil {
				return fmt.Errorf("xds: %w", err)
			}
			return nil
		})
	case len(extra) > 0:
		g.Go(func() error {
			if err := server.ServeGRPC(ctx, lis, server.GRPCOptions{Logger: r.log}, extra...); err != nil {
				return fmt.Errorf("xds: %w", err)
			}
			return nil
		})
	case lis != nil:
		lis.Close() // the weights go to a gateway's resource; nothing to serve
	}
	return g.Wait()
}

// NeedsListener reports whether the Service serves xDS. Safe on nil.
func (r *Service) NeedsListener() bool { return r != nil && r.xds != nil }
