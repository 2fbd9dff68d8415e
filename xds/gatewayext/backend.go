package gatewayext

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Envoy Gateway v1.9.1 leaves a custom backend out of a rule's weighted
// clusters (buildXdsWeightedRouteAction lists the settings with endpoints)
// and drops its backendRef's filters (processDestination returns before
// them). A rule of one InferencePool still routes, on the rule's own
// cluster; an InferencePool next to a Service (its hosted backup) would get
// none of the traffic. The extension puts each pool's backend back into its
// rule's split, with the weight and the header filters its backendRef has.

// Headers is what a backendRef's RequestHeaderModifier and
// ResponseHeaderModifier filters do.
type Headers struct {
	Request  HeaderEdit `json:"request,omitzero"`
	Response HeaderEdit `json:"response,omitzero"`
}

// HeaderEdit is one Gateway API header modifier.
type HeaderEdit struct {
	Set    []NameValue `json:"set,omitempty"`
	Add    []NameValue `json:"add,omitempty"`
	Remove []string    `json:"remove,omitempty"`
}

// NameValue is one header.
type NameValue struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

func (e HeaderEdit) toAdd() []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for _, h := range e.Set {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Name, Value: h.Value},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, h := range e.Add {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Name, Value: h.Value},
			AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	return out
}

// RouteRef is where Envoy Gateway's name of an HTTPRoute rule's route says
// it comes from: httproute/<ns>/<route>/rule/<i>/match/<j>/<host>.
type RouteRef struct {
	Namespace, Route string
	Rule             int
}

// ParseRouteName reads an HTTPRoute route's name; ok is false for any
// other name.
func ParseRouteName(name string) (RouteRef, bool) {
	parts := strings.SplitN(name, "/", 7)
	if len(parts) < 6 || parts[0] != "httproute" || parts[1] == "" || parts[2] == "" || parts[3] != "rule" || parts[5] != "match" {
		return RouteRef{}, false
	}
	i, err := strconv.Atoi(parts[4])
	if err != nil || i < 0 || i >= maxIndex || strconv.Itoa(i) != parts[4] {
		return RouteRef{}, false
	}
	return RouteRef{Namespace: parts[1], Route: parts[2], Rule: i}, true
}

// restoreBackends puts each pool cluster of a rule back into the rule's
// routes: a weighted split gets the pool's own entry (its weight and
// headers) where Envoy Gateway left it out; a route to the rule's pool
// cluster alone gets the pool's headers.
func restoreBackends(rc *routev3.RouteConfiguration, pools map[string]Pool) {
	names := slices.Sorted(maps.Keys(pools))
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			rr, ok := ParseRouteName(r.GetName())
			action := r.GetRoute()
			if !ok || action == nil {
				continue
			}
			if p, ok := pools[action.GetCluster()]; ok {
				r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, p.Headers.Request.toAdd()...)
				r.RequestHeadersToRemove = append(r.RequestHeadersToRemove, p.Headers.Request.Remove...)
				r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, p.Headers.Response.toAdd()...)
				r.ResponseHeadersToRemove = append(r.ResponseHeadersToRemove, p.Headers.Response.Remove...)
				continue
			}
			wc := action.GetWeightedClusters()
			if wc == nil {
				continue
			}
			for _, name := range names {
				ref, ok := ParseClusterName(name)
				if !ok || ref.Backend < 0 || ref.Namespace != rr.Namespace || ref.Route != rr.Route || ref.Rule != rr.Rule ||
					slices.ContainsFunc(wc.GetClusters(), func(cw *routev3.WeightedCluster_ClusterWeight) bool { return cw.GetName() == name }) {
					continue
				}
				p := pools[name]
				if p.Weight == 0 {
					continue
				}
				wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{
					Name:                    name,
					Weight:                  wrapperspb.UInt32(p.Weight),
					RequestHeadersToAdd:     p.Headers.Request.toAdd(),
					RequestHeadersToRemove:  p.Headers.Request.Remove,
					ResponseHeadersToAdd:    p.Headers.Response.toAdd(),
					ResponseHeadersToRemove: p.Headers.Response.Remove,
				})
			}
		}
	}
}

// maxWeight is the Gateway API's bound on a backendRef's weight.
const maxWeight = 1_000_000

func checkWeight(w int64) (uint32, error) {
	if w < 0 || w > maxWeight {
		return 0, fmt.Errorf("weight %d is not 0 to %d", w, maxWeight)
	}
	return uint32(w), nil
}
