package meter

import (
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/request"
	"google.golang.org/protobuf/types/known/structpb"
)

// The text Envoy 1.40 sends for xds.cluster_metadata of an aggregate that
// infergate's xDS server built (captured from a real Envoy).
const aggregateMetadata = `filter_metadata { key: "infergate" value { fields { key: "pools" value { list_value { values { string_value: "pool-a" } values { string_value: "pool-b" } } } } } } `

func TestServingPools(t *testing.T) {
	for _, tc := range []struct {
		cluster, md string
		attempts    int
		want        []string
	}{
		{"pool-a", "NULL", 1, []string{"pool-a"}},
		{"pool-a", "", 0, []string{"pool-a"}},
		{"pool-a", "", 2, []string{"pool-a", "pool-a"}},
		{"", "", 1, nil},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 1, []string{"pool-a"}},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 2, []string{"pool-a", "pool-b"}},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 3, []string{"pool-a", "pool-b", "pool-a"}},
		{"other", `filter_metadata { key: "someone-else" value { } }`, 1, []string{"other"}},
		{"broken", `filter_metadata {{{`, 1, []string{"broken"}},
		// The one field (request.PoolOrderAttribute): a JSON array.
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 2, []string{"pool-b", "pool-a"}},
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 3, []string{"pool-b", "pool-a", "pool-b"}},
		{"x", `["",1,{"a":2}]`, 1, []string{"x"}},
		{"x", `[broken`, 1, []string{"x"}},
		{"x", `["pool-a"` + strings.Repeat(`,"p"`, maxPoolOrderText/4) + `]`, 1, []string{"x"}}, // too long to read
	} {
		if got := new(poolOrders).servingPools(tc.cluster, tc.md, tc.attempts); !slices.Equal(got, tc.want) {
			t.Errorf("servingPools(%q, %.20q, %d) = %v, want %v", tc.cluster, tc.md, tc.attempts, got, tc.want)
		}
	}
}

func FuzzServingPools(f *testing.F) {
	f.Add("pool-a", aggregateMetadata, 2)
	f.Add("x", "NULL", 0)
	f.Add("y", `["a","b"]`, 5)
	f.Fuzz(func(t *testing.T, cluster, md string, attempts int) {
		attempts %= 16
		got := new(poolOrders).servingPools(cluster, md, attempts)
		if cluster != "" && len(got) != max(attempts, 1) {
			t.Fatalf("%d pools for %d attempts", len(got), attempts)
		}
	})
}

// Envoy Gateway's rule clusters: the backend comes from the locality.
func TestClusterOfLocality(t *testing.T) {
	for _, tc := range []struct {
		attrs map[string]*structpb.Value
		want  string
	}{
		{map[string]*structpb.Value{"xds.cluster_name": structpb.NewStringValue("pool-a")}, "pool-a"},
		{map[string]*structpb.Value{"upstream.locality": structpb.NewStringValue(`region: "httproute/default/llm/rule/0/backend/1" `)}, "httproute/default/llm/rule/0/backend/1"},
		{map[string]*structpb.Value{"upstream.locality": structpb.NewStringValue("NULL")}, ""},
		{map[string]*structpb.Value{"upstream.locality": structpb.NewStringValue("region: {")}, ""},
		{nil, ""},
	} {
		if got := clusterOf(tc.attrs, nil); got != tc.want {
			t.Errorf("clusterOf(%v) = %q, want %q", tc.attrs, got, tc.want)
		}
	}
}

func TestClusterOfPoolHeader(t *testing.T) {
	attrs := map[string]*structpb.Value{"upstream.locality": structpb.NewStringValue(`region: "httproute/default/llm/rule/0/backend/1"`)}
	if got := clusterOf(attrs, headers{request.PoolHeader: "pool-b"}); got != "pool-b" {
		t.Errorf("clusterOf with %s = %q", request.PoolHeader, got)
	}
}
