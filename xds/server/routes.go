package server

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/infergate/infergate/internal/request"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DefaultRouteConfigName is the RDS resource name used when Options leaves
// RouteConfigName empty.
const DefaultRouteConfigName = "infergate"

// DefaultRetryOn is the retry_on used when a Retry leaves On empty.
const DefaultRetryOn = "5xx,reset,connect-failure,retriable-status-codes"

// FallbackRouteName is the name of the final route that answers 404 for
// models no route matched.
const FallbackRouteName = "infergate-unknown-model"

// Route is one virtual model: requests whose x-infergate-model equals
// VirtualModel are spread over the clusters in Weights.
type Route struct {
	// VirtualModel is matched exactly on the x-infergate-model header.
	VirtualModel string
	// Weights maps an Envoy cluster name to its weight. Zero weights are
	// allowed (the cluster stays in the route but gets no traffic); the
	// total must be positive.
	Weights map[string]uint32
	// Timeout is the route timeout; 0 disables it (needed for long streams).
	Timeout time.Duration
	// Retry is the optional retry policy.
	Retry *Retry
	// Fallback, when set, lists the pools in Weights by priority, and
	// retries go to the next pool instead of the same one (see
	// AggregateName). Envoy must then take its clusters (CDS) from this
	// server too.
	Fallback []string
	// Pickers maps a pool (a cluster in Weights) that sits behind an
	// Endpoint Picker to the name of the picker's ext_proc filter in Envoy's
	// chain (an InferencePool, envoy/inference-pool-sla.yaml). The route
	// turns each picker off for the other pools' share of the traffic: a
	// request the split sends elsewhere is not picked a pod for.
	Pickers map[string]string
}

// Retry is a route's retry policy. Retries go to a different host when
// one is available (previous_hosts predicate).
type Retry struct {
	// Attempts is num_retries: retries after the first try.
	Attempts uint32
	// On is Envoy's retry_on; empty means DefaultRetryOn.
	On string
	// RetriableStatusCodes are retried when On contains
	// "retriable-status-codes"; empty means 429.
	RetriableStatusCodes []uint32
	// PerTryTimeout bounds each try; 0 means the route timeout applies.
	PerTryTimeout time.Duration
}

// ValidateRoutes checks routes the way SetRoutes does before building:
// non-empty, unique virtual models; non-empty cluster names; positive total
// weight that fits Envoy's uint32 sum.
func ValidateRoutes(routes []Route) error {
	seen := make(map[string]bool, len(routes))
	var errs []error
	for i, r := range routes {
		name := r.VirtualModel
		if name == "" {
			errs = append(errs, fmt.Errorf("route %d: empty virtual model", i))
			name = fmt.Sprintf("#%d", i)
		} else if seen[name] {
			errs = append(errs, fmt.Errorf("route %q: duplicate virtual model", name))
		}
		seen[name] = true
		if r.Timeout < 0 {
			errs = append(errs, fmt.Errorf("route %q: negative timeout", name))
		}
		if len(r.Weights) == 0 {
			errs = append(errs, fmt.Errorf("route %q: no clusters", name))
			continue
		}
		var total uint64
		for cluster, w := range r.Weights {
			if strings.TrimSpace(cluster) == "" {
				errs = append(errs, fmt.Errorf("route %q: empty cluster name", name))
			}
			total += uint64(w)
		}
		switch {
		case total == 0:
			errs = append(errs, fmt.Errorf("route %q: weights total 0", name))
		case total > uint64(^uint32(0)):
			errs = append(errs, fmt.Errorf("route %q: weights total %d overflows uint32", name, total))
		}
		if len(r.Fallback) > 0 {
			// Sorted, they equal the sorted pools exactly: each pool once.
			fallback := slices.Sorted(slices.Values(r.Fallback))
			pools := slices.Sorted(maps.Keys(r.Weights))
			if !slices.Equal(fallback, pools) {
				errs = append(errs, fmt.Errorf("route %q: fallback order %v must list each pool of %v once", name, r.Fallback, pools))
			}
		}
		for cluster, filter := range r.Pickers {
			if _, ok := r.Weights[cluster]; !ok || strings.TrimSpace(filter) == "" {
				errs = append(errs, fmt.Errorf("route %q: endpoint picker %q of %q: the pool must be in the route and the filter named", name, filter, cluster))
			}
			if len(r.Fallback) > 0 {
				errs = append(errs, fmt.Errorf("route %q: pool %q has an endpoint picker: its retries cannot go to the next pool", name, cluster))
			}
		}
		if r.Retry != nil && r.Retry.PerTryTimeout < 0 {
			errs = append(errs, fmt.Errorf("route %q: negative per-try timeout", name))
		}
	}
	return errors.Join(errs...)
}

// BuildRouteConfiguration builds the RDS resource: one virtual host
// matching every domain, one route per virtual model (sorted by name, so
// the output is deterministic), then extra (verbatim, in order), then,
// when fallback404 is set, a catch-all route answering 404 with an
// OpenAI-style JSON error.
//
// It does not validate; see ValidateRoutes and the resource's
// ValidateAll.
//
// Nothing in the resource carries a TTL: Envoy keeps serving the last
// configuration it accepted for as long as the control plane is away.
func BuildRouteConfiguration(name string, routes []Route, fallback404 bool, extra ...*routev3.Route) *routev3.RouteConfiguration {
	sorted := slices.Clone(routes)
	slices.SortStableFunc(sorted, func(a, b Route) int { return strings.Compare(a.VirtualModel, b.VirtualModel) })

	vh := &routev3.VirtualHost{
		Name:    name,
		Domains: []string{"*"},
	}
	for _, r := range sorted {
		vh.Routes = append(vh.Routes, buildRoute(r))
	}
	vh.Routes = append(vh.Routes, extra...)
	if fallback404 {
		vh.Routes = append(vh.Routes, unknownModelRoute())
	}
	return &routev3.RouteConfiguration{
		Name:         name,
		VirtualHosts: []*routev3.VirtualHost{vh},
	}
}

func buildRoute(r Route) *routev3.Route {
	clusters := make([]string, 0, len(r.Weights))
	for c := range r.Weights {
		clusters = append(clusters, c)
	}
	slices.Sort(clusters)
	wc := &routev3.WeightedCluster{}
	for _, c := range clusters {
		name := c
		if len(r.Fallback) > 0 {
			name = AggregateName(r.VirtualModel, c)
		}
		wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{
			Name:                 name,
			Weight:               wrapperspb.UInt32(r.Weights[c]),
			TypedPerFilterConfig: pickersOff(r.Pickers, c),
		})
	}
	action := &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: wc},
		// Always explicit: Envoy's default is 15s, and 0 disables it.
		Timeout:     durationpb.New(r.Timeout),
		RetryPolicy: buildRetry(r.Retry),
		// A hosted pool (an endpoint with a hostname, envoy/pool-credential.yaml)
		// routes by Host: send it its own name, never the client's. A pool
		// without a hostname keeps the client's Host.
		HostRewriteSpecifier: &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)},
	}
	if action.RetryPolicy != nil && len(r.Fallback) > 0 {
		retryOnNextPool(action.RetryPolicy)
	}
	return &routev3.Route{
		Name: r.VirtualModel,
		Match: &routev3.RouteMatch{
			PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
			Headers: []*routev3.HeaderMatcher{{
				Name: request.ModelHeader,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Exact{Exact: r.VirtualModel},
				}},
			}},
		},
		Action: &routev3.Route_Route{Route: action},
	}
}

// pickerOff turns an ext_proc filter off for a route or a weighted cluster.
var pickerOff = mustAny(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})

// pickersOff is the per-filter config of cluster's share of a route: every
// Endpoint Picker but cluster's own turned off; nil without one.
func pickersOff(pickers map[string]string, cluster string) map[string]*anypb.Any {
	var out map[string]*anypb.Any
	for pool, filter := range pickers {
		if pool == cluster || filter == pickers[cluster] {
			continue
		}
		if out == nil {
			out = map[string]*anypb.Any{}
		}
		out[filter] = pickerOff
	}
	return out
}

var previousHosts = mustAny(&previoushostsv3.PreviousHostsPredicate{})

func buildRetry(r *Retry) *routev3.RetryPolicy {
	if r == nil {
		return nil
	}
	on := r.On
	if on == "" {
		on = DefaultRetryOn
	}
	p := &routev3.RetryPolicy{
		RetryOn:    on,
		NumRetries: wrapperspb.UInt32(r.Attempts),
		RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
			Name:       "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: previousHosts},
		}},
		HostSelectionRetryMaxAttempts: 3,
	}
	if strings.Contains(on, "retriable-status-codes") {
		p.RetriableStatusCodes = slices.Clone(r.RetriableStatusCodes)
		if len(p.RetriableStatusCodes) == 0 {
			p.RetriableStatusCodes = []uint32{429}
		}
	}
	if r.PerTryTimeout > 0 {
		p.PerTryTimeout = durationpb.New(r.PerTryTimeout)
	}
	return p
}

// unknownModelRoute answers every request no earlier route took with a 404
// shaped like OpenAI's model_not_found error. json_format escapes the
// header value, so a hostile model name cannot break the JSON.
func unknownModelRoute() *routev3.Route {
	body, err := structpb.NewStruct(map[string]any{
		"error": map[string]any{
			"message": "The model '%REQ(" + request.ModelHeader + ")%' does not exist or you do not have access to it.",
			"type":    "invalid_request_error",
			"param":   "model",
			"code":    "model_not_found",
		},
	})
	if err != nil {
		panic(err)
	}
	return &routev3.Route{
		Name:  FallbackRouteName,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 404,
			BodyFormat: &corev3.SubstitutionFormatString{
				Format:      &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: body},
				ContentType: "application/json",
			},
		}},
	}
}
