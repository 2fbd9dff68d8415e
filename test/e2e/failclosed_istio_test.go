package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// Fail-closed through Istio: the chart's EnvoyFilters, as rendered with
// ci/istio-values.yaml (test/charts' committed golden file; this module
// does not import Helm), applied by a small EnvoyFilter applier to an Envoy
// bootstrap shaped like what istiod sends, then run against mock pools with
// infergate up, down (three ways, see failclosed_gateways_test.go) and with
// only the meter unreachable.
//
// What is modelled:
//   - EnvoyFilter selection: workloadSelector labels and namespace (the root
//     namespace, istio-system, applies everywhere), one filter per proxy;
//   - the patches, as istiod's envoyfilter package applies them: per
//     listener, its context (GATEWAY for a gateway; SIDECAR_INBOUND or
//     SIDECAR_OUTBOUND by traffic_direction for a sidecar), per filter chain
//     (portNumber is the listener's port, or on virtualInbound/
//     virtualOutbound the chain's destination_port), per network filter:
//     NETWORK_FILTER MERGE (proto.Merge semantics), then in an HCM each
//     HTTP_FILTER INSERT_BEFORE lands before the first http filter the
//     sub-filter match names. Only what the chart uses is implemented;
//     anything else (another applyTo, operation or match field, a camelCase
//     or zero-valued merge) fails the test, and so does a patch that applies
//     nowhere (Istio would skip it silently);
//   - the ingress gateway (istio: ingressgateway in istio-system): listener
//     0.0.0.0_8080 (on a free port), an HCM with the upstream filters Istio
//     puts before the router, routes on x-infergate-model to
//     outbound|8000||<pool> clusters as a VirtualService would, and no
//     catch-all (Istio answers 404 when no route matches);
//   - a model server's sidecar (app.kubernetes.io/name: vllm in models):
//     virtualInbound with one filter chain per pod port on destination_port
//     (8000, the chart's portNumber, routing everything to inbound|8000||,
//     the pool; and 9090, which must stay unpatched), and an outbound
//     listener 0.0.0.0_8000 (bind_to_port false, as Istio's) that the
//     SIDECAR_INBOUND patches must leave alone;
//   - the ext_proc cluster Istio builds for the infergate Service,
//     outbound|50051||infergate.llm.svc.cluster.local: HTTP/2 (the port's
//     appProtocol is grpc), Istio's default 10 s connect timeout.
//
// What is not: xDS (everything is static, routes inline rather than RDS),
// EDS (one static endpoint), Istio's mTLS to infergate, Istio's own filters
// that upstream Envoy lacks (istio.metadata_exchange, istio.stats; upstream
// grpc_stats, fault and cors stand in), and iptables: the REDIRECT into
// virtualInbound is a forwarder that writes a PROXY protocol header with
// the original destination port, which Envoy's proxy_protocol listener
// filter restores where Istio's original_dst would.

// istioRootNamespace is Istio's default root namespace: an EnvoyFilter there
// applies to matching workloads in every namespace.
const istioRootNamespace = "istio-system"

const istioExtProcCluster = "outbound|50051||infergate.llm.svc.cluster.local"

// istioProxy is the workload whose proxy is modelled.
type istioProxy struct {
	name      string
	gateway   bool // an Istio gateway (context GATEWAY) or a sidecar
	namespace string
	labels    map[string]string
}

var (
	istioIngressGateway = istioProxy{name: "ingress gateway", gateway: true, namespace: "istio-system",
		labels: map[string]string{"istio": "ingressgateway", "app": "istio-ingressgateway"}}
	istioModelSidecar = istioProxy{name: "model server sidecar", namespace: "models",
		labels: map[string]string{"app.kubernetes.io/name": "vllm", "app": "vllm"}}
)

type istioEnvoyFilter struct {
	name, namespace string
	selector        map[string]string
	patches         []*istioPatch
}

type istioPatch struct {
	filter     string // the EnvoyFilter's name, for messages
	index      int
	applyTo    string
	context    string
	portNumber int
	netFilter  string // match.listener.filterChain.filter.name
	subFilter  string // match.listener.filterChain.filter.subFilter.name
	operation  string
	value      map[string]any
	applied    int
}

func (p *istioPatch) String() string { return fmt.Sprintf("%s configPatches[%d]", p.filter, p.index) }

// istioKeys fails unless every key of m is one of allowed: anything the
// applier does not implement must not pass unnoticed.
func istioKeys(t *testing.T, where string, m map[string]any, allowed ...string) {
	t.Helper()
	for k := range m {
		found := false
		for _, a := range allowed {
			found = found || k == a
		}
		if !found {
			t.Fatalf("%s: %q is not implemented by this test's EnvoyFilter applier", where, k)
		}
	}
}

// istioString is a string field, "" when absent.
func istioString(t *testing.T, where string, v any) string {
	t.Helper()
	if v == nil {
		return ""
	}
	str, ok := v.(string)
	if !ok {
		t.Fatalf("%s: %T, want a string", where, v)
	}
	return str
}

// istioMap is a mapping field, empty when absent.
func istioMap(t *testing.T, where string, v any) map[string]any {
	t.Helper()
	if v == nil {
		return map[string]any{}
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: %T, want a mapping", where, v)
	}
	return m
}

// istioEnvoyFilters reads the EnvoyFilters the chart renders with
// ci/istio-values.yaml from test/charts' golden file.
func istioEnvoyFilters(t *testing.T) []istioEnvoyFilter {
	t.Helper()
	var out []istioEnvoyFilter
	for _, doc := range istioDocs(t, "test/charts/testdata/istio.yaml") {
		if doc["kind"] != "EnvoyFilter" {
			continue
		}
		md := istioMap(t, "metadata", doc["metadata"])
		f := istioEnvoyFilter{name: fmt.Sprint(md["name"]), namespace: fmt.Sprint(md["namespace"])}
		spec := istioMap(t, f.name+".spec", doc["spec"])
		istioKeys(t, f.name+".spec", spec, "workloadSelector", "configPatches")
		ws := istioMap(t, f.name+".workloadSelector", spec["workloadSelector"])
		istioKeys(t, f.name+".workloadSelector", ws, "labels")
		f.selector = map[string]string{}
		for k, v := range istioMap(t, f.name+".workloadSelector.labels", ws["labels"]) {
			f.selector[k] = fmt.Sprint(v)
		}
		cps, _ := spec["configPatches"].([]any)
		for i, cp := range cps {
			p := &istioPatch{filter: f.name, index: i}
			where := p.String()
			cpm := istioMap(t, where, cp)
			istioKeys(t, where, cpm, "applyTo", "match", "patch")
			p.applyTo = istioString(t, where+".applyTo", cpm["applyTo"])
			match := istioMap(t, where+".match", cpm["match"])
			istioKeys(t, where+".match", match, "context", "listener")
			p.context = istioString(t, where+".match.context", match["context"])
			if p.context == "" {
				p.context = "ANY"
			}
			lis := istioMap(t, where+".match.listener", match["listener"])
			istioKeys(t, where+".match.listener", lis, "portNumber", "filterChain")
			if n, ok := lis["portNumber"]; ok {
				if p.portNumber, ok = n.(int); !ok || p.portNumber <= 0 {
					t.Fatalf("%s.match.listener.portNumber: %v", where, n)
				}
			}
			fc := istioMap(t, where+".match.listener.filterChain", lis["filterChain"])
			istioKeys(t, where+".match.listener.filterChain", fc, "filter")
			nf := istioMap(t, where+".match.listener.filterChain.filter", fc["filter"])
			istioKeys(t, where+".match.listener.filterChain.filter", nf, "name", "subFilter")
			p.netFilter = istioString(t, where+".match.listener.filterChain.filter.name", nf["name"])
			sf := istioMap(t, where+".match.listener.filterChain.filter.subFilter", nf["subFilter"])
			istioKeys(t, where+".match.listener.filterChain.filter.subFilter", sf, "name")
			p.subFilter = istioString(t, where+".match.listener.filterChain.filter.subFilter.name", sf["name"])
			patch := istioMap(t, where+".patch", cpm["patch"])
			istioKeys(t, where+".patch", patch, "operation", "value")
			p.operation = istioString(t, where+".patch.operation", patch["operation"])
			p.value = istioMap(t, where+".patch.value", patch["value"])

			switch {
			case p.applyTo == "HTTP_FILTER" && p.operation == "INSERT_BEFORE":
				if p.netFilter == "" || p.subFilter == "" {
					t.Fatalf("%s: INSERT_BEFORE without a filter and sub-filter match is not implemented", where)
				}
				istioKeys(t, where+".patch.value", p.value, "name", "typed_config")
			case p.applyTo == "NETWORK_FILTER" && p.operation == "MERGE":
				if p.netFilter == "" {
					t.Fatalf("%s: MERGE without a filter match is not implemented", where)
				}
				istioKeys(t, where+".patch.value", p.value, "typed_config")
			default:
				t.Fatalf("%s: applyTo %s operation %s is not implemented", where, p.applyTo, p.operation)
			}
			switch p.context {
			case "ANY", "GATEWAY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND":
			default:
				t.Fatalf("%s: context %s is not implemented", where, p.context)
			}
			f.patches = append(f.patches, p)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		t.Fatal("no EnvoyFilter in the istio golden file")
	}
	return out
}

// istioSelect returns the EnvoyFilters istiod would give the proxy: those in
// its namespace or the root namespace whose selector its labels satisfy.
func istioSelect(t *testing.T, proxy istioProxy, filters []istioEnvoyFilter) []*istioPatch {
	t.Helper()
	var patches []*istioPatch
	var names []string
	for _, f := range filters {
		if f.namespace != proxy.namespace && f.namespace != istioRootNamespace {
			continue
		}
		ok := true
		for k, v := range f.selector {
			ok = ok && proxy.labels[k] == v
		}
		if ok {
			names = append(names, f.name)
			patches = append(patches, f.patches...)
		}
	}
	if len(names) != 1 {
		t.Fatalf("%s: EnvoyFilters selected %v, want exactly one", proxy.name, names)
	}
	return patches
}

// istioApply applies the patches to the bootstrap's listeners as istiod's
// envoyfilter.ApplyListenerPatches does for these operations: per listener
// (its context from the proxy kind and traffic_direction), per filter chain,
// per network filter: NETWORK_FILTER MERGE, then, in an HCM, HTTP_FILTER
// INSERT_BEFORE the first http filter named by the sub-filter match.
func istioApply(t *testing.T, proxy istioProxy, bootstrap map[string]any, patches []*istioPatch) {
	t.Helper()
	sr := istioMap(t, "static_resources", bootstrap["static_resources"])
	listeners, _ := sr["listeners"].([]any)
	for _, l := range listeners {
		lis := istioMap(t, "listener", l)
		name, _ := lis["name"].(string)
		if _, ok := lis["default_filter_chain"]; ok {
			t.Fatalf("listener %s: default_filter_chain is not implemented", name)
		}
		ctx := "GATEWAY"
		if !proxy.gateway {
			switch lis["traffic_direction"] {
			case "INBOUND":
				ctx = "SIDECAR_INBOUND"
			case "OUTBOUND":
				ctx = "SIDECAR_OUTBOUND"
			default:
				t.Fatalf("sidecar listener %s has no traffic_direction", name)
			}
		}
		virtual := name == "virtualInbound" || name == "virtualOutbound"
		sa := istioMap(t, name+".address", istioMap(t, name+".address", lis["address"])["socket_address"])
		lisPort, _ := sa["port_value"].(int)
		chains, _ := lis["filter_chains"].([]any)
		for _, c := range chains {
			chain := istioMap(t, name+".filter_chain", c)
			destPort, _ := istioMap(t, name+".filter_chain_match", chain["filter_chain_match"])["destination_port"].(int)
			matches := func(p *istioPatch, netFilter string) bool {
				if p.context != "ANY" && p.context != ctx {
					return false
				}
				if p.portNumber != 0 {
					// Istio: on the virtual listeners the port is the
					// chain's destination_port; elsewhere the listener's.
					if virtual && destPort != p.portNumber || !virtual && lisPort != p.portNumber {
						return false
					}
				}
				return p.netFilter == netFilter
			}
			filters, _ := chain["filters"].([]any)
			for _, nf := range filters {
				f := istioMap(t, name+".filter", nf)
				fname, _ := f["name"].(string)
				for _, p := range patches {
					if p.applyTo == "NETWORK_FILTER" && matches(p, fname) {
						tc := istioMap(t, fname+".typed_config", f["typed_config"])
						istioMerge(t, p.String(), tc, istioMap(t, p.String(), p.value["typed_config"]))
						p.applied++
					}
				}
				if fname != "envoy.filters.network.http_connection_manager" {
					continue
				}
				hcm := istioMap(t, fname+".typed_config", f["typed_config"])
				for _, p := range patches {
					if p.applyTo != "HTTP_FILTER" || !matches(p, fname) {
						continue
					}
					hf, _ := hcm["http_filters"].([]any)
					for i, h := range hf {
						if istioMap(t, "http filter", h)["name"] == p.subFilter {
							hcm["http_filters"] = append(hf[:i:i], append([]any{istioClone(p.value)}, hf[i:]...)...)
							p.applied++
							break
						}
					}
				}
			}
		}
	}
	for _, p := range patches {
		if p.applied == 0 {
			t.Fatalf("%s (%s %s) applied nowhere in the %s: Istio would skip it silently", p, p.applyTo, p.operation, proxy.name)
		}
	}
}

// istioMerge merges src into dst as proto.Merge does on the decoded
// messages: messages field by field, repeated fields appended, scalars
// replaced. A proto3 zero scalar does not replace in proto.Merge and
// camelCase names would not merge with the snake_case of the bootstrap, so
// both fail here rather than behave differently from Istio.
func istioMerge(t *testing.T, where string, dst, src map[string]any) {
	t.Helper()
	for k, v := range src {
		if k != "@type" && strings.ToLower(k) != k {
			t.Fatalf("%s: camelCase field %q is not implemented", where, k)
		}
		switch sv := v.(type) {
		case map[string]any:
			dv, ok := dst[k].(map[string]any)
			if !ok {
				if dst[k] != nil {
					t.Fatalf("%s: %s is not a message in the target", where, k)
				}
				dv = map[string]any{}
				dst[k] = dv
			}
			istioMerge(t, where+"."+k, dv, sv)
		case []any:
			dl, _ := dst[k].([]any)
			dst[k] = append(dl, istioClone(sv).([]any)...)
		default:
			if k == "@type" {
				if dst[k] != v {
					t.Fatalf("%s: @type %v merged into %v", where, v, dst[k])
				}
				continue
			}
			if v == nil || v == false || v == 0 || v == "" {
				t.Fatalf("%s: zero value for %s would not merge in Istio", where, k)
			}
			dst[k] = v
		}
	}
}

// istioClone deep-copies decoded YAML.
func istioClone(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = istioClone(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = istioClone(e)
		}
		return l
	default:
		return v
	}
}

// istioHCM is the typed_config of a listener's (chain's) first network filter.
func istioHCM(t *testing.T, bootstrap map[string]any, listener string, chain int) map[string]any {
	t.Helper()
	for _, l := range istioMap(t, "static_resources", bootstrap["static_resources"])["listeners"].([]any) {
		lis := istioMap(t, "listener", l)
		if lis["name"] == listener {
			fc := istioMap(t, "chain", lis["filter_chains"].([]any)[chain])
			return istioMap(t, "hcm", istioMap(t, "filter", fc["filters"].([]any)[0])["typed_config"])
		}
	}
	t.Fatalf("no listener %s", listener)
	return nil
}

func istioFilterNames(t *testing.T, hcm map[string]any) string {
	var names []string
	for _, h := range hcm["http_filters"].([]any) {
		names = append(names, fmt.Sprint(istioMap(t, "http filter", h)["name"]))
	}
	return strings.Join(names, ",")
}

const istioHCMType = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"

// istioHTTPFilters are the filters Istio's HCMs carry before the router,
// as upstream Envoy has them (Istio's own istio.* filters are not in it).
const istioHTTPFilters = `
          http_filters:
          - name: envoy.filters.http.grpc_stats
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig, emit_filter_state: true}
          - name: envoy.filters.http.fault
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}
          - name: envoy.filters.http.cors
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}`

func istioCluster(name, addr string, http2 bool) string {
	host, p, _ := net.SplitHostPort(addr)
	proto := ""
	if http2 {
		proto = `
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}`
	}
	return fmt.Sprintf(`
  - name: "%s"
    type: STATIC
    connect_timeout: 10s%s
    load_assignment:
      cluster_name: "%s"
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}]`,
		name, proto, name, host, p)
}

// istioGatewayBootstrap stands for what istiod sends the ingress gateway
// for a Gateway on port 8080 and a VirtualService routing on
// x-infergate-model (the listener binds a free port instead of 8080).
func istioGatewayBootstrap(extproc, poolA, poolB string) string {
	return `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  listeners:
  - name: 0.0.0.0_8080
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    traffic_direction: OUTBOUND
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": ` + istioHCMType + `
          stat_prefix: outbound_0.0.0.0_8080
          use_remote_address: true
          normalize_path: true
          path_with_escaped_slashes_action: KEEP_UNCHANGED` + istioHTTPFilters + `
          route_config:
            name: http.8080
            virtual_hosts:
            - name: "*:8080"
              domains: ["*"]
              routes:
              - name: pool-a
                match: {prefix: /, headers: [{name: x-infergate-model, string_match: {exact: pool-a}}]}
                route: {cluster: "outbound|8000||pool-a.models.svc.cluster.local", timeout: 0s}
              - name: pool-b
                match: {prefix: /, headers: [{name: x-infergate-model, string_match: {exact: pool-b}}]}
                route: {cluster: "outbound|8000||pool-b.models.svc.cluster.local", timeout: 0s}
  clusters:` +
		istioCluster(istioExtProcCluster, extproc, true) +
		istioCluster("outbound|8000||pool-a.models.svc.cluster.local", poolA, false) +
		istioCluster("outbound|8000||pool-b.models.svc.cluster.local", poolB, false) + "\n"
}

// istioInboundChain is one pod port's filter chain in virtualInbound.
func istioInboundChain(podPort int) string {
	return fmt.Sprintf(`
    - name: 0.0.0.0_%[1]d
      filter_chain_match: {destination_port: %[1]d}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": %[2]s
          stat_prefix: inbound_0.0.0.0_%[1]d
          normalize_path: true%[3]s
          route_config:
            name: "inbound|%[1]d||"
            virtual_hosts:
            - name: "inbound|http|%[1]d"
              domains: ["*"]
              routes:
              - name: default
                match: {prefix: /}
                route: {cluster: "inbound|%[1]d||", timeout: 0s}`, podPort, istioHCMType, istioHTTPFilters)
}

// istioSidecarBootstrap stands for what istiod sends the sidecar of a model
// server whose container serves port 8000 (the pool) and 9090 (another
// port; pool B stands in for it).
func istioSidecarBootstrap(extproc, poolA, poolB string) string {
	return `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  listeners:
  - name: virtualInbound
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    traffic_direction: INBOUND
    listener_filters:
    # Where Istio has original_dst: the original destination (the pod
    # port) comes in a PROXY header written by the test's "iptables".
    - name: envoy.filters.listener.proxy_protocol
      typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol}
    filter_chains:` + istioInboundChain(8000) + istioInboundChain(9090) + `
  - name: 0.0.0.0_8000
    address: {socket_address: {address: 0.0.0.0, port_value: 8000}}
    bind_to_port: false
    traffic_direction: OUTBOUND
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": ` + istioHCMType + `
          stat_prefix: outbound_0.0.0.0_8000` + istioHTTPFilters + `
          route_config:
            name: "8000"
            virtual_hosts:
            - name: pool-b.models.svc.cluster.local:8000
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route: {cluster: "outbound|8000||pool-b.models.svc.cluster.local", timeout: 0s}
  clusters:` +
		istioCluster(istioExtProcCluster, extproc, true) +
		istioCluster("inbound|8000||", poolA, false) +
		istioCluster("inbound|9090||", poolB, false) +
		istioCluster("outbound|8000||pool-b.models.svc.cluster.local", poolB, false) + "\n"
}

// istioRedirect stands for the pod's iptables REDIRECT to virtualInbound:
// clients connect to the returned URL as if to the pod's podPort, and
// Envoy's listener learns that port from a PROXY header.
func istioRedirect(t *testing.T, inbound string, podPort int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", inbound)
				if err != nil {
					return
				}
				defer u.Close()
				src := c.RemoteAddr().(*net.TCPAddr)
				if _, err := fmt.Fprintf(u, "PROXY TCP4 127.0.0.1 127.0.0.1 %d %d\r\n", src.Port, podPort); err != nil {
					return
				}
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

// istioListenerAddr asks Envoy's admin where a named listener bound.
func istioListenerAddr(t *testing.T, adminURL, name string) string {
	t.Helper()
	var out struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	resp, err := http.Get(adminURL + "/listeners?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := jsonDecode(resp, &out); err != nil {
		t.Fatal(err)
	}
	for _, l := range out.ListenerStatuses {
		if l.Name == name {
			return net.JoinHostPort(l.LocalAddress.SocketAddress.Address, fmt.Sprint(l.LocalAddress.SocketAddress.PortValue))
		}
	}
	t.Fatalf("Envoy has no listener %s", name)
	return ""
}

// istioProxyRun is a started Envoy modelling the proxy, and the URL a client
// uses to reach it (the gateway's listener, or the sidecar's pod port 8000).
type istioProxyRun struct {
	url       string
	bootstrap map[string]any
}

// istioStartProxy applies the chart's patches for the proxy and runs Envoy.
// With meterEndpoint set, the meter's filter is then pointed at a cluster of
// its own on that endpoint (a test-side change: in the chart both filters
// share the Service's cluster, so only an L7 failure of the meter's streams
// could leave the gate up; this models that one failure at L4).
func istioStartProxy(t *testing.T, proxy istioProxy, filters []istioEnvoyFilter, extproc, meterEndpoint string, poolA, poolB *gwPool, tweaks ...func(bootstrap map[string]any)) istioProxyRun {
	t.Helper()
	raw := istioSidecarBootstrap(extproc, poolA.Addr, poolB.Addr)
	if proxy.gateway {
		raw = istioGatewayBootstrap(extproc, poolA.Addr, poolB.Addr)
	}
	var bootstrap map[string]any
	if err := yaml.Unmarshal([]byte(raw), &bootstrap); err != nil {
		t.Fatalf("bootstrap: %v\n%s", err, raw)
	}
	// Fresh patches per proxy: applied counts are per application.
	var fresh []istioEnvoyFilter
	for _, f := range filters {
		g := f
		g.patches = nil
		for _, p := range f.patches {
			q := *p
			q.value = istioClone(p.value).(map[string]any)
			q.applied = 0
			g.patches = append(g.patches, &q)
		}
		fresh = append(fresh, g)
	}
	istioApply(t, proxy, bootstrap, istioSelect(t, proxy, fresh))
	if meterEndpoint != "" {
		const meterCluster = "outbound|50051||infergate-meter.llm.svc.cluster.local"
		n := 0
		for _, l := range istioMap(t, "static_resources", bootstrap["static_resources"])["listeners"].([]any) {
			for _, c := range istioMap(t, "listener", l)["filter_chains"].([]any) {
				for _, f := range istioMap(t, "chain", c)["filters"].([]any) {
					hcm := istioMap(t, "filter", f)["typed_config"].(map[string]any)
					hf, _ := hcm["http_filters"].([]any)
					for _, h := range hf {
						if hm := h.(map[string]any); hm["name"] == "infergate.meter" {
							gs := istioMap(t, "grpc_service", istioExtProcConfig(t, hm)["grpc_service"])
							istioMap(t, "envoy_grpc", gs["envoy_grpc"])["cluster_name"] = meterCluster
							n++
						}
					}
				}
			}
		}
		if n == 0 {
			t.Fatal("no infergate.meter filter to point elsewhere")
		}
		var extra []any
		if err := yaml.Unmarshal([]byte(istioCluster(meterCluster, meterEndpoint, true)), &extra); err != nil {
			t.Fatal(err)
		}
		sr := istioMap(t, "static_resources", bootstrap["static_resources"])
		sr["clusters"] = append(sr["clusters"].([]any), extra...)
	}
	for _, tweak := range tweaks {
		tweak(bootstrap)
	}
	out, err := yaml.Marshal(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	e := envoytest.Start(t, string(out))
	run := istioProxyRun{url: e.URL, bootstrap: bootstrap}
	if !proxy.gateway {
		run.url = istioRedirect(t, istioListenerAddr(t, e.AdminURL, "virtualInbound"), 8000)
	}
	return run
}

// istioExtProcConfig is an HTTP filter's ExternalProcessor config, inside
// the matcher a sidecar's filter may be wrapped in (skipped for the
// gateway's identity).
func istioExtProcConfig(t *testing.T, filter map[string]any) map[string]any {
	t.Helper()
	tc := istioMap(t, "typed_config", filter["typed_config"])
	if inner, ok := tc["extension_config"]; ok {
		tc = istioMap(t, "extension_config.typed_config", istioMap(t, "extension_config", inner)["typed_config"])
	}
	return tc
}

// The patched config itself: the filters in order before the router, the
// underscore rule, and nothing on what the patches' matches exclude.
func istioCheckPatched(t *testing.T, proxy istioProxy, bootstrap map[string]any) {
	t.Helper()
	const patched = "envoy.filters.http.grpc_stats,envoy.filters.http.fault,envoy.filters.http.cors,infergate.gate,infergate.usage,infergate.meter,envoy.filters.http.router"
	const untouched = "envoy.filters.http.grpc_stats,envoy.filters.http.fault,envoy.filters.http.cors,envoy.filters.http.router"
	type want struct {
		listener string
		chain    int
		filters  string
		drop     bool
	}
	wants := []want{{"0.0.0.0_8080", 0, patched, true}}
	if !proxy.gateway {
		wants = []want{
			{"virtualInbound", 0, patched, true},    // pod port 8000: the chart's portNumber
			{"virtualInbound", 1, untouched, false}, // pod port 9090
			{"0.0.0.0_8000", 0, untouched, false},   // outbound, same port number
		}
	}
	for _, w := range wants {
		hcm := istioHCM(t, bootstrap, w.listener, w.chain)
		if got := istioFilterNames(t, hcm); got != w.filters {
			t.Errorf("%s %s chain %d: http filters %s, want %s", proxy.name, w.listener, w.chain, got, w.filters)
		}
		opts, _ := hcm["common_http_protocol_options"].(map[string]any)
		if drop := opts["headers_with_underscores_action"] == "DROP_HEADER"; drop != w.drop {
			t.Errorf("%s %s chain %d: headers_with_underscores_action %v", proxy.name, w.listener, w.chain, opts["headers_with_underscores_action"])
		}
	}
}

func TestFailClosedIstioGateway(t *testing.T) { istioFailClosed(t, istioIngressGateway) }

func TestFailClosedIstioSidecar(t *testing.T) { istioFailClosed(t, istioModelSidecar) }

func istioFailClosed(t *testing.T, proxy istioProxy) {
	filters := istioEnvoyFilters(t)
	poolA, poolB := startGWPool(t), startGWPool(t)
	g := startInfergate(t, testConfig)
	gate := newGWEndpoint(t, g.ExtProcAddr)  // the Service's endpoint, as the chart wires it
	meter := newGWEndpoint(t, g.ExtProcAddr) // the meter's own, for the meter-down proxy
	mute, muteAddr := startGWMuteExtProc(t)

	exact := istioStartProxy(t, proxy, filters, gate.addr, "", poolA, poolB)
	istioCheckPatched(t, proxy, exact.bootstrap)
	split := istioStartProxy(t, proxy, filters, g.ExtProcAddr, meter.addr, poolA, poolB)

	// Up: a stream passes, gated and metered; a malformed request is the
	// gate's 400 and reaches no pool.
	gwExpectStream(t, proxy.name+", infergate up", exact.url, poolA, "pool-a", nil)
	var st Stamp
	testutil.Eventually(t, 5*time.Second, func() bool {
		for _, s := range g.stamps() {
			if s.Complete && s.CompletionTokens == 10 {
				st = s
				return true
			}
		}
		return false
	}, "the meter's stamp")
	// The meter names the pool by the cluster (README: in sidecars, Istio's
	// inbound cluster).
	wantPool := "inbound|8000||"
	if proxy.gateway {
		wantPool = "outbound|8000||pool-a.models.svc.cluster.local"
	}
	if st.Pool != wantPool || st.Decision != "allow" || st.Status != 200 {
		t.Errorf("%s: stamp %+v, want pool %s, allowed, 200", proxy.name, st, wantPool)
	}
	before := poolA.hits.Load() + poolB.hits.Load()
	if s, body, _, err := gwDo(exact.url, gwProbe{method: "POST", path: "/v1/chat/completions", body: `{"model":"pool-a",`}); err != nil || s != 400 || !strings.Contains(body, "invalid_json") {
		t.Errorf("malformed request: %d %q %v, want the gate's 400", s, body, err)
	}
	if poolA.hits.Load()+poolB.hits.Load() != before {
		t.Error("a malformed request reached a pool")
	}

	// The meter unreachable (the meter-down proxy): streams unaffected.
	gwExpectStream(t, proxy.name+", meter up (own cluster)", split.url, poolA, "pool-a", nil)
	for _, m := range gwFailures("meter", muteAddr) {
		meter.set(m.mode, m.target)
		gwExpectStream(t, proxy.name+", "+m.how, split.url, poolA, "pool-a", nil)
	}
	if mute.streams.Load() == 0 {
		t.Error("the mute gRPC server never got the meter's stream: the check did not run")
	}

	// The gate down: every route fails closed, no pool reached.
	var probes []gwProbe
	if proxy.gateway {
		probes = []gwProbe{
			{"no route until the gate sets one, chat stream", "POST", "/v1/chat/completions", chatBody("pool-a", 4, true, ""), nil},
			{"route pool-a (forged header), chat", "POST", "/v1/chat/completions", chatBody("pool-a", 4, false, ""),
				map[string]string{"x-infergate-model": "pool-a"}},
			{"route pool-b (forged header), completions", "POST", "/v1/completions", `{"model":"pool-b","prompt":"hi","max_tokens":2}`,
				map[string]string{"x-infergate-model": "pool-b"}},
			{"route pool-b (forged header), GET /v1/models", "GET", "/v1/models", "", map[string]string{"x-infergate-model": "pool-b"}},
		}
	} else {
		probes = []gwProbe{
			{"inbound|8000||, chat stream", "POST", "/v1/chat/completions", chatBody("pool-a", 4, true, ""), nil},
			{"inbound|8000||, completions", "POST", "/v1/completions", `{"model":"pool-a","prompt":"hi","max_tokens":2}`, nil},
			{"inbound|8000||, GET /v1/models", "GET", "/v1/models", "", nil},
			{"inbound|8000||, another path", "POST", "/v2/anything", `{}`, map[string]string{"x-infergate-model": "pool-a"}},
		}
	}
	for _, down := range gwFailures("gate", muteAddr) {
		gate.set(down.mode, down.target)
		accepted, streams := gate.accepted.Load(), mute.streams.Load()
		gwExpectClosed(t, proxy.name+", "+down.how, exact.url, gwStatusTimeout, "gate_unavailable", probes, poolA, poolB)
		// The failure must have been met, not routed around.
		if reached := gate.accepted.Load() > accepted; down.mode == gwMute && !reached ||
			down.mode == gwForward && mute.streams.Load() == streams {
			t.Errorf("%s: Envoy never reached the endpoint: the check did not run", down.how)
		}
	}
	g.Stop(t)
	gate.set(gwRefuse, "")
	gwExpectClosed(t, proxy.name+", infergate stopped", exact.url, gwStatusOnError, "gate_unavailable", probes, poolA, poolB)
}

// istioDocs decodes every YAML document of a file under the repository.
func istioDocs(t *testing.T, rel string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []map[string]any
	dec := yaml.NewDecoder(f)
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}
