package charts

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// egVersion is the Envoy Gateway release the chart targets: the API types
// the objects are decoded into (go.mod) and the egctl that translates them.
const egVersion = "v1.9.1"

// TestEnvoyGatewayVersionPinned keeps go.mod's Envoy Gateway API module and
// the egctl below on the same release.
func TestEnvoyGatewayVersionPinned(t *testing.T) {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s*github\.com/envoyproxy/gateway ` + regexp.QuoteMeta(egVersion) + `\b`).Match(b) {
		t.Errorf("go.mod does not require github.com/envoyproxy/gateway %s; update egVersion and go.mod together", egVersion)
	}
}

// egctl returns Envoy Gateway's CLI, built once with `go install` through
// the Go module proxy and kept in the user cache directory. The first build
// takes minutes (it is all of Envoy Gateway); later runs reuse the binary.
func egctl(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "infergate-test", "egctl-"+egVersion)
	bin := filepath.Join(dir, "egctl")
	if fi, err := os.Stat(bin); err == nil && fi.Mode()&0o111 != 0 {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Install into a scratch directory and rename, so an interrupted build
	// never leaves a half-written binary behind.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	t.Logf("building egctl %s into %s (once)", egVersion, dir)
	cmd := exec.Command("go", "install", "github.com/envoyproxy/gateway/cmd/egctl@"+egVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install egctl@%s: %v\n%s", egVersion, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "egctl"), bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// egInput is what egctl translates: the fixture (GatewayClass, Gateway, the
// model-server Services) plus the chart's Envoy Gateway objects and its
// ext_proc Service, given the ClusterIP the API server would assign.
func egInput(t *testing.T, r *rendered) []byte {
	t.Helper()
	fixture, err := os.ReadFile(filepath.Join("testdata", "egctl-fixture.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{string(fixture)}
	for _, doc := range r.docs {
		var h header
		if err := yaml.Unmarshal([]byte(doc), &h); err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(h.APIVersion, "gateway.envoyproxy.io/"), strings.HasPrefix(h.APIVersion, "gateway.networking.k8s.io/"):
			docs = append(docs, doc)
		case h.Kind == "Service" && h.Metadata.Name == releaseName:
			docs = append(docs, strings.Replace(doc, "\n  type: ClusterIP\n", "\n  type: ClusterIP\n  clusterIP: 10.96.0.50\n", 1))
		}
	}
	return []byte(strings.Join(docs, "\n---\n"))
}

func runEgctl(t *testing.T, input []byte, args ...string) []byte {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in.yaml")
	if err := os.WriteFile(in, input, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(egctl(t), append([]string{"x", "translate", "--from", "gateway-api", "-f", in}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("egctl %v: %v\n%s%s", args, err, stderr, out)
	}
	return out
}

// TestEnvoyGatewayTranslate runs Envoy Gateway's own translator (egctl x
// translate, fully offline) on the Envoy Gateway variant. Envoy Gateway
// must accept every object, and the Envoy config it generates must carry
// the gate and the meter with the intended modes on every route. The xDS
// output is kept as a golden file (testdata/envoygateway.egctl-xds.yaml).
func TestEnvoyGatewayTranslate(t *testing.T) {
	r := mustRender(t, variant{"envoygateway", filepath.Join(chartDir, "ci", "envoygateway-values.yaml")})
	input := egInput(t, r)

	// 1. Envoy Gateway's verdict on each object (its status conditions).
	var status map[string]any
	if err := json.Unmarshal(runEgctl(t, input, "--to", "gateway-api", "-o", "json"), &status); err != nil {
		t.Fatal(err)
	}
	walk(status, func(m map[string]any) {
		conds, _ := m["conditions"].([]any)
		for _, c := range conds {
			c := c.(map[string]any)
			if c["status"] != "True" {
				t.Errorf("condition %v=%v: %v (%v)", c["type"], c["status"], c["message"], c["reason"])
			}
		}
	})
	for _, kind := range []string{"envoyExtensionPolicies", "httpRoutes", "clientTrafficPolicies"} {
		if items, _ := status[kind].([]any); len(items) == 0 {
			t.Errorf("egctl reports no %s (keys: %v)", kind, keys(status))
		}
	}

	// 2. The generated Envoy config.
	xdsYAML := runEgctl(t, input, "--to", "xds", "-t", "all", "-o", "yaml")
	golden(t, filepath.Join("testdata", "envoygateway.egctl-xds.yaml"), xdsYAML)
	xdsJSON, err := yaml.YAMLToJSON(xdsYAML)
	if err != nil {
		t.Fatal(err)
	}
	var xds any
	if err := json.Unmarshal(xdsJSON, &xds); err != nil {
		t.Fatal(err)
	}

	filters := map[string]*extprocv3.ExternalProcessor{} // by HTTP filter name
	var order []string
	var chains [][]string       // each HTTP connection manager's filters, in order
	luas := map[string]string{} // the Lua filters' scripts, by HTTP filter name
	var bufferLimits []float64
	var preservesRequestID []bool // per HTTP connection manager of the Gateway's listener
	var routes []map[string]any
	walk(xds, func(m map[string]any) {
		if tc, ok := m["typedConfig"].(map[string]any); ok && tc["@type"] == "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor" {
			b, _ := json.Marshal(tc)
			var p extprocv3.ExternalProcessor
			// The whole Any, @type included, is the ExternalProcessor's JSON.
			if err := (protojson.UnmarshalOptions{}).Unmarshal(stripType(b), &p); err != nil {
				t.Fatalf("%v: %s", err, b)
			}
			name := fmt.Sprint(m["name"])
			filters[name] = &p
			order = append(order, name)
		}
		if tc, ok := m["typedConfig"].(map[string]any); ok && tc["@type"] == "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua" {
			code, _ := tc["defaultSourceCode"].(map[string]any)
			luas[fmt.Sprint(m["name"])], _ = code["inlineString"].(string)
		}
		if hf, ok := m["httpFilters"].([]any); ok {
			var chain []string
			for _, f := range hf {
				chain = append(chain, fmt.Sprint(f.(map[string]any)["name"]))
			}
			chains = append(chains, chain)
		}
		if m["@type"] == "type.googleapis.com/envoy.config.listener.v3.Listener" && m["name"] == "envoy-gateway-system/eg/http" {
			v, _ := m["perConnectionBufferLimitBytes"].(float64)
			bufferLimits = append(bufferLimits, v)
			walk(m, func(hcm map[string]any) {
				if hcm["@type"] == "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" {
					v, _ := hcm["preserveExternalRequestId"].(bool)
					preservesRequestID = append(preservesRequestID, v)
				}
			})
		}
		if _, ok := m["match"]; ok {
			if _, ok := m["name"].(string); ok {
				routes = append(routes, m)
			}
		}
	})
	if len(order) != 2 {
		t.Fatalf("want two ext_proc filters, got %v", order)
	}
	gate, meter := filters[order[0]], filters[order[1]]
	if !strings.HasSuffix(order[0], "/extproc/0") || !strings.HasSuffix(order[1], "/extproc/1") {
		t.Errorf("filter order %v: the gate (extProc[0]) must run before the meter (extProc[1])", order)
	}

	// The gate: blocking, fail-closed, the whole request body, nothing of
	// the response, may write the infergate metadata namespaces (one key
	// per field, and the meter's one field).
	pm := gate.GetProcessingMode()
	if gate.GetObservabilityMode() || gate.GetFailureModeAllow() ||
		pm.GetRequestHeaderMode().String() != "SEND" || pm.GetRequestBodyMode().String() != "BUFFERED" ||
		pm.GetResponseHeaderMode().String() != "SKIP" || pm.GetResponseBodyMode().String() != "NONE" ||
		gate.GetStatusOnError().GetCode().String() != "ServiceUnavailable" || gate.GetMessageTimeout().AsDuration().String() != "1s" ||
		!equal(gate.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), "infergate", "infergate.meter") {
		t.Errorf("gate filter is not blocking/fail-closed/buffered-request as intended:\n%v", gate)
	}
	// The meter: observability mode, streamed response, its attributes,
	// gets the gate's field (its namespace alone: Envoy Gateway takes no
	// metadata expression as an attribute).
	pm = meter.GetProcessingMode()
	if !meter.GetObservabilityMode() || !meter.GetFailureModeAllow() ||
		pm.GetRequestHeaderMode().String() != "SEND" || pm.GetRequestBodyMode().String() != "NONE" ||
		pm.GetResponseHeaderMode().String() != "SEND" || pm.GetResponseBodyMode().String() != "STREAMED" ||
		!equal(meter.GetRequestAttributes(), "request.time") ||
		!equal(meter.GetResponseAttributes(), "response.code", "upstream.address", "upstream.request_attempt_count", "response.code_details") ||
		!equal(meter.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), "infergate.meter") {
		t.Errorf("meter filter is not observability-mode/streamed-response as intended:\n%v", meter)
	}
	for _, f := range []*extprocv3.ExternalProcessor{gate, meter} {
		// Envoy Gateway has no way to set these (see the chart README).
		if len(f.GetGrpcService().GetInitialMetadata()) > 0 || f.GetSendBodyWithoutWaitingForHeaderResponse() {
			t.Errorf("Envoy Gateway now sets initial metadata or send_body_without_waiting_for_header_response; revisit the chart: %v", f)
		}
	}

	// The usage filter: files/usage.lua (TestUsageLuaMatchesSnippet keeps
	// it envoy/snippet.yaml's), accepted by Envoy Gateway's default Strict
	// Lua validation (the conditions above), and placed before the gate and
	// the meter: on the response Envoy runs the filters in reverse, so it
	// removes the usage event only after the meter has read it.
	script, err := os.ReadFile(filepath.Join(chartDir, "files", "usage.lua"))
	if err != nil {
		t.Fatal(err)
	}
	if len(luas) != 1 {
		t.Fatalf("want one Lua filter (the usage filter), got %v", keys(luas))
	}
	var usage string
	for name, code := range luas {
		usage = name
		if code != string(script) {
			t.Errorf("%s's script differs from files/usage.lua:\n%s", name, diff(string(script), code))
		}
	}
	placed := 0
	for _, chain := range chains {
		lua, gate, meter := slices.Index(chain, usage), slices.Index(chain, order[0]), slices.Index(chain, order[1])
		if lua < 0 && gate < 0 && meter < 0 {
			continue
		}
		placed++
		if lua < 0 || gate < 0 || meter < 0 || lua > gate || gate > meter {
			t.Errorf("HTTP filters %v: want the usage filter %s before the gate and the meter", chain, usage)
		}
	}
	if placed == 0 {
		t.Errorf("no HTTP connection manager carries the gate, the meter and the usage filter: %v", chains)
	}

	// The three filters are enabled on every route of the HTTPRoute,
	// including the catch-all the request first lands on, before the gate
	// routes it.
	if len(routes) != 3 {
		t.Errorf("want 3 routes (two models and the catch-all), got %d", len(routes))
	}
	for _, rt := range routes {
		per, _ := rt["typedPerFilterConfig"].(map[string]any)
		for _, name := range append(order, usage) {
			if _, ok := per[name]; !ok {
				t.Errorf("route %v does not enable %s", rt["name"], name)
			}
		}
	}
	// The ClientTrafficPolicy's buffer limit reaches the Gateway's listener.
	if len(bufferLimits) != 1 || bufferLimits[0] != 1<<20 {
		t.Errorf("listener perConnectionBufferLimitBytes %v, want [1048576] from the ClientTrafficPolicy", bufferLimits)
	}
	if len(preservesRequestID) != 1 || !preservesRequestID[0] {
		t.Errorf("HTTP connection managers' the Gateway listener's preserveExternalRequestId %v, want [true] from the ClientTrafficPolicy", preservesRequestID)
	}
	for _, want := range []string{"exact: llama-3-70b", "weight: 80", "weight: 20", "key: x-infergate-pool", "status: 404",
		"value: '%DYNAMIC_METADATA(infergate:x-ratelimit-remaining-tokens)%'"} {
		if !strings.Contains(string(xdsYAML), want) {
			t.Errorf("translated routes lack %q", want)
		}
	}
}

// stripType removes the Any's @type from an ExternalProcessor's JSON.
func stripType(b []byte) []byte {
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	delete(m, "@type")
	out, _ := json.Marshal(m)
	return out
}

func walk(v any, visit func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		visit(v)
		for _, e := range v {
			walk(e, visit)
		}
	case []any:
		for _, e := range v {
			walk(e, visit)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func equal(got []string, want ...string) bool {
	return strings.Join(got, ",") == strings.Join(want, ",")
}

// Envoy Gateway v1.9.1's verdict on the chart's InferencePool route, from
// its own translator: it has no InferencePool backend of its own (it
// routes to one only through an extension server that declares the kind
// in extensionManager.backendResources and builds the pool's cluster and
// picker filter), so it accepts the route and leaves its InferencePool
// references unresolved (InvalidKind), while the Service-backed route and
// the gate's policy stay accepted and resolved.
func TestEnvoyGatewayTranslateInferencePools(t *testing.T) {
	r := mustRender(t, variant{"inferencepools", filepath.Join(chartDir, "ci", "inferencepools-values.yaml")})
	var status struct {
		HTTPRoutes []struct {
			Metadata struct{ Name string }
			Status   struct {
				Parents []struct {
					Conditions []struct{ Type, Status, Reason, Message string }
				}
			}
		}
	}
	if err := json.Unmarshal(runEgctl(t, egInput(t, r), "--to", "gateway-api", "-o", "json"), &status); err != nil {
		t.Fatal(err)
	}
	verdicts := map[string]map[string]string{} // route → condition type → status/reason
	for _, rt := range status.HTTPRoutes {
		verdicts[rt.Metadata.Name] = map[string]string{}
		for _, p := range rt.Status.Parents {
			for _, c := range p.Conditions {
				verdicts[rt.Metadata.Name][c.Type] = c.Status + "/" + c.Reason
				t.Logf("%s: %s=%s %s: %s", rt.Metadata.Name, c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	want := map[string]map[string]string{
		releaseName:                {"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"},
		releaseName + "-inference": {"Accepted": "True/Accepted", "ResolvedRefs": "False/InvalidKind"},
	}
	for name, conds := range want {
		for typ, v := range conds {
			if got := verdicts[name][typ]; got != v {
				t.Errorf("HTTPRoute %s: %s = %q, want %q", name, typ, got, v)
			}
		}
	}
}
