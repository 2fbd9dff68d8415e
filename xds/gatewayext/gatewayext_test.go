package gatewayext

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfigv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The resources of testdata/eg-translated.yaml: Envoy Gateway's own
// translation of the chart, rule 0 split 80/20 between backendRef 0 (here
// an InferencePool) and backendRef 1 (a Service: the pool's hosted backup).
const (
	poolCluster   = "httproute/llm/infergate/rule/0/backend/0"
	backupCluster = "httproute/llm/infergate/rule/0/backend/1"
	otherCluster  = "httproute/llm/infergate/rule/1/backend/0"
	routeConfig   = "envoy-gateway-system/eg/http"
	gateFilter    = "envoy.filters.http.ext_proc/envoyextensionpolicy/llm/infergate/extproc/0"
	meterFilter   = "envoy.filters.http.ext_proc/envoyextensionpolicy/llm/infergate/extproc/1"
	pickerFilter  = "infergate.endpoint-picker/llm/vllm-a100"
)

var testOptions = Options{PolicyNamespace: "llm", PolicyName: "infergate", ClusterDomain: "cluster.local", PickerTLS: true}

var testPool = Pool{Namespace: "llm", Name: "vllm-a100", Picker: "vllm-a100-epp", PickerPort: 9002}

// testRules are the chart's HTTPRoute llm/infergate, as the API server has
// it, with backendRef 0 of rule 0 an InferencePool.
var testRules = [][]BackendRef{
	{
		{Group: PoolGroup, Kind: PoolKind, Namespace: "llm", Name: "vllm-a100", Weight: 80,
			Headers: Headers{Response: HeaderEdit{Set: []NameValue{{Name: "x-infergate-pool", Value: "vllm-a100"}}}}},
		{Kind: "Service", Namespace: "llm", Name: "vllm-h100", Weight: 20},
	},
	{{Kind: "Service", Namespace: "llm", Name: "sglang-l4", Weight: 100}},
	{},
}

// poolJSON is the InferencePool as Envoy Gateway sends it (unstructured).
func poolJSON(failureMode string) []byte {
	return []byte(`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool",
		"metadata":{"namespace":"llm","name":"vllm-a100"},
		"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000}],
		"endpointPickerRef":{"name":"vllm-a100-epp","port":{"number":9002}` + failureMode + `}}}`)
}

type translated struct {
	Clusters  []*clusterv3.Cluster
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
}

func loadTranslated(t *testing.T) translated {
	t.Helper()
	raw, err := os.ReadFile("testdata/eg-translated.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string][]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var out translated
	decode := func(v any, m proto.Message) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := protojson.Unmarshal(b, m); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
	}
	for _, v := range doc["clusters"] {
		c := &clusterv3.Cluster{}
		decode(v, c)
		out.Clusters = append(out.Clusters, c)
	}
	for _, v := range doc["listeners"] {
		l := &listenerv3.Listener{}
		decode(v, l)
		out.Listeners = append(out.Listeners, l)
	}
	for _, v := range doc["routes"] {
		r := &routev3.RouteConfiguration{}
		decode(v, r)
		out.Routes = append(out.Routes, r)
	}
	return out
}

func find[T interface{ GetName() string }](t *testing.T, items []T, name string) T {
	t.Helper()
	for _, it := range items {
		if it.GetName() == name {
			return it
		}
	}
	t.Fatalf("no %q", name)
	var zero T
	return zero
}

// clusterHook runs the PostClusterModify core on every cluster, as Envoy
// Gateway calls it for each cluster of the route.
func clusterHook(t *testing.T, res translated) {
	t.Helper()
	for _, c := range res.Clusters {
		ref, ok := ParseClusterName(c.GetName())
		if !ok {
			continue
		}
		p, ok, err := PoolOfCluster(ref, testRules, []Pool{testPool})
		if err != nil {
			t.Fatalf("%s: %v", c.GetName(), err)
		}
		if ok {
			OriginalDst(c, p)
		}
	}
}

func TestPoolClusterBecomesOriginalDst(t *testing.T) {
	res := loadTranslated(t)
	before := loadTranslated(t)
	clusterHook(t, res)

	c := find(t, res.Clusters, poolCluster)
	if c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
		t.Errorf("pool cluster: type %v, lb_policy %v; want ORIGINAL_DST, CLUSTER_PROVIDED", c.GetType(), c.GetLbPolicy())
	}
	od := c.GetOriginalDstLbConfig()
	if !od.GetUseHttpHeader() || od.GetHttpHeaderName() != DestinationHeader {
		t.Errorf("original_dst_lb_config = %v, want the header %s", od, DestinationHeader)
	}
	if c.GetEdsClusterConfig() != nil || c.GetLoadAssignment() != nil || c.GetLoadBalancingPolicy() != nil {
		t.Errorf("pool cluster keeps Envoy Gateway's endpoints or balancing: %v", c)
	}
	if c.GetConnectTimeout().AsDuration() != find(t, before.Clusters, poolCluster).GetConnectTimeout().AsDuration() {
		t.Error("pool cluster lost Envoy Gateway's connect timeout")
	}
	// The hosted backup in the same rule, and the other rule's Service,
	// are left exactly as Envoy Gateway made them.
	for _, name := range []string{backupCluster, otherCluster} {
		if !proto.Equal(find(t, res.Clusters, name), find(t, before.Clusters, name)) {
			t.Errorf("%s was changed", name)
		}
	}
}

func TestPoolOfCluster(t *testing.T) {
	pool := func(ns, name string, w int64) BackendRef {
		return BackendRef{Group: PoolGroup, Kind: PoolKind, Namespace: ns, Name: name, Weight: w}
	}
	svc := func(name string, w int64) BackendRef {
		return BackendRef{Kind: "Service", Namespace: "llm", Name: name, Weight: w}
	}
	other := Pool{Namespace: "llm", Name: "other", Picker: "other-epp", PickerPort: 9002}
	tests := []struct {
		name    string
		cluster string
		rules   [][]BackendRef
		want    string // pool key, "" for none
		wantErr string
	}{
		{"per-backend pool", poolCluster, testRules, "llm/vllm-a100", ""},
		{"per-backend Service next to a pool", backupCluster, testRules, "", ""},
		{"rule of one pool", "httproute/llm/r/rule/0", [][]BackendRef{{pool("llm", "vllm-a100", 1)}}, "llm/vllm-a100", ""},
		{"rule of a pool and a zero-weight Service", "httproute/llm/r/rule/0", [][]BackendRef{{pool("llm", "vllm-a100", 1), svc("b", 0)}}, "llm/vllm-a100", ""},
		{"rule of Services", "httproute/llm/r/rule/0", [][]BackendRef{{svc("a", 1), svc("b", 1)}}, "", ""},
		{"per-backend, the second of two pools", "httproute/llm/r/rule/0/backend/1", [][]BackendRef{{pool("llm", "vllm-a100", 1), pool("llm", "other", 1)}}, "llm/other", ""},
		{"one cluster for a pool and a Service", "httproute/llm/r/rule/0", [][]BackendRef{{pool("llm", "vllm-a100", 1), svc("b", 1)}}, "", "one cluster for an InferencePool and other backends"},
		{"one cluster for two pools", "httproute/llm/r/rule/0", [][]BackendRef{{pool("llm", "vllm-a100", 1), pool("llm", "other", 1)}}, "", "one cluster for an InferencePool and other backends"},
		{"rule gone", "httproute/llm/r/rule/3/backend/0", testRules, "", "the route has 3 rules"},
		{"backendRef gone", "httproute/llm/r/rule/1/backend/4", testRules, "", "no backendRef 4"},
		{"pool Envoy Gateway did not pass", "httproute/llm/r/rule/0/backend/0", [][]BackendRef{{pool("ai", "vllm-a100", 1)}}, "", "not among those Envoy Gateway passed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, ok := ParseClusterName(tt.cluster)
			if !ok {
				t.Fatalf("ParseClusterName(%q) failed", tt.cluster)
			}
			p, ok, err := PoolOfCluster(ref, tt.rules, []Pool{testPool, other})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if ok {
				got = p.key()
			}
			if got != tt.want {
				t.Errorf("pool = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseClusterName(t *testing.T) {
	for name, want := range map[string]*ClusterRef{
		"httproute/llm/infergate/rule/0/backend/1":     {Namespace: "llm", Route: "infergate", Rule: 0, Backend: 1},
		"httproute/llm/infergate/rule/12":              {Namespace: "llm", Route: "infergate", Rule: 12, Backend: -1},
		"grpcroute/llm/infergate/rule/0":               nil,
		"httproute/llm/infergate/rule/01":              nil,
		"httproute/llm/infergate/rule/-1":              nil,
		"httproute/llm/infergate/rule/0/mirror/0":      nil,
		"httproute/llm/infergate/rule/99999":           nil,
		"envoyextensionpolicy/llm/infergate/extproc/0": nil,
	} {
		got, ok := ParseClusterName(name)
		if want == nil {
			if ok {
				t.Errorf("ParseClusterName(%q) = %+v, want no match", name, got)
			}
			continue
		}
		if !ok || got != *want {
			t.Errorf("ParseClusterName(%q) = %+v, %v; want %+v", name, got, ok, *want)
		}
	}
}

func TestParsePool(t *testing.T) {
	p, ok, err := ParsePool(poolJSON(`,"failureMode":"FailOpen"`))
	if err != nil || !ok {
		t.Fatalf("ParsePool: %v, %v", ok, err)
	}
	if want := (Pool{Namespace: "llm", Name: "vllm-a100", Picker: "vllm-a100-epp", PickerPort: 9002, FailOpen: true}); !reflect.DeepEqual(p, want) {
		t.Errorf("pool = %+v, want %+v", p, want)
	}
	if p, _, _ := ParsePool(poolJSON("")); p.FailOpen {
		t.Error("a pool without failureMode fails open; FailClose is the default")
	}
	if _, ok, err := ParsePool([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`)); ok || err != nil {
		t.Errorf("another kind: ok %v, err %v", ok, err)
	}
	for name, doc := range map[string]string{
		"no port":        `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"namespace":"llm","name":"p"},"spec":{"endpointPickerRef":{"name":"epp"}}}`,
		"picker kind":    `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"namespace":"llm","name":"p"},"spec":{"endpointPickerRef":{"kind":"Pod","name":"epp","port":{"number":9002}}}}`,
		"picker name":    `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"namespace":"llm","name":"p"},"spec":{"endpointPickerRef":{"name":"epp.evil.com:1/x","port":{"number":9002}}}}`,
		"failure mode":   `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"namespace":"llm","name":"p"},"spec":{"endpointPickerRef":{"name":"epp","port":{"number":9002},"failureMode":"Maybe"}}}`,
		"namespace":      `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"namespace":"LLM","name":"p"},"spec":{"endpointPickerRef":{"name":"epp","port":{"number":9002}}}}`,
		"not JSON":       `{`,
		"over the bound": `{"pad":"` + strings.Repeat("x", maxPoolBytes) + `"}`,
	} {
		if _, _, err := ParsePool([]byte(doc)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func httpFilters(t *testing.T, l *listenerv3.Listener) []*hcmv3.HttpFilter {
	t.Helper()
	hcm := &hcmv3.HttpConnectionManager{}
	if err := l.GetDefaultFilterChain().GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	return hcm.GetHttpFilters()
}

func filterNames(fs []*hcmv3.HttpFilter) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.GetName())
	}
	return out
}

func pickerIsOff(t *testing.T, m map[string]*anypb.Any) bool {
	t.Helper()
	a, ok := m[pickerFilter]
	if !ok {
		return false
	}
	pr := &extprocv3.ExtProcPerRoute{}
	if err := a.UnmarshalTo(pr); err != nil {
		t.Fatal(err)
	}
	return pr.GetDisabled()
}

func TestTranslatePutsThePickerBetweenGateAndMeter(t *testing.T) {
	res := loadTranslated(t)
	clusterHook(t, res)
	clusters, err := testOptions.Translate(res.Clusters, res.Listeners, res.Routes)
	if err != nil {
		t.Fatal(err)
	}

	// The chain: the gate, the picker, the meter, the router.
	fs := httpFilters(t, find(t, res.Listeners, routeConfig))
	if got, want := filterNames(fs), []string{gateFilter, NoRouteFilterName, pickerFilter, meterFilter, "envoy.filters.http.router"}; !slices.Equal(got, want) {
		t.Fatalf("http filters = %q, want %q", got, want)
	}
	// A request no route matches, which Envoy Gateway's gate (enabled per
	// route) does not see, is refused before the pickers; every route lets
	// its requests by.
	guard := &rbacv3.RBAC{}
	if err := fs[1].GetTypedConfig().UnmarshalTo(guard); err != nil || fs[1].GetDisabled() ||
		guard.GetRules().GetAction() != rbacconfigv3.RBAC_DENY || !guard.GetRules().GetPolicies()["no-route"].GetPermissions()[0].GetAny() {
		t.Errorf("no-route guard = %v (disabled %v), %v; want one denying everything", guard, fs[1].GetDisabled(), err)
	}
	for _, vh := range find(t, res.Routes, routeConfig).GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			off := &rbacv3.RBACPerRoute{}
			a, ok := r.GetTypedPerFilterConfig()[NoRouteFilterName]
			if !ok || a.UnmarshalTo(off) != nil || off.GetRbac() != nil {
				t.Errorf("route %s does not turn the no-route guard off", r.GetName())
			}
		}
	}
	picker := fs[2]
	if picker.GetDisabled() {
		t.Error("the picker is disabled in the chain: Envoy builds the chain from the route before the gate re-routes, so it would never run")
	}
	ep := &extprocv3.ExternalProcessor{}
	if err := picker.GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatal(err)
	}
	pm := ep.GetProcessingMode()
	if pm.GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED || pm.GetResponseBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND || pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND ||
		pm.GetRequestHeaderMode() != extprocv3.ProcessingMode_SEND || pm.GetResponseHeaderMode() != extprocv3.ProcessingMode_SEND {
		t.Errorf("processing mode = %v", pm)
	}
	if ep.GetFailureModeAllow() {
		t.Error("failure_mode_allow for a FailClose pool")
	}
	if got := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != PickerClusterName(testPool) {
		t.Errorf("picker's gRPC cluster = %q", got)
	}

	// On for the pool's share of rule 0, off for its backup's, for rule 1
	// and for the direct response.
	rc := find(t, res.Routes, routeConfig)
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	for _, cw := range routes[0].GetRoute().GetWeightedClusters().GetClusters() {
		if off := pickerIsOff(t, cw.GetTypedPerFilterConfig()); off != (cw.GetName() != poolCluster) {
			t.Errorf("weighted cluster %s: picker off = %v", cw.GetName(), off)
		}
	}
	if pickerIsOff(t, routes[0].GetTypedPerFilterConfig()) {
		t.Error("the picker is off for the whole split route")
	}
	for _, r := range routes[1:] {
		off := pickerIsOff(t, r.GetTypedPerFilterConfig())
		if wc := r.GetRoute().GetWeightedClusters(); wc != nil {
			off = true
			for _, cw := range wc.GetClusters() {
				off = off && pickerIsOff(t, cw.GetTypedPerFilterConfig())
			}
		}
		if !off {
			t.Errorf("route %s does not reach the pool but its picker is on", r.GetName())
		}
	}
	// Envoy Gateway's own per-route configs stay.
	if _, ok := routes[0].GetTypedPerFilterConfig()[gateFilter]; !ok {
		t.Error("the gate's per-route config is gone")
	}

	// The picker's cluster: its Service's DNS name, HTTP/2, TLS unverified.
	pc := find(t, clusters, PickerClusterName(testPool))
	addr := pc.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if pc.GetType() != clusterv3.Cluster_STRICT_DNS || addr.GetAddress() != "vllm-a100-epp.llm.svc.cluster.local" || addr.GetPortValue() != 9002 {
		t.Errorf("picker cluster = %v", pc)
	}
	tc := &tlsv3.UpstreamTlsContext{}
	if err := pc.GetTransportSocket().GetTypedConfig().UnmarshalTo(tc); err != nil {
		t.Fatalf("picker cluster TLS: %v", err)
	}
	if tc.GetCommonTlsContext().GetValidationContext() != nil || !slices.Equal(tc.GetCommonTlsContext().GetAlpnProtocols(), []string{"h2"}) {
		t.Errorf("picker TLS = %v, want h2 and no verification", tc)
	}
	if len(clusters) != len(res.Clusters)+1 {
		t.Errorf("%d clusters, want Envoy Gateway's %d and the picker's", len(clusters), len(res.Clusters))
	}

	// Plaintext on request; a FailOpen pool's picker lets requests by.
	plain := testOptions
	plain.PickerTLS = false
	pc, err = plain.pickerCluster(Pool{Namespace: "llm", Name: "p", Picker: "epp", PickerPort: 9002, FailOpen: true})
	if err != nil || pc.GetTransportSocket() != nil {
		t.Errorf("plaintext picker cluster: %v, %v", pc.GetTransportSocket(), err)
	}
	f, _ := testOptions.pickerFilter(Pool{Namespace: "llm", Name: "p", Picker: "epp", PickerPort: 9002, FailOpen: true})
	if err := f.GetTypedConfig().UnmarshalTo(ep); err != nil || !ep.GetFailureModeAllow() {
		t.Errorf("FailOpen pool: failure_mode_allow %v, %v", ep.GetFailureModeAllow(), err)
	}
}

func TestTranslateWithoutPoolsChangesNothing(t *testing.T) {
	res := loadTranslated(t)
	before := loadTranslated(t)
	clusters, err := testOptions.Translate(res.Clusters, res.Listeners, res.Routes)
	if err != nil {
		t.Fatal(err)
	}
	for i := range before.Clusters {
		if !proto.Equal(clusters[i], before.Clusters[i]) {
			t.Errorf("cluster %s changed", before.Clusters[i].GetName())
		}
	}
	if len(clusters) != len(before.Clusters) || !proto.Equal(res.Listeners[1], before.Listeners[1]) || !proto.Equal(res.Routes[0], before.Routes[0]) {
		t.Error("resources changed without an InferencePool")
	}
}

func TestTranslateFailsClosed(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*translated, *Options)
		wantErr string
	}{
		{"another policy's gate", func(_ *translated, o *Options) { o.PolicyName = "other" }, "gate"},
		{"the meter before the gate", func(r *translated, _ *Options) {
			l := r.Listeners[1]
			hcm := &hcmv3.HttpConnectionManager{}
			if err := l.GetDefaultFilterChain().GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
				panic(err)
			}
			hcm.HttpFilters[0], hcm.HttpFilters[1] = hcm.HttpFilters[1], hcm.HttpFilters[0]
			a, _ := anypb.New(hcm)
			l.GetDefaultFilterChain().GetFilters()[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		}, "comes before its gate"},
		{"a route to the pool the gate's policy does not target", func(r *translated, _ *Options) {
			delete(r.Routes[0].GetVirtualHosts()[0].GetRoutes()[0].TypedPerFilterConfig, gateFilter)
		}, "gate (" + gateFilter + ") is off on it"},
		{"a route to the pool that turns the gate off", func(r *translated, _ *Options) {
			r.Routes[0].GetVirtualHosts()[0].GetRoutes()[0].TypedPerFilterConfig[gateFilter] = mustAny(&routev3.FilterConfig{Disabled: true})
		}, "is off on it"},
		{"listeners not passed", func(r *translated, _ *Options) { r.Listeners = nil }, "includeAll"},
		{"routes not passed", func(r *translated, _ *Options) { r.Routes = nil }, "includeAll"},
		{"the listener that uses the routes not passed", func(r *translated, _ *Options) { r.Listeners = r.Listeners[:1] }, "no listener passed uses it"},
		{"a route choosing its cluster per request", func(r *translated, _ *Options) {
			r.Routes[0].GetVirtualHosts()[0].GetRoutes()[1].GetRoute().ClusterSpecifier = &routev3.RouteAction_ClusterHeader{ClusterHeader: "x-cluster"}
		}, "chosen per request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := loadTranslated(t)
			clusterHook(t, res)
			o := testOptions
			tt.edit(&res, &o)
			if _, err := o.Translate(res.Clusters, res.Listeners, res.Routes); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestTranslatedResourcesValidateInEnvoy loads what the hooks make of Envoy
// Gateway's resources into the real Envoy (--mode validate): the
// ORIGINAL_DST cluster, the picker's filter and cluster, the per-route
// and per-weighted-cluster configs that turn it off.
func TestTranslatedResourcesValidateInEnvoy(t *testing.T) {
	res := loadTranslated(t)
	clusterHook(t, res)
	clusters, err := testOptions.Translate(res.Clusters, res.Listeners, res.Routes)
	if err != nil {
		t.Fatal(err)
	}
	// A bootstrap of them: the routes inline in their listeners (Envoy
	// Gateway serves them over ADS), the EDS clusters on an ADS that
	// validation does not dial.
	rcs := map[string]*routev3.RouteConfiguration{}
	for _, rc := range res.Routes {
		rcs[rc.GetName()] = rc
	}
	for _, l := range res.Listeners {
		for _, fc := range append(slices.Clone(l.GetFilterChains()), l.GetDefaultFilterChain()) {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					t.Fatal(err)
				}
				if rds := hcm.GetRds(); rds != nil {
					hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rcs[rds.GetRouteConfigName()]}
				}
				a, err := anypb.New(hcm)
				if err != nil {
					t.Fatal(err)
				}
				f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
			}
		}
	}
	ads := &clusterv3.Cluster{
		Name:                 "xds_cluster",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "xds_cluster", Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 18000}}}}}}}},
		}}},
		TypedExtensionProtocolOptions: find(t, clusters, PickerClusterName(testPool)).GetTypedExtensionProtocolOptions(),
	}
	boot := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: "validate", Cluster: "validate"},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: res.Listeners,
			Clusters:  append(clusters, ads),
		},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{AdsConfig: &corev3.ApiConfigSource{
			ApiType:             corev3.ApiConfigSource_GRPC,
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "xds_cluster"}}}},
		}},
	}
	doc, err := protojson.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"ORIGINAL_DST"`, `"` + pickerFilter + `"`, `"FULL_DUPLEX_STREAMED"`, `ExtProcPerRoute`, `RBACPerRoute`} {
		if !strings.Contains(string(doc), want) {
			t.Fatalf("bootstrap lacks %s", want)
		}
	}
	path := filepath.Join(t.TempDir(), "envoy.json")
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(envoytest.Binary(t), "--mode", "validate", "-c", path, "--log-level", "warn").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}
