package server

import (
	"encoding/json"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	"github.com/infergate/infergate/internal/request"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Fallback across pools.
//
// Envoy retries stay inside the cluster a weighted route picked, so a pool
// answering 503 would be retried on itself. To retry on the next pool
// instead, each weighted entry of a virtual model with a fallback order is
// an aggregate cluster that lists its pool first and the others after it,
// by priority: the aggregate's priority levels are the pools, all traffic
// goes to level 0 while it is healthy, and the route's previous_priorities
// retry policy sends attempt k to level k-1. The aggregates are served over
// CDS next to the route configuration; the pools themselves stay the
// operator's clusters.
//
// The meter sees the aggregate's name as the cluster that served the
// request, so each aggregate carries its pool order as metadata, under
// request.MetadataNamespace: request.PoolOrderKey, a JSON array in a string
// (the one field the meter asks Envoy for, request.PoolOrderAttribute), and
// request.PoolsKey, the same list as a list (what an older meter config
// reads from the whole cluster metadata). The meter derives the pool each
// attempt went to from upstream.request_attempt_count.

// AggregateName is the aggregate cluster of virtualModel that tries pool first.
func AggregateName(virtualModel, pool string) string {
	return request.AggregatePrefix + virtualModel + "/" + pool
}

// fallbackOrder is pool followed by the rest of order, which lists the
// virtual model's pools by priority.
func fallbackOrder(pool string, order []string) []string {
	out := make([]string, 0, len(order))
	out = append(out, pool)
	for _, p := range order {
		if p != pool {
			out = append(out, p)
		}
	}
	return out
}

// aggregateClusters builds the aggregate clusters r's route refers to.
func aggregateClusters(r Route) []*clusterv3.Cluster {
	pools := make([]string, 0, len(r.Weights))
	for p := range r.Weights {
		pools = append(pools, p)
	}
	slices.Sort(pools)
	out := make([]*clusterv3.Cluster, 0, len(pools))
	for _, p := range pools {
		order := fallbackOrder(p, r.Fallback)
		cfg := mustAny(&aggregatev3.ClusterConfig{Clusters: order})
		values := make([]any, len(order))
		for i, name := range order {
			values[i] = name
		}
		text, err := json.Marshal(order)
		if err != nil {
			panic(err) // strings only: cannot fail
		}
		md, err := structpb.NewStruct(map[string]any{request.PoolsKey: values, request.PoolOrderKey: string(text)})
		if err != nil {
			panic(err) // strings only: cannot fail
		}
		out = append(out, &clusterv3.Cluster{
			Name:           AggregateName(r.VirtualModel, p),
			ConnectTimeout: durationpb.New(connectTimeout),
			LbPolicy:       clusterv3.Cluster_CLUSTER_PROVIDED,
			ClusterDiscoveryType: &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
				Name:        "envoy.clusters.aggregate",
				TypedConfig: cfg,
			}},
			Metadata:        &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MetadataNamespace: md}},
			CircuitBreakers: retryEveryFailure,
		})
	}
	return out
}

// retryEveryFailure lets every request of an aggregate retry at once. A
// pool that dies fails all the streams routed to it together, and Envoy's
// default (3 retries in flight per cluster) would answer all but three of
// them 503 instead of trying the next pool. A retry here goes to another
// pool and each request retries at most retry.attempts times, so the cap
// is Envoy's default cap on requests in flight per cluster. (Not a retry
// budget: it is a share of the aggregate's own active requests, which
// Envoy counts on the pools' clusters, leaving the aggregate at its
// minimum.)
var retryEveryFailure = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
	MaxRetries: wrapperspb.UInt32(1024),
}}}

// connectTimeout is required on every cluster; an aggregate never connects
// (its pools do, with their own timeouts).
const connectTimeout = 5 * time.Second

var previousPriorities = mustAny(&previousprioritiesv3.PreviousPrioritiesConfig{UpdateFrequency: 1})

// retryOnNextPool makes each retry skip the priority levels (pools) already
// tried.
func retryOnNextPool(p *routev3.RetryPolicy) {
	p.RetryPriority = &routev3.RetryPolicy_RetryPriority{
		Name:       "envoy.retry_priorities.previous_priorities",
		ConfigType: &routev3.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: previousPriorities},
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}
