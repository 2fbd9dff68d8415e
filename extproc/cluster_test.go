package extproc

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/request"
)

// The text Envoy 1.40 sends for xds.cluster_metadata of an aggregate that
// infergate's xDS server built (captured from a real Envoy).
const aggregateMetadata = `filter_metadata { key: "infergate" value { fields { key: "pools" value { list_value { values { string_value: "pool-a" } values { string_value: "pool-b" } } } } } } `

// An older config's whole cluster metadata names the aggregate's pools.
func TestServingPoolsOfClusterMetadata(t *testing.T) {
	for _, tc := range []struct {
		cluster, md string
		attempts    int
		want        []string
	}{
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 1, []string{"pool-a"}},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 3, []string{"pool-a", "pool-b", "pool-a"}},
		{"other", `filter_metadata { key: "someone-else" value { } }`, 1, []string{"other"}},
		{"broken", `filter_metadata {{{`, 1, []string{"broken"}},
	} {
		orders := meter.PoolOrders{Legacy: clusterMetadataPools}
		if got := orders.ServingPools(tc.cluster, tc.md, tc.attempts); !slices.Equal(got, tc.want) {
			t.Errorf("ServingPools(%q, %.20q, %d) = %v, want %v", tc.cluster, tc.md, tc.attempts, got, tc.want)
		}
	}
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
