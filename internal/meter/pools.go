package meter

import (
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/tidwall/gjson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
)

// Which pool served a request.
//
// Envoy reports the cluster the route picked (xds.cluster_name). For a
// virtual model that falls back across pools that is an aggregate cluster
// (see xds/server AggregateName) whose metadata lists its pools in the
// order attempts try them: attempt k goes to the k-th pool (wrapping when
// retries outnumber pools). The meter asks Envoy for that one field
// (request.PoolOrderAttribute: a JSON array in a string, as CEL cannot pass
// a list); an older config asks for the whole cluster metadata
// (xds.cluster_metadata), which Envoy hands over as the text form of the
// Metadata proto.

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

// poolOrders caches parsed metadata by its text: a handful of aggregates
// repeat on every request. Each Server has its own.
type poolOrders struct {
	mu sync.Mutex
	m  map[string][]string
}

// maxPoolOrders bounds the cache; it is cleared when full. maxPoolOrderText
// bounds what is parsed and kept (a longer text is no order): an
// aggregate's pools take a few hundred bytes.
const (
	maxPoolOrders    = 1024
	maxPoolOrderText = 16 << 10
)

// order returns the pools listed in a pool order (a JSON array of strings)
// or in cluster metadata text, or nil.
func (c *poolOrders) order(text string) []string {
	if text == "" || text == "NULL" || len(text) > maxPoolOrderText {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if order, ok := c.m[text]; ok {
		return order
	}
	var order []string
	if text[0] == '[' {
		if gjson.Valid(text) {
			gjson.Parse(text).ForEach(func(_, v gjson.Result) bool {
				if v.Type == gjson.String && v.Str != "" {
					order = append(order, v.Str)
				}
				return true
			})
		}
	} else if md := (corev3.Metadata{}); prototext.Unmarshal([]byte(text), &md) == nil {
		for _, v := range md.GetFilterMetadata()[request.MetadataNamespace].GetFields()[request.PoolsKey].GetListValue().GetValues() {
			if s := v.GetStringValue(); s != "" {
				order = append(order, s)
			}
		}
	}
	if c.m == nil || len(c.m) >= maxPoolOrders {
		c.m = make(map[string][]string)
	}
	c.m[text] = order
	return order
}

// servingPools returns the pools a request's attempts went to, in order;
// the last one served the response. Without a pool order every attempt
// went to the cluster itself.
func (c *poolOrders) servingPools(cluster, orderText string, attempts int) []string {
	order := c.order(orderText)
	if len(order) == 0 {
		if cluster == "" {
			return nil
		}
		order = []string{cluster}
	}
	tried := make([]string, max(attempts, 1))
	for i := range tried {
		tried[i] = order[i%len(order)]
	}
	return tried
}
