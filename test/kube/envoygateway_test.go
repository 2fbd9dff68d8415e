package kube

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

var endpointSlices = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

const (
	egNamespace = "envoy-gateway-system"
	llmNS       = "llm"
	relName     = "infergate"
	apiKey      = "test" // sha256 9f86d0… in ci/envoygateway-values.yaml
	llmHost     = "llm.example.com"
)

func egGVR(res string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "gateway.envoyproxy.io", Version: "v1alpha1", Resource: res}
}

// Envoy Gateway v1.9.1 in Kubernetes mode, watching the real API server:
// the chart's HTTPRoute and EnvoyExtensionPolicy go through the API (schema
// and CEL), EG translates them, and the pinned Envoy runs EG's own bootstrap
// (from the Deployment EG created; no kubelet runs it) against EG's xDS
// server. A stream passes byte-exact and incrementally through gate and
// meter to the pool; a keyless request is refused by the gate; the SLA
// controller moves a model's weight away from a slow pool by updating the
// HTTPRoute through the API, and traffic follows once EG re-translates.
func TestEnvoyGatewayKubernetesMode(t *testing.T) {
	start := time.Now()
	c := startCluster(t)
	ctx := t.Context()
	c.createNamespace(t, egNamespace)
	startEnvoyGateway(t, c)

	// The pools, as local mocks, and infergate's release.
	mocks := map[string]*mockPool{}
	for _, name := range []string{"vllm-a100", "vllm-h100", "sglang-l4"} {
		mocks[name] = startMock(t, name)
	}
	gwPort := freePort(t)
	applyGateway(t, c, gwPort)

	vals := ciValues(t, "envoygateway")
	cfg := vals["config"].(map[string]any)
	// The SLA controller: llama-3-70b's primary pool is vllm-a100; it
	// writes its weights to the chart's HTTPRoute through the API.
	cfg["virtualModels"] = []any{map[string]any{
		"name": "llama-3-70b",
		"pools": []any{
			map[string]any{"cluster": "vllm-a100", "priority": 0},
			map[string]any{"cluster": "vllm-h100", "priority": 1},
		},
		"sla":    map[string]any{"ttftP95": "150ms"},
		"tuning": map[string]any{"window": "2s", "minSamples": 6, "interval": "250ms", "step": 50, "cooldown": "60s", "probeWeight": 2},
	}}
	cfg["weightSink"] = map[string]any{"type": "httpRoute", "httpRoute": map[string]any{"namespace": llmNS, "name": relName}}
	rel, err := c.helmInstall(t, llmNS, relName, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	objs := decodeObjects(t, []byte(rel.Manifest))
	route := find(t, objs, "HTTPRoute", relName)

	// No kubelet: the Services' endpoints are local processes.
	for _, rule := range nested[[]any](route.Object, "spec", "rules") {
		for _, ref := range nested[[]any](rule.(map[string]any), "backendRefs") {
			r := ref.(map[string]any)
			name := r["name"].(string)
			m := mocks[name]
			if m == nil {
				t.Fatalf("the HTTPRoute refers to %s, which no mock serves", name)
			}
			port := int(num(r["port"]))
			applyYAML(t, c, fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec: {ports: [{name: http, port: %[3]d, targetPort: %[4]d, protocol: TCP}]}
`, name, llmNS, port, m.port))
			applyEndpoints(t, c, name, map[string]int{"http": m.port})
		}
	}
	ig := startInfergateFromRelease(t, c, objs)
	applyEndpoints(t, c, relName, map[string]int{"grpc-extproc": ig.extproc, "http-admin": ig.admin, "grpc-xds": ig.xds})

	// EG accepts what the chart rendered, its references resolved.
	waitCondition(t, c, httpRoutes, llmNS, relName, "status.parents", "Accepted")
	waitCondition(t, c, httpRoutes, llmNS, relName, "status.parents", "ResolvedRefs")
	waitCondition(t, c, egGVR("envoyextensionpolicies"), llmNS, relName, "status.ancestors", "Accepted")
	waitCondition(t, c, egGVR("clienttrafficpolicies"), egNamespace, relName+"-eg", "status.ancestors", "Accepted")

	// EG's Envoy, on EG's bootstrap.
	gw, _ := startEGEnvoy(t, c, gwPort, nil)
	testutil.Eventually(t, 60*time.Second, func() bool {
		return status(gw, false, nil) == http.StatusUnauthorized
	}, "Envoy to route through the gate")
	t.Logf("up after %v", time.Since(start).Round(time.Millisecond))

	// No key: the gate refuses it, OpenAI-style, and no pool sees it.
	before := servedAll(t, mocks)
	resp, err := chat(gw, "llama-3-70b", 4, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || json.Unmarshal(b, &e) != nil || e.Error.Code != "invalid_api_key" || e.Error.Message == "" ||
		!strings.HasPrefix(resp.Header.Get("content-type"), "application/json") {
		t.Errorf("without a key: %d %s %q, want 401 invalid_api_key JSON", resp.StatusCode, resp.Header.Get("content-type"), b)
	}
	if after := servedAll(t, mocks); after != before {
		t.Errorf("a refused request reached a pool: %d -> %d", before, after)
	}

	// No ready gate pod (its EndpointSlice gone): Envoy Gateway answers
	// every request itself (a direct 500, not the gate's 503: README,
	// Limits), and no pool sees one. Ready again, the gate decides again.
	slices := c.dyn.Resource(endpointSlices).Namespace(llmNS)
	if err := slices.Delete(ctx, relName+"-local", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Until Envoy Gateway has the change, the gate still decides (and
	// admits): count what reaches a pool from the first 500 on.
	testutil.Eventually(t, 30*time.Second, func() bool {
		return status(gw, false, withKey) == http.StatusInternalServerError
	}, "Envoy Gateway to fail closed without gate endpoints")
	before = servedAll(t, mocks)
	for range 10 {
		if code := status(gw, true, withKey); code != http.StatusInternalServerError {
			t.Errorf("without gate endpoints: %d, want Envoy Gateway's 500", code)
		}
	}
	if after := servedAll(t, mocks); after != before {
		t.Errorf("without a gate, %d requests reached a pool", after-before)
	}
	applyEndpoints(t, c, relName, map[string]int{"grpc-extproc": ig.extproc, "http-admin": ig.admin, "grpc-xds": ig.xds})
	testutil.Eventually(t, 30*time.Second, func() bool {
		return status(gw, false, nil) == http.StatusUnauthorized
	}, "the gate to decide again")

	// A stream: byte-exact against the mock that served it, incremental,
	// stamped by the meter under the client's request id (the chart's
	// ClientTrafficPolicy keeps it; EG's default would replace it).
	hdr := map[string]string{"authorization": "Bearer " + apiKey, "x-mock-ttft-ms": "60", "x-mock-itl-ms": "15",
		"x-request-id": "kube-eg-stream-1"}
	got := streamChat(t, gw, chatBody("llama-3-70b", 8, true, ""), hdr)
	pool := got.header.Get("x-infergate-pool")
	m := mocks[pool]
	if got.status != 200 || m == nil {
		t.Fatalf("through EG: %d (pool %q) %s", got.status, pool, got.body)
	}
	direct := streamChat(t, "http://"+m.addr, chatBody("llama-3-70b", 8, true, `,"stream_options":{"include_usage":true}`), hdr)
	if want := unasked(t, direct.body); !bytes.Equal(got.body, want) {
		t.Errorf("through EG:\n%q\nwant %s's own, less the usage event:\n%q", got.body, pool, want)
	}
	if n := strings.Count(string(got.body), `"content":`); got.reads < 8 || n < 8 {
		t.Errorf("%d reads for %d content events: not incremental", got.reads, n)
	}
	if got.firstByte > 0 && got.total-got.firstByte < 7*15*time.Millisecond*8/10 {
		t.Errorf("first bytes at %v, end at %v: the stream was buffered", got.firstByte, got.total)
	}
	st := ig.stamp(t, "the allowed stream", func(s logLine) bool { return s.RequestID == "kube-eg-stream-1" })
	if st.Pool != pool || st.Decision != "allow" || st.Tenant != "acme" || st.CompletionTokens != 8 || !st.Complete ||
		st.TTFTms < 55 || st.TTFTms > 120 {
		t.Errorf("stamp %+v (pool %s)", st, pool)
	}

	// The weights: vllm-a100 slows past the SLA under load; the controller
	// moves llama-3-70b's weight to vllm-h100 through the API; EG
	// re-translates and traffic follows.
	w0 := routeWeights(t, c, "llama-3-70b")
	if a, h := batch(t, gw, mocks, 20); w0["vllm-a100"] <= w0["vllm-h100"] || a < 10 || a+h != 20 {
		t.Fatalf("before the slowdown: weights %v, a batch of 20 went vllm-a100 %d, vllm-h100 %d; want mostly vllm-a100", w0, a, h)
	}
	stop := paceLoad(t, ctx, gw, "llama-3-70b")
	defer stop()
	mocks["vllm-a100"].control(t, `{"ttft_ms": 400}`)
	slowed := time.Now()
	var weights map[string]int64
	testutil.Eventually(t, 30*time.Second, func() bool {
		weights = routeWeights(t, c, "llama-3-70b")
		return weights["vllm-h100"] >= 90 && weights["vllm-a100"] <= 10
	}, "the controller to move llama-3-70b's weight to vllm-h100 in the HTTPRoute")
	moved := time.Now()
	stop()
	t.Logf("HTTPRoute weights %v -> %v, %v after vllm-a100 slowed down", w0, weights, moved.Sub(slowed).Round(time.Millisecond))
	// The write was the controller's, as the release's service account
	// (its token): the chart's RBAC allowed it.
	if !writtenBy(t, c, "infergate-controller") {
		t.Error("the HTTPRoute's managedFields show no update by infergate-controller")
	}
	// Traffic follows once EG has re-translated: a whole batch (bar the
	// controller's probe weight) reaches vllm-h100.
	testutil.Eventually(t, 30*time.Second, func() bool {
		a, h := batch(t, gw, mocks, 20)
		t.Logf("a batch of 20, %v after the HTTPRoute changed: vllm-a100 %d, vllm-h100 %d", time.Since(moved).Round(time.Millisecond), a, h)
		return a+h == 20 && a <= 2
	}, "traffic to follow the new weights")
	if c := mocks["sglang-l4"].served(t); c != 0 {
		t.Errorf("sglang-l4 served %d llama-3-70b requests", c)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

// batch sends n non-streamed requests for llama-3-70b one after the other
// and counts which pool served them.
func batch(t *testing.T, gw string, mocks map[string]*mockPool, n int) (a100, h100 int) {
	t.Helper()
	a0, h0 := mocks["vllm-a100"].served(t), mocks["vllm-h100"].served(t)
	for range n {
		resp, err := chat(gw, "llama-3-70b", 1, false, map[string]string{"authorization": "Bearer " + apiKey, "x-mock-ttft-ms": "1"})
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		if resp.StatusCode != 200 {
			t.Fatalf("llama-3-70b: %d", resp.StatusCode)
		}
	}
	return mocks["vllm-a100"].served(t) - a0, mocks["vllm-h100"].served(t) - h0
}

// writtenBy reports whether manager has updated the chart's HTTPRoute.
func writtenBy(t *testing.T, c *cluster, manager string) bool {
	t.Helper()
	obj, err := c.dyn.Resource(httpRoutes).Namespace(llmNS).Get(t.Context(), relName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range obj.GetManagedFields() {
		if f.Manager == manager && f.Operation == metav1.ManagedFieldsOperationUpdate {
			return true
		}
	}
	return false
}

// applyGateway makes Envoy Gateway's GatewayClass eg and its Gateway eg,
// one HTTP listener on port for routes of every namespace.
func applyGateway(t *testing.T, c *cluster, port int) {
	t.Helper()
	applyYAML(t, c, fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: eg}
spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: eg, namespace: %s}
spec:
  gatewayClassName: eg
  listeners:
  - {name: http, protocol: HTTP, port: %d, allowedRoutes: {namespaces: {from: All}}}
`, egNamespace, port))
}

// startEnvoyGateway runs certgen against the API server, then the
// controller, its EnvoyGateway config followed by extra (YAML of more
// top-level fields). EG's xDS server reads its certificate from the fixed
// path /certs (a Secret volume in its pod): it runs in a mount namespace of
// its own where a temp dir is bind-mounted there.
func startEnvoyGateway(t *testing.T, c *cluster, extra ...string) {
	t.Helper()
	bin := os.Getenv("EG_BIN")
	if bin == "" {
		bin = filepath.Join(repoRoot, ".tools", "bin", "envoy-gateway")
	}
	bin, _ = filepath.Abs(bin)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("envoy-gateway not found (%v): run scripts/install-test-deps.sh, or set EG_BIN", err)
	}
	env := []string{"KUBECONFIG=" + c.kubeconfig, "ENVOY_GATEWAY_NAMESPACE=" + egNamespace}
	certgen := withEnv(exec.Command(bin, "certgen", "--disable-topology-injector"), env...)
	if out, err := certgen.CombinedOutput(); err != nil {
		t.Fatalf("certgen: %v\n%s", err, out)
	}
	certs := t.TempDir()
	writeSecret(t, c, egNamespace, "envoy-gateway", certs)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy-gateway.yaml")
	// Kubernetes provider; no topology webhook (no pods to inject), no
	// leader election (one replica), admin on a free port and no metrics
	// listener (Envoy's stats listener takes 19001 on this host); Lua on,
	// for the chart's usage filter (ci/envoygateway-values.yaml enables it:
	// without enableLua Envoy Gateway rejects the whole policy).
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
provider:
  type: Kubernetes
  kubernetes:
    proxyTopologyInjector: {disabled: true}
    leaderElection: {disable: true}
admin: {address: {host: 127.0.0.1, port: %d}}
telemetry: {metrics: {prometheus: {disable: true}}}
logging: {level: {default: info}}
extensionApis: {enableLua: true}
%s`, freePort(t), strings.Join(extra, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	// /certs must exist to be a mount point; it is removed again if made here.
	if _, err := os.Stat("/certs"); os.IsNotExist(err) {
		if err := os.Mkdir("/certs", 0o755); err != nil {
			t.Fatalf("EG needs /certs as a mount point: %v", err)
		}
		t.Cleanup(func() { _ = os.Remove("/certs") })
	}
	cmd := withEnv(exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /certs && exec "$2" server --config-path "$3"`, "sh", certs, bin, cfg), env...)
	cmd.Dir = dir
	p := startProc(t, "envoy-gateway", cmd, nil)
	if err := p.WaitReady(30*time.Second, func() error { // EG's xDS server
		conn, err := net.Dial("tcp", "127.0.0.1:18000")
		if err == nil {
			conn.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// writeSecret writes a Secret's keys as files in dir.
func writeSecret(t *testing.T, c *cluster, ns, name, dir string) {
	t.Helper()
	s, err := c.kube.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("secret %s/%s: %v", ns, name, err)
	}
	for k, v := range s.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// startEGEnvoy runs the pinned Envoy as the pod EG's Deployment describes
// would: its bootstrap and args, with only what the pod provides rewritten
// (the xDS Service's DNS name, the /certs and /sds volumes, the pod name).
// hosts are the cluster DNS names it resolves (name -> IP), by its own
// /etc/hosts in a mount namespace.
func startEGEnvoy(t *testing.T, c *cluster, gwPort int, hosts map[string]string) (url, adminURL string) {
	t.Helper()
	var dep *appsv1.Deployment
	testutil.Eventually(t, 30*time.Second, func() bool {
		l, err := c.kube.AppsV1().Deployments(egNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "gateway.envoyproxy.io/owning-gateway-name=eg"})
		if err == nil && len(l.Items) == 1 {
			dep = &l.Items[0]
		}
		return dep != nil
	}, "EG to create the Envoy Deployment for Gateway eg")
	var ctr *corev1.Container
	for i := range dep.Spec.Template.Spec.Containers {
		if dep.Spec.Template.Spec.Containers[i].Name == "envoy" {
			ctr = &dep.Spec.Template.Spec.Containers[i]
		}
	}
	if ctr == nil {
		t.Fatalf("deployment %s has no envoy container", dep.Name)
	}
	certs, sds := t.TempDir(), t.TempDir()
	for _, v := range dep.Spec.Template.Spec.Volumes {
		switch {
		case v.Secret != nil && v.Name == "certs":
			writeSecret(t, c, egNamespace, v.Secret.SecretName, certs)
		case v.ConfigMap != nil && v.Name == "sds":
			cm, err := c.kube.CoreV1().ConfigMaps(egNamespace).Get(t.Context(), v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, d := range cm.Data {
				d = strings.ReplaceAll(d, "/certs/", certs+"/")
				if err := os.WriteFile(filepath.Join(sds, k), []byte(d), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	xdsHost := fmt.Sprintf("envoy-gateway.%s.svc.cluster.local", egNamespace)
	var bootstrap string
	var args []string
	for i := 0; i < len(ctr.Args); i++ {
		a := ctr.Args[i]
		switch {
		case a == "--config-yaml":
			i++
			bootstrap = ctr.Args[i]
		case strings.HasPrefix(a, "--config-yaml="):
			bootstrap = strings.TrimPrefix(a, "--config-yaml=")
		case a == "--log-level" || a == "-l":
			i++ // envoytest sets its own
		case strings.HasPrefix(a, "--log-level="):
		default:
			args = append(args, strings.ReplaceAll(a, "$(ENVOY_POD_NAME)", "envoy-eg-local"))
		}
	}
	if bootstrap == "" || !strings.Contains(bootstrap, xdsHost) || !strings.Contains(bootstrap, "/sds/") {
		t.Fatalf("EG's bootstrap does not name %s and /sds/: args %q", xdsHost, ctr.Args)
	}
	t.Logf("EG's Envoy args (bootstrap elided): %q", args)
	if os.Getenv("EG_ENVOY_DEBUG") != "" {
		args = append(args, "--component-log-level", "config:debug,connection:debug,upstream:debug,secret:debug")
		for i, a := range args {
			if a == "--component-log-level" && i+1 < len(args) && args[i+1] == "misc:error" {
				args = append(args[:i], args[i+2:]...)
				break
			}
		}
	}
	// The xDS Service's name is an FQDN ("…cluster.local."): drop the dot too.
	bootstrap = strings.ReplaceAll(strings.ReplaceAll(bootstrap, xdsHost+".", "127.0.0.1"), xdsHost, "127.0.0.1")
	bootstrap = strings.ReplaceAll(bootstrap, "/sds/", sds+"/")
	e := envoytest.StartWithHosts(t, hosts, bootstrap, args...)
	return "http://127.0.0.1:" + strconv.Itoa(gwPort), e.AdminURL
}

// mockPool is `infergate-bench mock` on a local port.
type mockPool struct {
	addr string
	port int
}

// builtBins memoizes the binaries built per test (each lives in its temp dir).
var builtBins sync.Map // builtKey -> string

type builtKey struct {
	t   testing.TB
	pkg string
}

// infergateBin is ./cmd/infergate built from this checkout.
func infergateBin(t testing.TB) string {
	return builtBin(t, repoRoot, "./cmd/infergate", "infergate")
}

// benchBin is infergate-bench (the lab's binary, with the mock) built from
// this checkout's bench module.
func benchBin(t *testing.T) string {
	return builtBin(t, filepath.Join(repoRoot, "bench"), "./cmd/infergate-bench", "infergate-bench")
}

func builtBin(t testing.TB, dir, pkg, name string) string {
	t.Helper()
	key := builtKey{t, pkg}
	if bin, ok := builtBins.Load(key); ok {
		return bin.(string)
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-C", dir, "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	builtBins.Store(key, bin)
	t.Cleanup(func() { builtBins.Delete(key) })
	return bin
}

func startMock(t *testing.T, name string) *mockPool {
	t.Helper()
	m := &mockPool{}
	serveOnFreePorts(t, name, 1, 15*time.Second, nil, func(ports []int) (*exec.Cmd, string) {
		m.port = ports[0]
		m.addr = net.JoinHostPort(hostIP(t), strconv.Itoa(m.port))
		return exec.Command(benchBin(t), "mock", "--listen", m.addr, "--ttft", "50ms", "--itl", "10ms"), "http://" + m.addr + "/healthz"
	})
	return m
}

func (m *mockPool) control(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post("http://"+m.addr+"/mock/control", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("mock control: %v %v", err, resp)
	}
	resp.Body.Close()
}

// served is the completion requests the mock has answered.
func (m *mockPool) served(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + m.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && strings.HasPrefix(f[0], "infergate_mock_requests_total") {
			v, _ := strconv.ParseFloat(f[1], 64)
			n += int(v)
		}
	}
	return n
}

func servedAll(t *testing.T, mocks map[string]*mockPool) int {
	n := 0
	for _, m := range mocks {
		n += m.served(t)
	}
	return n
}

// infergateProc is `infergate serve` on the config the chart rendered.
type infergateProc struct {
	extproc, admin, xds int
	requests            *testutil.Buffer
	proc                *testutil.Proc
}

// startInfergateFromRelease runs infergate with the release's ConfigMap,
// API keys Secret and policies ConfigMap as its pod would mount them (the
// mount paths rewritten), as the release's service account (a token from
// the TokenRequest API, as the kubelet projects it into the pod)
// for the weight sink, so the chart's RBAC is what allows its writes.
func startInfergateFromRelease(t *testing.T, c *cluster, objs []*unstructured.Unstructured) *infergateProc {
	t.Helper()
	cm := find(t, objs, "ConfigMap", relName+"-config")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(nested[string](cm.Object, "data", "config.yaml")), &cfg); err != nil {
		t.Fatal(err)
	}
	dep := find(t, objs, "Deployment", relName)
	pod := nested[map[string]any](dep.Object, "spec", "template", "spec")
	mounts := map[string]string{} // mount path -> local dir
	for _, v := range pod["volumes"].([]any) {
		vol := v.(map[string]any)
		dir := t.TempDir()
		if s, ok := vol["secret"].(map[string]any); ok {
			writeSecret(t, c, llmNS, s["secretName"].(string), dir)
		} else if m, ok := vol["configMap"].(map[string]any); ok {
			cmap, err := c.kube.CoreV1().ConfigMaps(llmNS).Get(t.Context(), m["name"].(string), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, d := range cmap.Data {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(d), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		} else if vol["persistentVolumeClaim"] == nil && vol["emptyDir"] == nil {
			continue // a volume of state (the ledger's claim, an emptyDir) starts empty
		}
		for _, ct := range pod["containers"].([]any) {
			for _, vm := range nested[[]any](ct.(map[string]any), "volumeMounts") {
				if vm := vm.(map[string]any); vm["name"] == vol["name"] {
					mounts[vm["mountPath"].(string)] = dir
				}
			}
		}
	}
	sa := nested[string](dep.Object, "spec", "template", "spec", "serviceAccountName")
	// With a weight sink, the pod must get the token the controller's writes need.
	if _, sink := cfg["weightSink"]; sink && !nested[bool](dep.Object, "spec", "template", "spec", "automountServiceAccountToken") {
		t.Errorf("Deployment %s runs the weight sink but does not mount its service account's token", dep.GetName())
	}
	kc := writeKubeconfig(t, c.tokenConfig(t, llmNS, sa))
	p := &infergateProc{requests: &testutil.Buffer{}}
	p.proc = serveOnFreePorts(t, "infergate", 3, 20*time.Second, p.requests, func(ports []int) (*exec.Cmd, string) {
		p.extproc, p.admin, p.xds = ports[0], ports[1], ports[2]
		listen := func(port int) string { return net.JoinHostPort(hostIP(t), strconv.Itoa(port)) }
		cfg["extproc"].(map[string]any)["listen"] = listen(p.extproc)
		cfg["admin"].(map[string]any)["listen"] = listen(p.admin)
		cfg["xds"].(map[string]any)["listen"] = listen(p.xds)
		b, _ := json.Marshal(cfg)
		// One pass, longest mount path first: a directory put in place of
		// one path (a temp dir under /tmp) must not be rewritten again by
		// another mount (the pod's /tmp emptyDir).
		paths := slices.SortedFunc(maps.Keys(mounts), func(a, b string) int { return len(b) - len(a) })
		var pairs []string
		for _, path := range paths {
			pairs = append(pairs, `"`+path, `"`+mounts[path])
		}
		conf := strings.NewReplacer(pairs...).Replace(string(b))
		if strings.Contains(conf, `"/etc/infergate`) {
			t.Fatalf("config still names a pod path: %s", conf)
		}
		cfgPath := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(cfgPath, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		return withEnv(exec.Command(infergateBin(t), "serve", "--config", cfgPath), "KUBECONFIG="+kc), "http://" + listen(p.admin) + "/readyz"
	})
	return p
}

// logLine is one line of infergate's request log.
type logLine struct {
	RequestID        string  `json:"request_id"`
	Model            string  `json:"model"`
	Stream           bool    `json:"stream"`
	Tenant           string  `json:"tenant"`
	Pool             string  `json:"pool"`
	Endpoint         string  `json:"endpoint"` // an Endpoint Picker's choice
	Upstream         string  `json:"upstream"`
	Decision         string  `json:"decision"`
	CompletionTokens int     `json:"completion_tokens"`
	TTFTms           float64 `json:"ttft_ms"`
	Complete         bool    `json:"complete"`
}

// stamp waits for the one request-log line that match selects.
func (p *infergateProc) stamp(t *testing.T, what string, match func(logLine) bool) logLine {
	t.Helper()
	var found []logLine
	testutil.Eventually(t, 5*time.Second, func() bool {
		found = nil
		for _, line := range strings.Split(p.requests.String(), "\n") {
			var s logLine
			if json.Unmarshal([]byte(line), &s) == nil && s.RequestID != "" && match(s) {
				found = append(found, s)
			}
		}
		return len(found) > 0
	}, "the request log line of "+what)
	if len(found) != 1 {
		t.Fatalf("%d request log lines for %s: %+v", len(found), what, found)
	}
	return found[0]
}

// startProc runs cmd as a child process, stopped (interrupt, then kill)
// when the test ends, its output shown if the test failed; stdout, if not
// nil, gets its standard output.
func startProc(t testing.TB, name string, cmd *exec.Cmd, stdout *testutil.Buffer) *testutil.Proc {
	t.Helper()
	if stdout != nil {
		cmd.Stdout = stdout
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s stdout:\n%s", name, stdout.String())
			}
		})
	}
	return testutil.StartProc(t, cmd, testutil.ProcOptions{Name: name, StopSignal: os.Interrupt, StopGrace: 10 * time.Second})
}

// serveOnFreePorts starts the server start returns (its command and the
// URL that answers 200 once it is ready) on n ports that were free, and
// returns it running; it starts it
// again on new ones if another socket took one before the server bound it:
// a port is only free until someone binds it, and on a busy machine an
// outgoing connection's source port may be the one chosen.
func serveOnFreePorts(t testing.TB, name string, n int, timeout time.Duration, stdout *testutil.Buffer,
	start func(ports []int) (cmd *exec.Cmd, readyURL string)) *testutil.Proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ports := make([]int, n)
		for i := range ports {
			ports[i] = freePort(t)
		}
		cmd, readyURL := start(ports)
		p := startProc(t, name, cmd, stdout)
		err := p.WaitReady(timeout, testutil.HTTPReady(readyURL))
		if err == nil {
			return p
		}
		if !p.Exited() || attempt == 3 || !strings.Contains(p.Log.Tail(1<<20), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("%s: a chosen port was taken before it bound it; again on new ports", name)
	}
}

// withEnv is cmd with env added to this process's environment.
func withEnv(cmd *exec.Cmd, env ...string) *exec.Cmd {
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// applyYAML applies every object of a YAML document.
func applyYAML(t testing.TB, c *cluster, doc string) {
	t.Helper()
	for _, obj := range decodeObjects(t, []byte(doc)) {
		if err := c.apply(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
}

// applyEndpoints gives Service svc one endpoint, this host's own address
// (the API server refuses loopback endpoints), with a port for each named
// Service port.
func applyEndpoints(t *testing.T, c *cluster, svc string, ports map[string]int) {
	t.Helper()
	var ps []any
	for name, p := range ports {
		ps = append(ps, map[string]any{"name": name, "port": int64(p), "protocol": "TCP"})
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": svc + "-local", "namespace": llmNS, "labels": map[string]any{"kubernetes.io/service-name": svc}},
		"addressType": "IPv4",
		"endpoints":   []any{map[string]any{"addresses": []any{hostIP(t)}, "conditions": map[string]any{"ready": true}}},
		"ports":       ps,
	}}
	if err := c.apply(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
}

// waitCondition waits for a status condition of type cond to be True on
// one of the object's parents/ancestors, and fails with the status if not.
func waitCondition(t *testing.T, c *cluster, gvr schema.GroupVersionResource, ns, name, path, cond string) {
	t.Helper()
	var status any
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		obj, err := c.dyn.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err == nil {
			status = obj.Object["status"]
			for _, p := range nested[[]any](obj.Object, strings.Split(path, ".")...) {
				for _, cd := range nested[[]any](p.(map[string]any), "conditions") {
					cd := cd.(map[string]any)
					if cd["type"] == cond && cd["status"] == "True" {
						t.Logf("%s %s/%s: %s", gvr.Resource, ns, name, cond)
						return
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(status, "", "  ")
	t.Fatalf("%s %s/%s not %s; status:\n%s", gvr.Resource, ns, name, cond, b)
}

// routeWeights reads the weights of a model's rule in the HTTPRoute, by
// pool, through the weight sink's own view (the product's keys).
func routeWeights(t *testing.T, c *cluster, model string) map[string]int64 {
	t.Helper()
	obj, err := c.dyn.Resource(httpRoutes).Namespace(llmNS).Get(t.Context(), relName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, r := range nested[[]any](obj.Object, "spec", "rules") {
		rule := r.(map[string]any)
		match := false
		for _, m := range nested[[]any](rule, "matches") {
			for _, h := range nested[[]any](m.(map[string]any), "headers") {
				if h.(map[string]any)["value"] == model {
					match = true
				}
			}
		}
		if !match {
			continue
		}
		for _, ref := range nested[[]any](rule, "backendRefs") {
			r := ref.(map[string]any)
			out[r["name"].(string)] = num(r["weight"])
		}
	}
	return out
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("the release has no %s %s", kind, name)
	return nil
}

// nested is the field at path, or T's zero value when it is absent or of
// another type.
func nested[T any](m map[string]any, path ...string) T {
	v, _, _ := unstructured.NestedFieldNoCopy(m, path...)
	t, _ := v.(T)
	return t
}

// hostIP is this host's first non-loopback IPv4 address: the endpoints of
// the Services, since kube-apiserver refuses 127.0.0.0/8 in an
// EndpointSlice ("may not be in the loopback range").
var hostIP = func() func(t *testing.T) string {
	ip := sync.OnceValue(func() string {
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
		return ""
	})
	return func(t *testing.T) string {
		t.Helper()
		if ip() == "" {
			t.Fatal("no non-loopback IPv4 address for the Services' endpoints")
		}
		return ip()
	}
}()

// num is a JSON number as decoded by either decoder (float64 or int64).
func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

// freePort is a port no socket on any of this host's addresses holds now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func chatBody(model string, maxTokens int, stream bool, extra string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"tell me a story about envoy"}]%s}`,
		model, maxTokens, stream, extra)
}

// chat POSTs a chat completion to the Gateway for its route's hostname.
func chat(base, model string, maxTokens int, stream bool, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody(model, maxTokens, stream, "")))
	if err != nil {
		return nil, err
	}
	req.Host = llmHost
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

// withKey is the headers of a request with the release's API key.
var withKey = map[string]string{"authorization": "Bearer " + apiKey}

// status is the status of a one-token llama-3-70b request through gw, 0 if
// it could not be sent.
func status(gw string, stream bool, hdr map[string]string) int {
	resp, err := chat(gw, "llama-3-70b", 1, stream, hdr)
	if err != nil {
		return 0
	}
	drain(resp)
	return resp.StatusCode
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

type streamed struct {
	status           int
	header           http.Header
	body             []byte
	reads            int
	firstByte, total time.Duration
}

// streamK POSTs body and records how the bytes arrived.
// paceLoad streams model through base from two clients with the test's
// premium key until the returned stop is called (it waits for them), a
// request every 60 ms each (the premium tier allows 600 a minute). A
// non-200 answer while the load runs fails t.
func paceLoad(t *testing.T, ctx context.Context, base, model string) (stop func()) {
	loadCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for loadCtx.Err() == nil {
				resp, err := chat(base, model, 2, true, map[string]string{"authorization": "Bearer " + apiKey, "x-mock-itl-ms": "5"})
				if err == nil {
					drain(resp)
					if resp.StatusCode != http.StatusOK && loadCtx.Err() == nil {
						t.Errorf("under load: %d", resp.StatusCode)
						return
					}
				}
				select {
				case <-loadCtx.Done():
				case <-time.After(60 * time.Millisecond):
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func streamChat(t *testing.T, base, body string, hdr map[string]string) streamed {
	t.Helper()
	return streamChatEach(t, base, body, hdr, nil)
}

// streamChatEach is streamChat calling event (when not nil) as each SSE
// event ends, before reading on.
func streamChatEach(t *testing.T, base, body string, hdr map[string]string, event func()) streamed {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = llmHost
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	begin := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := streamed{status: resp.StatusCode, header: resp.Header}
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if r.reads == 0 {
				r.firstByte = time.Since(begin)
			}
			r.reads++
			for _, b := range buf[:n] {
				r.body = append(r.body, b)
				if event != nil && bytes.HasSuffix(r.body, []byte("\n\n")) {
					event()
				}
			}
		}
		if err == io.EOF {
			r.total = time.Since(begin)
			return r
		}
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
	}
}
