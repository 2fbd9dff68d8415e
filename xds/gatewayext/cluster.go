package gatewayext

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// DestinationHeader is where the Endpoint Picker writes the pod it chose;
// the pool's ORIGINAL_DST cluster connects to it.
const DestinationHeader = "x-gateway-destination-endpoint"

// poolMetadata is the cluster metadata that marks a pool's cluster for the
// translation hook: the pool's identity and its picker, as PostClusterModify
// read them from the InferencePool (the translation hook gets no backends).
const poolMetadata = "infergate.inferencepool"

// ClusterRef is where Envoy Gateway's name of an HTTPRoute's cluster says
// it comes from: httproute/<ns>/<route>/rule/<i> for a rule whose backends
// share a cluster, .../rule/<i>/backend/<j> for one backendRef's own.
type ClusterRef struct {
	Namespace, Route string
	Rule             int
	Backend          int // -1 for a rule's shared cluster
}

// maxIndex bounds the indexes read from a cluster name (the Gateway API
// allows 16 rules of 16 backendRefs).
const maxIndex = 1024

// ParseClusterName reads an HTTPRoute cluster's name; ok is false for any
// other name.
func ParseClusterName(name string) (ClusterRef, bool) {
	parts := strings.Split(name, "/")
	if (len(parts) != 5 && len(parts) != 7) || parts[0] != "httproute" || parts[3] != "rule" ||
		parts[1] == "" || parts[2] == "" {
		return ClusterRef{}, false
	}
	index := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0 && n < maxIndex && strconv.Itoa(n) == s
	}
	ref := ClusterRef{Namespace: parts[1], Route: parts[2], Backend: -1}
	var ok bool
	if ref.Rule, ok = index(parts[4]); !ok {
		return ClusterRef{}, false
	}
	if len(parts) == 7 {
		if parts[5] != "backend" {
			return ClusterRef{}, false
		}
		if ref.Backend, ok = index(parts[6]); !ok {
			return ClusterRef{}, false
		}
	}
	return ref, true
}

// BackendRef is one backendRef of an HTTPRoute rule, as the route says.
type BackendRef struct {
	Group, Kind, Namespace, Name string
	Weight                       int64 // 1 when unset
	// Headers are its header modifier filters; Unsupported names its
	// other filters, which the extension cannot restore for a pool.
	Headers     Headers
	Unsupported []string
}

func (b BackendRef) isPool() bool { return b.Group == PoolGroup && b.Kind == PoolKind }

// PoolOfCluster says which InferencePool the cluster ref names serves,
// from the HTTPRoute's rules (their backendRefs, as the API server has
// them) and the pools Envoy Gateway passed with the cluster. ok is false
// for a cluster of other backends; a mapping it cannot prove is an error.
func PoolOfCluster(ref ClusterRef, rules [][]BackendRef, pools []Pool) (Pool, bool, error) {
	at := fmt.Sprintf("HTTPRoute %s/%s rule %d", ref.Namespace, ref.Route, ref.Rule)
	if ref.Rule >= len(rules) {
		return Pool{}, false, fmt.Errorf("%s: the route has %d rules (it changed since Envoy Gateway read it?)", at, len(rules))
	}
	rule := rules[ref.Rule]
	var candidates []BackendRef
	if ref.Backend >= 0 {
		if ref.Backend >= len(rule) {
			return Pool{}, false, fmt.Errorf("%s: no backendRef %d (it changed since Envoy Gateway read it?)", at, ref.Backend)
		}
		if !rule[ref.Backend].isPool() {
			return Pool{}, false, nil
		}
		candidates = rule[ref.Backend : ref.Backend+1]
	} else {
		// A shared cluster holds every backend with traffic: it can be a
		// pool's only when the pool is all it holds.
		var others int
		for _, b := range rule {
			switch {
			case b.Weight == 0:
			case b.isPool():
				candidates = append(candidates, b)
			default:
				others++
			}
		}
		if len(candidates) == 0 {
			return Pool{}, false, nil
		}
		for _, c := range candidates[1:] {
			if c.Namespace != candidates[0].Namespace || c.Name != candidates[0].Name {
				others++
			}
		}
		if others > 0 {
			return Pool{}, false, fmt.Errorf("%s: one cluster for an InferencePool and other backends; "+
				"give each backendRef a filter (the chart's ResponseHeaderModifier) so Envoy Gateway makes one cluster per backendRef", at)
		}
	}
	want := candidates[0]
	if len(want.Unsupported) > 0 {
		return Pool{}, false, fmt.Errorf("%s: InferencePool %s/%s has filters %v: Envoy Gateway drops a custom backend's filters, and the extension restores only header modifiers",
			at, want.Namespace, want.Name, want.Unsupported)
	}
	w, err := checkWeight(want.Weight)
	if err != nil {
		return Pool{}, false, fmt.Errorf("%s: InferencePool %s/%s: %w", at, want.Namespace, want.Name, err)
	}
	for _, p := range pools {
		if p.Namespace == want.Namespace && p.Name == want.Name {
			p.Weight, p.Headers = w, want.Headers
			return p, true, nil
		}
	}
	return Pool{}, false, fmt.Errorf("%s: InferencePool %s/%s is not among those Envoy Gateway passed (the route changed since it read it?)",
		at, want.Namespace, want.Name)
}

// OriginalDst makes c the pool's cluster: Envoy connects to the pod the
// picker wrote in DestinationHeader. Envoy Gateway's endpoints, load
// balancing and health checks go (the picker balances, from the pods' own
// metrics); the rest of c (timeouts, circuit breakers, TLS) stays.
func OriginalDst(c *clusterv3.Cluster, p Pool) {
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
	c.EdsClusterConfig = nil
	c.LoadAssignment = nil
	c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	c.LoadBalancingPolicy = nil
	c.CommonLbConfig = nil
	c.HealthChecks = nil
	c.LbConfig = &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
		UseHttpHeader: true, HttpHeaderName: DestinationHeader}}
	if c.Metadata == nil {
		c.Metadata = &corev3.Metadata{}
	}
	if c.Metadata.FilterMetadata == nil {
		c.Metadata.FilterMetadata = map[string]*structpb.Struct{}
	}
	c.Metadata.FilterMetadata[poolMetadata] = &structpb.Struct{Fields: map[string]*structpb.Value{
		"namespace":  structpb.NewStringValue(p.Namespace),
		"name":       structpb.NewStringValue(p.Name),
		"picker":     structpb.NewStringValue(p.Picker),
		"pickerPort": structpb.NewNumberValue(float64(p.PickerPort)),
		"failOpen":   structpb.NewBoolValue(p.FailOpen),
		"weight":     structpb.NewNumberValue(float64(p.Weight)),
		"headers":    structpb.NewStringValue(string(must(json.Marshal(p.Headers)))),
	}}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// poolOf reads back the pool OriginalDst marked c with.
func poolOf(c *clusterv3.Cluster) (Pool, bool) {
	md := c.GetMetadata().GetFilterMetadata()[poolMetadata]
	if md == nil {
		return Pool{}, false
	}
	f := md.GetFields()
	p := Pool{
		Namespace:  f["namespace"].GetStringValue(),
		Name:       f["name"].GetStringValue(),
		Picker:     f["picker"].GetStringValue(),
		PickerPort: uint32(f["pickerPort"].GetNumberValue()),
		FailOpen:   f["failOpen"].GetBoolValue(),
		Weight:     uint32(f["weight"].GetNumberValue()),
	}
	// The extension wrote it (PostClusterModify) for this translation.
	_ = json.Unmarshal([]byte(f["headers"].GetStringValue()), &p.Headers)
	return p, true
}
