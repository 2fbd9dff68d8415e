package meter

import (
	"sync"

	"github.com/tidwall/gjson"
)

// Which pool served a request.
//
// Envoy reports the cluster the route picked (xds.cluster_name). For a
// virtual model that falls back across pools that is an aggregate cluster
// (see xds/server AggregateName) whose metadata lists its pools in the
// order attempts try them: attempt k goes to the k-th pool (wrapping when
// retries outnumber pools). The meter asks Envoy for that one field
// (request.PoolOrderAttribute: a JSON array in a string, as CEL cannot pass
// a list).

// PoolOrders caches parsed pool orders by their text: a handful of
// aggregates repeat on every request. Each adapter's server has its own.
type PoolOrders struct {
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

// order returns the pools listed in a pool order (a JSON array of
// strings), or nil.
func (c *PoolOrders) order(text string) []string {
	if text == "" || text == "NULL" || len(text) > maxPoolOrderText {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if order, ok := c.m[text]; ok {
		return order
	}
	var order []string
	if text[0] == '[' && gjson.Valid(text) {
		gjson.Parse(text).ForEach(func(_, v gjson.Result) bool {
			if v.Type == gjson.String && v.Str != "" {
				order = append(order, v.Str)
			}
			return true
		})
	}
	if c.m == nil || len(c.m) >= maxPoolOrders {
		c.m = make(map[string][]string)
	}
	c.m[text] = order
	return order
}

// ServingPools returns the pools a request's attempts went to, in order;
// the last one served the response. Without a pool order every attempt
// went to the cluster itself.
func (c *PoolOrders) ServingPools(cluster, orderText string, attempts int) []string {
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
