package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// istioVersion is the istio.io/istio the tests run: master at VERSION 1.31,
// the newest the module proxy serves that builds (its release tags are
// refused; release-1.30's pseudo-version names a dependency the proxy does
// not serve). scripts/install-test-deps.sh builds it; keep the two equal.
const istioVersion = "v0.0.0-20260827124520-eed52ebb66ad"

const (
	istioNS      = "istio-system"
	modelsNS     = "models"
	gatewaySA    = "istio-ingressgateway-service-account" // the chart's default gatewayIdentities
	modelSA      = "vllm"                                 // ci/istio-values.yaml's sidecarIdentities
	istioRouter  = "envoy.filters.http.router"
	istioGateway = "llm-gateway"
)

// istioBinDir is where scripts/install-test-deps.sh built pilot-discovery
// and pilot-agent at istioVersion.
func istioBinDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("ISTIO_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(repoRoot, ".tools", "bin", "istio-"+istioVersion)
	}
	if !strings.HasSuffix(filepath.Clean(dir), "istio-"+istioVersion) {
		t.Fatalf("ISTIO_BIN_DIR=%s is not istio %s's: run scripts/install-test-deps.sh", dir, istioVersion)
	}
	for _, bin := range []string{"pilot-discovery", "pilot-agent"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			t.Fatalf("istio is not built (%v): run scripts/install-test-deps.sh, or set ISTIO_BIN_DIR", err)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// The chart's Istio variant under a real istiod: istiod (built from the
// pinned module) watches the real API server, with Istio's own CRDs, and
// generates the config of the mesh's ingress gateway and of a model
// server's sidecar, both the pinned upstream Envoy under pilot-agent (its
// bootstrap, its certificates from istiod's CA over SDS). The chart's
// EnvoyFilters land right before the router in both; a request the
// gateway routes to the model server over Istio's mutual TLS is gated and
// metered once (the sidecar skips it on the gateway's proven identity);
// a request straight to the sidecar meets the gate there; without a key
// both refuse; a stream passes byte-exact and incrementally through both
// proxies; the SLA controller's weights, written into the gateway's
// VirtualService, reach the gateway's route through istiod and move a
// model between two pools; with infergate down the gateway fails closed.
//
// Upstream Envoy lacks three Istio-only extensions, turned off in istiod:
// metadata exchange, the ALPN filter and the istio.stats filter (no
// metrics provider in the mesh config). No iptables: the gateway binds a
// loopback address, the sidecar's inbound port is a Sidecar resource's
// ingress listener with capture mode NONE (docs/deploy/istio.md).
func TestIstioMesh(t *testing.T) {
	start := time.Now()
	bins := istioBinDir(t)
	c := startCluster(t)
	for _, ns := range []string{istioNS, modelsNS, llmNS} {
		c.createNamespace(t, ns)
	}
	ist := startIstiod(t, c, bins)
	t.Logf("istiod ready at %v", time.Since(start).Round(time.Millisecond))

	// The model server: a pod (stored; nothing runs it) with the sidecar's
	// labels and service account, behind Service vllm; the mock on
	// loopback is the container the sidecar forwards to.
	mock := startLoopbackMock(t)
	inbound := freePort(t)
	applyYAML(t, c, fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: %[2]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: %[3]s, namespace: %[4]s}
---
apiVersion: v1
kind: Service
metadata: {name: vllm, namespace: %[2]s}
spec:
  selector: {app.kubernetes.io/name: vllm}
  ports: [{name: http, port: 8000, targetPort: %[5]d}]
`, modelSA, modelsNS, gatewaySA, istioNS, inbound))
	podIP := hostIP(t)
	c.createMeshPod(t, modelsNS, "vllm-0", podIP, modelSA, map[string]string{"app.kubernetes.io/name": "vllm", "security.istio.io/tlsMode": "istio"})
	applyYAML(t, c, fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: vllm-0, namespace: %[1]s, labels: {kubernetes.io/service-name: vllm}}
addressType: IPv4
endpoints:
- addresses: [%[2]s]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: vllm-0, namespace: %[1]s}
ports: [{name: http, port: %[3]d, protocol: TCP}]
`, modelsNS, podIP, inbound))

	// The chart's Istio variant, installed with Helm; the sidecar's
	// inbound port is the one the model server listens on here.
	vals := ciValues(t, "istio")
	vals["apiKeys"] = ciValues(t, "envoygateway")["apiKeys"]
	nested[map[string]any](vals, "istio", "sidecar")["portNumber"] = inbound
	// The SLA controller: llama-3-70b's primary pool is vllm-a, its backup
	// vllm-b (destinations of the VirtualService, by host); it writes the
	// weights into that VirtualService through the API. A breached pool
	// keeps the smallest probe weight, 1.
	cfg, _ := vals["config"].(map[string]any)
	if cfg == nil {
		cfg = map[string]any{}
		vals["config"] = cfg
	}
	cfg["virtualModels"] = []any{map[string]any{
		"name": slaModel,
		"pools": []any{
			map[string]any{"cluster": poolHost("vllm-a"), "priority": 0},
			map[string]any{"cluster": poolHost("vllm-b"), "priority": 1},
		},
		"sla":    map[string]any{"ttftP95": "150ms"},
		"tuning": map[string]any{"window": "2s", "minSamples": 6, "interval": "250ms", "step": 50, "cooldown": "60s", "probeWeight": 1},
	}}
	cfg["weightSink"] = map[string]any{"type": "virtualService", "virtualService": map[string]any{"namespace": istioNS, "name": "llm"}}
	rel, err := c.helmInstall(t, llmNS, relName, vals)
	if err != nil {
		t.Fatalf("helm install (istio variant): %v", err)
	}
	objs := decodeObjects(t, []byte(rel.Manifest))
	for _, name := range []string{relName + "-gateway", relName + "-sidecar"} {
		find(t, objs, "EnvoyFilter", name)
	}

	// The gateway on loopback, routing llm.example.com to the model
	// server, and llama-3-70b by the SLA controller's weights to two pools
	// (ServiceEntries of mocks on loopback, plain HTTP: no sidecar); the
	// model server's inbound listener without iptables.
	pools := map[string]*mockPool{"vllm-a": startLoopbackMock(t), "vllm-b": startLoopbackMock(t)}
	for name, m := range pools {
		applyYAML(t, c, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  hosts: [%[3]s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8000, name: http, protocol: HTTP, targetPort: %[4]d}]
  endpoints: [{address: 127.0.0.1}]
`, name, modelsNS, poolHost(name), m.port))
	}
	gwPort := freePort(t)
	applyYAML(t, c, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: %[3]d, name: http, protocol: HTTP}
    bind: 127.0.0.1
    hosts: ["*/%[4]s"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: llm, namespace: %[2]s}
spec:
  hosts: [%[4]s]
  gateways: [%[1]s]
  http:
  - match: [{headers: {x-infergate-model: {exact: %[10]s}}}]
    route:
    - destination: {host: %[11]s, port: {number: 8000}}
      weight: 100
    - destination: {host: %[12]s, port: {number: 8000}}
      weight: 0
  - route:
    - destination: {host: vllm.%[5]s.svc.cluster.local, port: {number: 8000}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: vllm, namespace: %[5]s}
spec:
  workloadSelector: {labels: {app.kubernetes.io/name: vllm}}
  ingress:
  - port: {number: %[6]d, name: http, protocol: HTTP}
    bind: %[7]s
    captureMode: NONE
    defaultEndpoint: 127.0.0.1:%[8]d
  egress:
  - hosts: ["%[9]s/*"]
`, istioGateway, istioNS, gwPort, llmHost, modelsNS, inbound, podIP, mock.port, llmNS, slaModel, poolHost("vllm-a"), poolHost("vllm-b")))
	ig := startInfergateFromRelease(t, c, objs)
	applyEndpoints(t, c, relName, map[string]int{"grpc-extproc": ig.extproc, "http-admin": ig.admin, "grpc-xds": ig.xds})

	gw := startPilotAgent(t, c, bins, ist, meshProxy{kind: "router", ns: istioNS, name: "istio-ingressgateway-0", sa: gatewaySA, ip: "127.0.0.1",
		labels: map[string]string{"istio": "ingressgateway"}})
	sc := startPilotAgent(t, c, bins, ist, meshProxy{kind: "sidecar", ns: modelsNS, name: "vllm-0", sa: modelSA, ip: podIP,
		labels: map[string]string{"app.kubernetes.io/name": "vllm", "security.istio.io/tlsMode": "istio"}})
	gwURL := "http://127.0.0.1:" + strconv.Itoa(gwPort)
	scURL := "http://" + net.JoinHostPort(podIP, strconv.Itoa(inbound))
	t.Logf("mesh ready at %v", time.Since(start).Round(time.Millisecond))

	t.Run("EnvoyFiltersBeforeTheRouter", func(t *testing.T) {
		for _, p := range []struct {
			what  string
			admin string
			port  int
		}{{"gateway", gw, gwPort}, {"sidecar", sc, inbound}} {
			chains := httpFilterChains(t, p.admin, p.port)
			if len(chains) == 0 {
				t.Fatalf("%s: no HTTP connection manager on port %d in istiod's config", p.what, p.port)
			}
			for _, names := range chains {
				if len(names) < 4 || !slices.Equal(names[len(names)-4:], []string{"infergate.gate", "infergate.usage", "infergate.meter", istioRouter}) {
					t.Errorf("%s's HTTP filters on port %d: %v, want … infergate.gate → infergate.usage → infergate.meter → router", p.what, p.port, names)
				}
			}
			t.Logf("%s: %v", p.what, chains[0])
		}
	})

	// Istio's gateway gives each request from outside an x-request-id of
	// its own: a request is told by its model's name.
	t.Run("GatewayToSidecarGatedOnce", func(t *testing.T) {
		code, body := postModel(t, gwURL, "istio-gw-1", withKey)
		if code != http.StatusOK {
			t.Fatalf("through the gateway with a key: %d %s", code, body)
		}
		// One log line: the gate and the meter ran once (stamp fails on two).
		st := ig.stamp(t, "the gateway's request", func(l logLine) bool { return l.Model == "istio-gw-1" })
		if st.Decision != "allow" || st.Tenant != "acme" || !st.Complete {
			t.Errorf("stamp %+v, want allow for acme, settled on the pool's usage", st)
		}
		if n := mock.served(t); n != 1 {
			t.Errorf("the model server answered %d requests, want 1", n)
		}
		// The hop was Istio's mutual TLS, the gateway's SPIFFE identity proven.
		if n := sumStats(t, gw, `^cluster\.outbound\|8000\|\|vllm\..*\.ssl\.handshake$`); n == 0 {
			t.Errorf("the gateway's cluster of the model server made no TLS handshake:\n%s", get(t, gw+"/stats?filter=ssl"))
		}
		if n := sumStats(t, sc, `^listener\..*\.ssl\.handshake$`); n == 0 {
			t.Errorf("the sidecar's inbound listener made no TLS handshake:\n%s", get(t, sc+"/stats?filter=ssl"))
		}
		if code, body := post(t, gwURL, nil); code != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
			t.Errorf("through the gateway without a key: %d %s, want the gate's 401", code, body)
		}
	})

	t.Run("StraightToTheSidecar", func(t *testing.T) {
		if code, body := post(t, scURL, nil); code != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
			t.Errorf("to the sidecar without a key: %d %s, want its gate's 401", code, body)
		}
		code, body := postModel(t, scURL, "istio-sc-1", withKey)
		if code != http.StatusOK {
			t.Fatalf("to the sidecar with a key: %d %s", code, body)
		}
		if st := ig.stamp(t, "the sidecar's request", func(l logLine) bool { return l.Model == "istio-sc-1" }); st.Decision != "allow" || st.Tenant != "acme" {
			t.Errorf("stamp %+v, want the sidecar's gate's allow for acme", st)
		}
	})

	t.Run("StreamThroughBothProxies", func(t *testing.T) {
		// In lock step with the model server (x-mock-lockstep, acknowledged
		// over its HTTP port): it writes event k+1 only once the client has
		// event k, so a proxy that held events back would stall the stream.
		// The client asked for no usage: the gateway's usage filter removes
		// the usage event the gate asked the pool for, which the mock then
		// acknowledges itself (x-mock-lockstep-unseen).
		hdr := map[string]string{"authorization": "Bearer " + apiKey, "x-mock-ttft-ms": "60", "x-mock-itl-ms": "15",
			"x-mock-lockstep": "istio-stream-1", "x-mock-lockstep-unseen": "usage"}
		events := 0
		got := streamChatEach(t, gwURL, chatBody("istio-stream-1", 8, true, ""), hdr, func() {
			resp, err := http.Post(fmt.Sprintf("http://%s/mock/lockstep/istio-stream-1/ack?n=%d", mock.addr, events), "", nil)
			if err != nil {
				t.Fatalf("acknowledging event %d: %v", events, err)
			}
			resp.Body.Close()
			events++
		})
		if got.status != http.StatusOK {
			t.Fatalf("stream through the gateway: %d %s", got.status, got.body)
		}
		direct := streamChat(t, "http://"+mock.addr, chatBody("istio-stream-1", 8, true, `,"stream_options":{"include_usage":true}`),
			map[string]string{"x-mock-ttft-ms": "0", "x-mock-itl-ms": "0"})
		if want := unasked(t, direct.body); !bytes.Equal(got.body, want) {
			t.Errorf("through gateway and sidecar:\n%q\nwant the model server's own, less the usage event:\n%q", got.body, want)
		}
		st := ig.stamp(t, "the stream", func(s logLine) bool { return s.Model == "istio-stream-1" })
		if st.Decision != "allow" || st.CompletionTokens != 8 || !st.Complete {
			t.Errorf("stamp %+v, want allow, 8 completion tokens, complete", st)
		}
	})

	// The SLA controller's weights, as Istio users route: vllm-a slows past
	// its SLA; the controller, reading the gateway meter's observations
	// (Istio's cluster named back to the destination's host), writes the
	// VirtualService through the API; istiod turns it into the gateway's
	// route, and traffic follows.
	t.Run("SLAWeightsThroughTheVirtualService", func(t *testing.T) {
		a, b := poolHost("vllm-a"), poolHost("vllm-b")
		if w := virtualServiceWeights(t, c); w[a] != 100 || w[b] != 0 {
			t.Fatalf("the VirtualService's weights before: %v, want all on %s", w, a)
		}
		if w := gatewayRouteWeights(t, gw, slaModel); w[a] != 100 || len(w) != 1 {
			t.Fatalf("the gateway's route for %s before: %v, want all on %s", slaModel, w, a)
		}
		if na, nb := slaBatch(t, gwURL, pools, 10); na != 10 || nb != 0 {
			t.Fatalf("before the slowdown: vllm-a %d, vllm-b %d of 10, want all on vllm-a", na, nb)
		}
		// Load: streams whose first token vllm-a now takes 400 ms to send.
		pools["vllm-a"].control(t, `{"ttft_ms": 400}`)
		stop := paceLoad(t, t.Context(), gwURL, slaModel)
		defer stop()
		// The deadlines are guards: what moves the weights is the meter's
		// observations of vllm-a's first tokens.
		var w map[string]int64
		testutil.Eventually(t, 30*time.Second, func() bool {
			w = virtualServiceWeights(t, c)
			return w[a] <= 1 && w[b] >= 99
		}, "the controller to move "+slaModel+"'s weight to vllm-b in the VirtualService")
		stop()
		if !writtenByController(t, c) {
			t.Error("the VirtualService's managedFields show no update by infergate-controller (the release's service account)")
		}
		var route map[string]int64
		testutil.Eventually(t, 30*time.Second, func() bool {
			route = gatewayRouteWeights(t, gw, slaModel)
			return maps.Equal(route, w)
		}, "istiod to give the gateway the VirtualService's new weights")
		t.Logf("the gateway's route for %s: %v", slaModel, route)
		// vllm-a keeps its probe weight: 4 or more of 20 there is a
		// 1-in-20,000 chance.
		if na, nb := slaBatch(t, gwURL, pools, 20); na > 3 || na+nb != 20 {
			t.Errorf("after the move: vllm-a %d, vllm-b %d of 20, want (nearly) all on vllm-b", na, nb)
		}
		// The meter names the pool as the configuration does: Istio's
		// cluster (outbound|8000||host) back to the destination's host.
		byPool := map[string]int{}
		for _, line := range strings.Split(ig.requests.String(), "\n") {
			var l logLine
			if json.Unmarshal([]byte(line), &l) == nil && l.Model == slaModel {
				byPool[l.Pool]++
			}
		}
		if byPool[a] == 0 || byPool[b] == 0 || len(byPool) != 2 {
			t.Errorf("request log lines of %s by pool: %v, want both pools by host", slaModel, byPool)
		}
		t.Logf("request log lines of %s by pool: %v", slaModel, byPool)
	})

	t.Run("FailClosed", func(t *testing.T) {
		ig.proc.Stop()
		for _, p := range []struct{ what, url string }{{"gateway", gwURL}, {"sidecar", scURL}} {
			code, body := post(t, p.url, withKey)
			if code != http.StatusServiceUnavailable || !strings.Contains(body, `"gate_unavailable"`) {
				t.Errorf("%s with infergate down: %d %s, want 503 gate_unavailable", p.what, code, body)
			}
		}
	})
	t.Logf("done at %v", time.Since(start).Round(time.Millisecond))
}

// sumStats is the sum of the counters filter selects in Envoy's admin.
func sumStats(t *testing.T, admin, filter string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(get(t, admin+"/stats?filter="+url.QueryEscape(filter)), "\n") {
		if _, v, ok := strings.Cut(line, ": "); ok {
			i, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("stat %q", line)
			}
			n += i
		}
	}
	return n
}

// postModel sends a one-token chat completion for model and returns the
// status and body.
func postModel(t *testing.T, base, model string, hdr map[string]string) (int, string) {
	t.Helper()
	resp, err := chat(base, model, 1, false, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// httpFilterChains is the HTTP filter names of every HTTP connection
// manager on port in the listeners istiod sent the Envoy at admin.
func httpFilterChains(t *testing.T, admin string, port int) [][]string {
	t.Helper()
	// With ?resource=, each config is one DynamicListener.
	var dump struct {
		Configs []struct {
			Name        string `json:"name"`
			ActiveState struct {
				Listener struct {
					Address struct {
						SocketAddress struct {
							PortValue int `json:"port_value"`
						} `json:"socket_address"`
					} `json:"address"`
					FilterChains []struct {
						Filters []struct {
							Name        string `json:"name"`
							TypedConfig struct {
								HTTPFilters []struct {
									Name string `json:"name"`
								} `json:"http_filters"`
							} `json:"typed_config"`
						} `json:"filters"`
					} `json:"filter_chains"`
				} `json:"listener"`
			} `json:"active_state"`
		} `json:"configs"`
	}
	if err := json.Unmarshal([]byte(get(t, admin+"/config_dump?resource=dynamic_listeners")), &dump); err != nil {
		t.Fatalf("config_dump: %v", err)
	}
	var chains [][]string
	var listeners []string
	for _, l := range dump.Configs {
		listeners = append(listeners, l.Name)
		if l.ActiveState.Listener.Address.SocketAddress.PortValue != port {
			continue
		}
		for _, fc := range l.ActiveState.Listener.FilterChains {
			for _, f := range fc.Filters {
				if f.Name != "envoy.filters.network.http_connection_manager" {
					continue
				}
				var names []string
				for _, h := range f.TypedConfig.HTTPFilters {
					names = append(names, h.Name)
				}
				chains = append(chains, names)
			}
		}
	}
	if len(chains) == 0 {
		t.Logf("listeners at %s: %v", admin, listeners)
	}
	return chains
}

// istiod is where pilot-discovery serves its TLS port: xDS and its CA, which
// signs the proxies' certificates (a pod reaches it as
// istiod.istio-system.svc:15012, the name its certificate carries).
type istiod struct{ tls string }

// startIstiod runs pilot-discovery against the cluster, Istio's CRDs (the
// module's manifests/charts/base) installed first, and waits for its CA's
// root to be published in the namespaces.
func startIstiod(t *testing.T, c *cluster, bins string) istiod {
	t.Helper()
	// Istio's own CRDs replace the istio.io/api release's the harness installed.
	for _, obj := range readObjects(t, filepath.Join(moduleDir(t, "istio.io/istio@"+istioVersion), "manifests/charts/base/files/crd-all.gen.yaml")) {
		if err := c.apply(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	// No metrics provider: istiod would add the istio.stats filter, which
	// upstream Envoy does not have.
	mesh := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(mesh, []byte("trustDomain: cluster.local\nrootNamespace: "+istioNS+"\nenableAutoMtls: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ist istiod
	serveOnFreePorts(t, "istiod", 6, 60*time.Second, nil, func(ports []int) (*exec.Cmd, string) {
		addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
		ist = istiod{tls: addr(2)}
		cmd := exec.Command(filepath.Join(bins, "pilot-discovery"), "discovery",
			"--kubeconfig", c.kubeconfig, "--meshConfig", mesh, "--networksConfig", filepath.Join(dir, "none"),
			"--httpAddr", addr(0), "--grpcAddr", addr(1), "--secureGRPCAddr", addr(2), "--monitoringAddr", addr(3),
			"--httpsAddr", addr(4), "--ctrlz_port", strconv.Itoa(ports[5]), "--domain", "cluster.local",
			"--log_output_level", "default:warn")
		cmd.Dir = dir
		// The three settings upstream Envoy needs (docs/deploy/istio.md),
		// and no webhooks or Gateway API controllers (nothing serves them).
		return withEnv(cmd, "POD_NAMESPACE="+istioNS, "POD_NAME=istiod-0", "REVISION=default", "CLUSTER_ID=Kubernetes",
				"JWT_POLICY=third-party-jwt", "PILOT_CERT_PROVIDER=istiod",
				"PILOT_ENABLE_METADATA_EXCHANGE=false", "PILOT_ENABLE_ALPN_FILTER=false",
				"INJECTION_WEBHOOK_CONFIG_NAME=", "VALIDATION_WEBHOOK_CONFIG_NAME=",
				"PILOT_ENABLE_GATEWAY_API=false", "PILOT_ENABLE_GATEWAY_API_STATUS=false",
				"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false", "PILOT_ENABLE_GATEWAY_API_GATEWAYCLASS_CONTROLLER=false"),
			"http://" + addr(0) + "/ready"
	})
	// The CA's root, published once istiod's namespace controller runs.
	testutil.Eventually(t, 60*time.Second, func() bool {
		for _, ns := range []string{istioNS, modelsNS} {
			if _, err := c.kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "istio-ca-root-cert", metav1.GetOptions{}); err != nil {
				return false
			}
		}
		return true
	}, "istiod to publish its root certificate (istio-ca-root-cert)")
	return ist
}

// meshProxy is one Envoy of the mesh, as a pod's pilot-agent would run it.
type meshProxy struct {
	kind, ns, name, sa, ip string
	labels                 map[string]string
}

// startPilotAgent runs pilot-agent with the pinned upstream Envoy for p,
// as the injected container does: Istio's bootstrap template, a service
// account token for istiod's CA (audience istio-ca) and the CA's root, in
// its working directory. It returns Envoy's admin URL once the agent
// reports the proxy ready (config received).
func startPilotAgent(t *testing.T, c *cluster, bins string, ist istiod, p meshProxy) string {
	t.Helper()
	dir := t.TempDir()
	write := func(rel string, b []byte) {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := os.ReadFile(filepath.Join(moduleDir(t, "istio.io/istio@"+istioVersion), "tools/packaging/common/envoy_bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	write("var/lib/istio/envoy/envoy_bootstrap_tmpl.json", tmpl)
	expiry := int64(3600)
	tok, err := c.kube.CoreV1().ServiceAccounts(p.ns).CreateToken(t.Context(), p.sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", p.ns, p.sa, err)
	}
	write("var/run/secrets/tokens/istio-token", []byte(tok.Status.Token))
	root, err := c.kube.CoreV1().ConfigMaps(p.ns).Get(t.Context(), "istio-ca-root-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write("var/run/secrets/istio/root-cert.pem", []byte(root.Data["root-cert.pem"]))
	labels, _ := json.Marshal(p.labels)
	var admin int
	serveOnFreePorts(t, "pilot-agent "+p.kind, 4, 60*time.Second, nil, func(ports []int) (*exec.Cmd, string) {
		admin = ports[0]
		pc, _ := json.Marshal(map[string]any{
			"binaryPath": envoytest.Binary(t), "configPath": filepath.Join(dir, "etc/istio/proxy"),
			"proxyBootstrapTemplatePath": filepath.Join(dir, "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"),
			"discoveryAddress":           ist.tls, "controlPlaneAuthPolicy": "MUTUAL_TLS",
			"proxyAdminPort": ports[0], "statusPort": ports[1], "drainDuration": "1s", "terminationDrainDuration": "1s",
			// Istio keeps few of Envoy's stats; the TLS handshakes are evidence.
			"proxyStatsMatcher": map[string]any{"inclusionSuffixes": []string{"ssl.handshake"}},
		})
		cmd := exec.Command(filepath.Join(bins, "pilot-agent"), "proxy", p.kind, "--proxyLogLevel", "warning", "--log_output_level", "default:warn")
		cmd.Dir = dir
		return withEnv(cmd, "PROXY_CONFIG="+string(pc), "POD_NAME="+p.name, "POD_NAMESPACE="+p.ns, "INSTANCE_IP="+p.ip,
				"SERVICE_ACCOUNT="+p.sa, "ISTIO_META_CLUSTER_ID=Kubernetes", "ISTIO_METAJSON_LABELS="+string(labels),
				"ISTIOD_SAN=istiod."+istioNS+".svc", "JWT_POLICY=third-party-jwt", "PILOT_CERT_PROVIDER=istiod",
				"ENVOY_STATUS_PORT="+strconv.Itoa(ports[2]), "ENVOY_PROMETHEUS_PORT="+strconv.Itoa(ports[3])),
			fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", ports[1])
	})
	return "http://127.0.0.1:" + strconv.Itoa(admin)
}

// createMeshPod stores a pod of the mesh: Running, Ready, at ip, with
// labels and service account (nothing runs it; the pilot-agent the test
// starts is its sidecar).
func (c *cluster) createMeshPod(t *testing.T, ns, name, ip, sa string, labels map[string]string) {
	t.Helper()
	c.createPod(t, ns, name, ip, sa, labels)
}

// startLoopbackMock is `infergate-bench mock` on loopback, where a Sidecar's
// defaultEndpoint forwards.
func startLoopbackMock(t *testing.T) *mockPool {
	t.Helper()
	m := &mockPool{}
	serveOnFreePorts(t, "mock", 1, 15*time.Second, nil, func(ports []int) (*exec.Cmd, string) {
		m.port = ports[0]
		m.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
		return exec.Command(benchBin(t), "mock", "--listen", m.addr, "--ttft", "50ms", "--itl", "10ms"), "http://" + m.addr + "/healthz"
	})
	return m
}

// slaModel is the virtual model the SLA controller routes in the mesh.
const slaModel = "llama-3-70b"

// poolHost is the host of a pool's ServiceEntry.
func poolHost(name string) string { return name + "." + modelsNS + ".svc.cluster.local" }

// virtualServiceWeights is the weights of slaModel's route in the gateway's
// VirtualService, by destination host.
func virtualServiceWeights(t *testing.T, c *cluster) map[string]int64 {
	t.Helper()
	obj, err := c.dyn.Resource(virtualServices).Namespace(istioNS).Get(t.Context(), "llm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, h := range nested[[]any](obj.Object, "spec", "http") {
		h := h.(map[string]any)
		for _, m := range nested[[]any](h, "match") {
			if nested[string](m.(map[string]any), "headers", "x-infergate-model", "exact") != slaModel {
				continue
			}
			for _, d := range nested[[]any](h, "route") {
				d := d.(map[string]any)
				out[nested[string](d, "destination", "host")] = num(d["weight"])
			}
		}
	}
	return out
}

// writtenByController reports whether the controller, as the release's
// service account, has updated the gateway's VirtualService.
func writtenByController(t *testing.T, c *cluster) bool {
	t.Helper()
	obj, err := c.dyn.Resource(virtualServices).Namespace(istioNS).Get(t.Context(), "llm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range obj.GetManagedFields() {
		if f.Manager == "infergate-controller" && f.Operation == metav1.ManagedFieldsOperationUpdate {
			return true
		}
	}
	return false
}

// gatewayRouteWeights is the weights, by host, of the route istiod gave
// the gateway for model (matching x-infergate-model exactly), read from
// Envoy's config_dump: a weighted_clusters route, or one cluster (Istio
// drops destinations of weight 0) at 100.
func gatewayRouteWeights(t *testing.T, admin, model string) map[string]int64 {
	t.Helper()
	type weighted struct {
		Name   string `json:"name"`
		Weight int64  `json:"weight"`
	}
	type headerMatch struct {
		Name        string `json:"name"`
		StringMatch struct {
			Exact string `json:"exact"`
		} `json:"string_match"`
	}
	var dump struct {
		Configs []struct {
			RouteConfig struct {
				VirtualHosts []struct {
					Routes []struct {
						Match struct {
							Headers []headerMatch `json:"headers"`
						} `json:"match"`
						Route struct {
							Cluster          string `json:"cluster"`
							WeightedClusters struct {
								Clusters []weighted `json:"clusters"`
							} `json:"weighted_clusters"`
						} `json:"route"`
					} `json:"routes"`
				} `json:"virtual_hosts"`
			} `json:"route_config"`
		} `json:"configs"`
	}
	if err := json.Unmarshal([]byte(get(t, admin+"/config_dump?resource=dynamic_route_configs")), &dump); err != nil {
		t.Fatalf("config_dump: %v", err)
	}
	host := func(c string) string { f := strings.Split(c, "|"); return f[len(f)-1] }
	for _, rc := range dump.Configs {
		for _, vh := range rc.RouteConfig.VirtualHosts {
			for _, r := range vh.Routes {
				if !slices.ContainsFunc(r.Match.Headers, func(h headerMatch) bool {
					return h.Name == "x-infergate-model" && h.StringMatch.Exact == model
				}) {
					continue
				}
				out := map[string]int64{}
				if r.Route.Cluster != "" {
					out[host(r.Route.Cluster)] = 100
				}
				for _, c := range r.Route.WeightedClusters.Clusters {
					out[host(c.Name)] = c.Weight
				}
				return out
			}
		}
	}
	return nil
}

// slaBatch sends n non-streamed requests for slaModel through the gateway,
// one after the other, and counts which pool served them.
func slaBatch(t *testing.T, gw string, pools map[string]*mockPool, n int) (a, b int) {
	t.Helper()
	a0, b0 := pools["vllm-a"].served(t), pools["vllm-b"].served(t)
	for range n {
		code, body := postModel(t, gw, slaModel, map[string]string{"authorization": "Bearer " + apiKey, "x-mock-ttft-ms": "1"})
		if code != http.StatusOK {
			t.Fatalf("%s through the gateway: %d %s", slaModel, code, body)
		}
	}
	return pools["vllm-a"].served(t) - a0, pools["vllm-b"].served(t) - b0
}
