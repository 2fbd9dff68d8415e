package extproc

import (
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
)

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
