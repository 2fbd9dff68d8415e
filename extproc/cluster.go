package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
)

// Which pool served a request, as Envoy's attributes tell it: the cluster
// here, the pools of an aggregate in the meter's core (meter.PoolOrders).

// clusterOf names what served the request: Envoy's cluster; where the
// cluster name is not available (Envoy Gateway does not let ext_proc ask
// for xds.cluster_name), the route's x-infergate-pool response header, else
// the upstream locality's region (Envoy Gateway puts a rule's backends in
// one cluster as localities, e.g. "httproute/default/llm/rule/0/backend/1",
// which the HTTPRoute weight sink maps back to its backendRef).
func clusterOf(attrs map[string]*structpb.Value, h headers) string {
	if c := attrString(attrs, "xds.cluster_name"); c != "" {
		return c
	}
	if p := h[request.PoolHeader]; p != "" {
		return p
	}
	return localityRegion(attrString(attrs, "upstream.locality"))
}

// localityRegion reads the region from a Locality in text form
// (`region: "..."`), as Envoy sends upstream.locality.
func localityRegion(text string) string {
	if text == "" || text == "NULL" {
		return ""
	}
	var l corev3.Locality
	if prototext.Unmarshal([]byte(text), &l) != nil {
		return ""
	}
	return l.GetRegion()
}
