package server

import (
	"slices"
	"strings"
	"testing"

	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	"github.com/infergate/infergate/internal/request"
)

// Each weighted entry of a fallback route is an aggregate that tries its
// pool first and the others by priority; retries skip tried pools; the
// aggregates carry their order for the meter; the snapshot holds exactly
// the aggregates the routes name.
func TestFallbackAggregates(t *testing.T) {
	r := Route{VirtualModel: "llama", Weights: map[string]uint32{"pool-a": 80, "pool-b": 20, "pool-c": 0},
		Retry: &Retry{Attempts: 2}, Fallback: []string{"pool-a", "pool-b", "pool-c"}}
	srv := New(Options{})
	rc, clusters, _, err := srv.build([]Route{r, {VirtualModel: "plain", Weights: map[string]uint32{"pool-a": 1}}})
	if err != nil {
		t.Fatal(err)
	}
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	var names []string
	for _, wc := range routes[0].GetRoute().GetWeightedClusters().GetClusters() {
		names = append(names, wc.GetName())
	}
	if want := []string{AggregateName("llama", "pool-a"), AggregateName("llama", "pool-b"), AggregateName("llama", "pool-c")}; !slices.Equal(names, want) {
		t.Fatalf("weighted clusters %v, want %v", names, want)
	}
	if got := routes[0].GetRoute().GetRetryPolicy().GetRetryPriority().GetName(); got != "envoy.retry_priorities.previous_priorities" {
		t.Errorf("retry priority %q", got)
	}
	if got := routes[1].GetRoute().GetWeightedClusters().GetClusters()[0].GetName(); got != "pool-a" {
		t.Errorf("a route without fallback names %q", got)
	}
	if len(clusters) != 3 {
		t.Fatalf("%d clusters", len(clusters))
	}
	b := clusters[1] // sorted by name: the one that tries pool-b first
	var cfg aggregatev3.ClusterConfig
	if err := b.GetClusterType().GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if want := []string{"pool-b", "pool-a", "pool-c"}; !slices.Equal(cfg.GetClusters(), want) {
		t.Errorf("aggregate order %v, want %v", cfg.GetClusters(), want)
	}
	var meta []string
	for _, v := range b.GetMetadata().GetFilterMetadata()[request.MetadataNamespace].GetFields()[request.PoolsKey].GetListValue().GetValues() {
		meta = append(meta, v.GetStringValue())
	}
	if !slices.Equal(meta, cfg.GetClusters()) {
		t.Errorf("metadata order %v, aggregate %v", meta, cfg.GetClusters())
	}
	// The same order as one string, for the meter's CEL attribute.
	if got := b.GetMetadata().GetFilterMetadata()[request.MetadataNamespace].GetFields()[request.PoolOrderKey].GetStringValue(); got != `["pool-b","pool-a","pool-c"]` {
		t.Errorf("pool order %q", got)
	}
	// Every stream of a pool that dies may retry on the next one at once.
	if got := b.GetCircuitBreakers().GetThresholds()[0].GetMaxRetries().GetValue(); got < 1024 {
		t.Errorf("at most %d retries in flight, want Envoy's cap on requests (1024)", got)
	}
	if _, err := srv.SetRoutes([]Route{r}); err != nil {
		t.Fatal(err)
	}

	bad := r
	bad.Fallback = []string{"pool-a", "pool-a", "pool-b"}
	if err := ValidateRoutes([]Route{bad}); err == nil || !strings.Contains(err.Error(), "each pool") {
		t.Errorf("fallback order with a duplicate: %v", err)
	}
}
