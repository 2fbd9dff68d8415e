package charts

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestExamplePoliciesMatchRepo keeps the chart's copy of the example
// policies (files/policies, the default policies ConfigMap) identical to the
// repository's policies/, which `opa test` and the end-to-end tests run.
func TestExamplePoliciesMatchRepo(t *testing.T) {
	want, _ := filepath.Glob(filepath.Join(repoRoot, "policies", "*.rego"))
	want = append(want, filepath.Join(repoRoot, "policies", "data.yaml"))
	got, _ := filepath.Glob(filepath.Join(chartDir, "files", "policies", "*"))
	base := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		sort.Strings(out)
		return out
	}
	if w, g := base(want), base(got); strings.Join(w, " ") != strings.Join(g, " ") {
		t.Fatalf("charts/infergate/files/policies has %v, policies/ has %v; copy them: cp policies/*.rego policies/data.yaml charts/infergate/files/policies/", g, w)
	}
	for _, p := range want {
		a, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(chartDir, "files", "policies", filepath.Base(p)))
		if err != nil {
			t.Fatal(err)
		}
		if string(a) != string(b) {
			t.Errorf("charts/infergate/files/policies/%s differs from policies/%[1]s; copy it over", filepath.Base(p))
		}
	}
}

// TestIstioFiltersMatchSnippet keeps the EnvoyFilters' gate, usage filter
// and meter equal to envoy/snippet.yaml's (which a main-module test keeps
// equal to the bootstrap the end-to-end tests run), apart from the cluster
// Istio names.
func TestIstioFiltersMatchSnippet(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy", "snippet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var snippet struct {
		HTTPFilters      []json.RawMessage `json:"http_filters"`
		LocalReplyConfig json.RawMessage   `json:"local_reply_config"`
	}
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &snippet); err != nil {
		t.Fatal(err)
	}
	if len(snippet.HTTPFilters) != 3 {
		t.Fatalf("envoy/snippet.yaml has %d http_filters, want the gate, the usage filter and the meter", len(snippet.HTTPFilters))
	}

	// The gate's failures: the snippet's first local-reply mapper (the
	// second rewrites every local reply, which in a mesh are not all ours).
	var snippetReply hcmv3.LocalReplyConfig
	if err := protojson.Unmarshal(snippet.LocalReplyConfig, &snippetReply); err != nil {
		t.Fatal(err)
	}
	if len(snippetReply.GetMappers()) == 0 {
		t.Fatal("envoy/snippet.yaml has no local-reply mapper")
	}
	wantReply := &hcmv3.LocalReplyConfig{Mappers: snippetReply.GetMappers()[:1]}

	r := mustRender(t, variant{"istio", filepath.Join(chartDir, "ci", "istio-values.yaml")})
	const cluster = "outbound|50051||infergate.llm.svc.cluster.local"
	contexts := map[string]bool{}
	for _, doc := range r.docs {
		if !strings.Contains(doc, "kind: EnvoyFilter") {
			continue
		}
		spec, filters, err := decodeEnvoyFilter([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range filters {
			names = append(names, f.name)
		}
		if want := []string{"infergate.gate", "infergate.usage", "infergate.meter"}; !slices.Equal(names, want) {
			t.Fatalf("EnvoyFilter patches %v, want %v in that order", names, want)
		}
		underscores, reply := false, false
		for _, cp := range spec.GetConfigPatches() {
			if cp.GetApplyTo().String() != "NETWORK_FILTER" {
				continue
			}
			js, _ := protojson.Marshal(cp.GetPatch().GetValue())
			hcm, err := decodeHCMPatch(js)
			if err != nil {
				t.Fatal(err)
			}
			underscores = cp.GetPatch().GetOperation().String() == "MERGE" &&
				hcm.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction().String() == "DROP_HEADER"
			reply = cp.GetPatch().GetOperation().String() == "MERGE" && proto.Equal(hcm.GetLocalReplyConfig(), wantReply)
			if !reply {
				t.Errorf("the HCM patch's local_reply_config differs from envoy/snippet.yaml's first mapper:\nchart:   %v\nsnippet: %v",
					hcm.GetLocalReplyConfig(), wantReply)
			}
		}
		if !underscores {
			t.Error("no MERGE patch dropping headers with underscores")
		}
		if !reply {
			t.Error("no MERGE patch answering the gate's failures in OpenAI's error format")
		}
		for i, cp := range spec.GetConfigPatches()[:len(filters)] {
			if cp.GetApplyTo().String() != "HTTP_FILTER" || cp.GetPatch().GetOperation().String() != "INSERT_BEFORE" ||
				cp.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
				t.Errorf("patch %d is not an HTTP_FILTER INSERT_BEFORE the router: %v", i, cp)
			}
			contexts[cp.GetMatch().GetContext().String()] = true
			want, err := decodeHTTPFilter(snippet.HTTPFilters[i])
			if err != nil {
				t.Fatal(err)
			}
			if name := filters[i].name; filters[i].lua != nil || want.lua != nil {
				if name != want.name || !proto.Equal(filters[i].lua, want.lua) {
					t.Errorf("%s differs from envoy/snippet.yaml's %s:\nchart:   %v\nsnippet: %v", name, want.name, filters[i].lua, want.lua)
				}
				continue
			}
			name, got := filters[i].name, filters[i].proc
			if got.GetGrpcService().GetEnvoyGrpc().GetClusterName() != cluster {
				t.Errorf("%s: cluster %q, want %q", name, got.GetGrpcService().GetEnvoyGrpc().GetClusterName(), cluster)
			}
			got = proto.Clone(got).(*extprocv3.ExternalProcessor)
			got.GetGrpcService().GetEnvoyGrpc().ClusterName = want.proc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
			if name != want.name || !proto.Equal(got, want.proc) {
				t.Errorf("%s differs from envoy/snippet.yaml's %s:\nchart:   %v\nsnippet: %v", name, want.name, got, want.proc)
			}
		}
	}
	for _, c := range []string{"GATEWAY", "SIDECAR_INBOUND"} {
		if !contexts[c] {
			t.Errorf("no EnvoyFilter patch for context %s (have %v)", c, contexts)
		}
	}
}

// TestUsageLuaMatchesSnippet keeps the chart's one copy of the usage
// filter's script, files/usage.lua, byte for byte envoy/snippet.yaml's
// infergate.usage (which the end-to-end tests run in Envoy), and checks
// that every place the chart renders it carries that script unchanged: each
// Istio EnvoyFilter and the Envoy Gateway policy (envoyGateway.usageFilter).
func TestUsageLuaMatchesSnippet(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy", "snippet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var snippet struct {
		HTTPFilters []struct {
			Name        string `json:"name"`
			TypedConfig struct {
				DefaultSourceCode struct {
					InlineString string `json:"inline_string"`
				} `json:"default_source_code"`
			} `json:"typed_config"`
		} `json:"http_filters"`
	}
	if err := yaml.Unmarshal(b, &snippet); err != nil {
		t.Fatal(err)
	}
	var want string
	for _, f := range snippet.HTTPFilters {
		if f.Name == "infergate.usage" {
			want = f.TypedConfig.DefaultSourceCode.InlineString
		}
	}
	if !strings.Contains(want, "function envoy_on_response") {
		t.Fatalf("envoy/snippet.yaml has no infergate.usage script (got %q)", want)
	}
	file, err := os.ReadFile(filepath.Join(chartDir, "files", "usage.lua"))
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != want {
		t.Fatalf("charts/infergate/files/usage.lua differs from envoy/snippet.yaml's infergate.usage script; copy it over:\n%s",
			diff(want, string(file)))
	}

	var istio int
	for _, doc := range mustRender(t, variant{"istio", filepath.Join(chartDir, "ci", "istio-values.yaml")}).docs {
		if !strings.Contains(doc, "kind: EnvoyFilter") {
			continue
		}
		_, filters, err := decodeEnvoyFilter([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range filters {
			if f.lua != nil {
				istio++
				if got := f.lua.GetDefaultSourceCode().GetInlineString(); got != want {
					t.Errorf("an EnvoyFilter's %s script differs from files/usage.lua:\n%s", f.name, diff(want, got))
				}
			}
		}
	}
	if istio != 2 {
		t.Errorf("%d Lua filters in the Istio EnvoyFilters, want 2 (the gateway's and the sidecar's)", istio)
	}

	objs := decodeAll(t, mustRender(t, variant{"envoygateway", filepath.Join(chartDir, "ci", "envoygateway-values.yaml")}))
	policies := objs["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"]
	if len(policies) != 1 {
		t.Fatalf("%d EnvoyExtensionPolicies, want 1", len(policies))
	}
	lua := policies[0].(*egv1a1.EnvoyExtensionPolicy).Spec.Lua
	if len(lua) != 1 || lua[0].Type != egv1a1.LuaValueTypeInline || lua[0].Inline == nil {
		t.Fatalf("EnvoyExtensionPolicy lua %+v, want the usage script inline", lua)
	}
	if got := *lua[0].Inline; got != want {
		t.Errorf("the EnvoyExtensionPolicy's Lua differs from files/usage.lua:\n%s", diff(want, got))
	}

	// Off by default: Envoy Gateway rejects a policy with Lua (and answers
	// 500 on its routes) unless its extensionApis.enableLua is set.
	vals := readValues(t, filepath.Join(chartDir, "ci", "envoygateway-values.yaml"))
	delete(vals["envoyGateway"].(map[string]any), "usageFilter")
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range decodeAll(t, r)["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"] {
		if lua := p.(*egv1a1.EnvoyExtensionPolicy).Spec.Lua; len(lua) != 0 {
			t.Errorf("the policy has Lua without envoyGateway.usageFilter.enabled: %+v", lua)
		}
	}
}

// The gate is forwarded only the request headers it reads (forward_rules):
// those of envoy/snippet.yaml, plus config.auth.policyHeaders, lower-cased
// and once each, so that a policy sees every header the config names.
func TestIstioGateForwardsPolicyHeaders(t *testing.T) {
	vals := readValues(t, filepath.Join(chartDir, "ci", "istio-values.yaml"))
	vals["config"] = map[string]any{"auth": map[string]any{"policyHeaders": []any{"X-Team", "user-agent", "x-tier"}}}
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	// A plain Envoy's snippet must be told too.
	if !strings.Contains(r.notes, "forward_rules.allowed_headers") || !strings.Contains(r.notes, "x-team, x-tier.") {
		t.Errorf("the notes do not name the policy headers to forward:\n%s", r.notes)
	}
	for _, doc := range r.docs {
		if !strings.Contains(doc, "kind: EnvoyFilter") {
			continue
		}
		_, filters, err := decodeEnvoyFilter([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var exact, prefix []string
		for _, p := range filters[0].proc.GetForwardRules().GetAllowedHeaders().GetPatterns() {
			if e := p.GetExact(); e != "" {
				exact = append(exact, e)
			}
			if e := p.GetPrefix(); e != "" {
				prefix = append(prefix, e)
			}
		}
		if want := []string{":method", ":path", "content-type", "x-request-id", "authorization", "x-api-key", "user-agent", "x-team", "x-tier"}; !slices.Equal(exact, want) {
			t.Errorf("gate forwards %v, want %v", exact, want)
		}
		if !slices.Equal(prefix, []string{"x-infergate-", "x_infergate_"}) {
			t.Errorf("gate forwards prefixes %v", prefix)
		}
	}
}

// A request the chart's Istio gateway routes to a model server's sidecar
// was gated and metered at the gateway: the sidecar's filters skip the
// gateway's identities, and only when the chart gates that gateway (else a
// request from it would pass ungated).
func TestIstioSidecarSkipsOnlyTheChartsGateway(t *testing.T) {
	const defaultID = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"
	cases := []struct {
		name    string
		gateway bool
		ids     []any // nil: the default
		want    []string
	}{
		{"default", true, nil, []string{defaultID}},
		{"two gateways", true, []any{"spiffe://td/ns/a/sa/gw", "spiffe://td/ns/b/sa/gw"}, []string{"spiffe://td/ns/a/sa/gw", "spiffe://td/ns/b/sa/gw"}},
		{"none", true, []any{}, nil},
		{"the chart's gateway off", false, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vals := readValues(t, filepath.Join(chartDir, "ci", "istio-values.yaml"))
			istio := vals["istio"].(map[string]any)
			istio["gateway"].(map[string]any)["enabled"] = c.gateway
			if c.ids != nil {
				istio["sidecar"].(map[string]any)["gatewayIdentities"] = c.ids
			}
			if c.ids != nil && len(c.ids) == 0 {
				// The AuthorizationPolicy would have no identity to admit
				// the gateway by (a render error, TestValuesRejected).
				istio["authorizationPolicy"] = map[string]any{"enabled": false}
			}
			r, err := render(t, vals)
			if err != nil {
				t.Fatal(err)
			}
			skips := map[string][]string{} // EnvoyFilter/filter -> identities skipped
			for _, doc := range r.docs {
				if !strings.Contains(doc, "kind: EnvoyFilter") {
					continue
				}
				_, filters, err := decodeEnvoyFilter([]byte(doc))
				if err != nil {
					t.Fatal(err)
				}
				var ef struct {
					Metadata struct{ Name string } `json:"metadata"`
				}
				if err := yaml.Unmarshal([]byte(doc), &ef); err != nil {
					t.Fatal(err)
				}
				for _, f := range filters {
					skips[ef.Metadata.Name+"/"+f.name] = f.skips
				}
			}
			for key, ids := range skips {
				want := c.want
				if strings.HasPrefix(key, "infergate-gateway/") {
					want = nil // the gateway itself always gates
				}
				if !slices.Equal(ids, want) {
					t.Errorf("%s skips %v, want %v", key, ids, want)
				}
			}
			if n := len(skips); n != 3 && !c.gateway || n != 6 && c.gateway {
				t.Errorf("HTTP filters patched: %v", skips)
			}
		})
	}
}

// TestRenderedConfigIsValid runs `infergate validate` on the config each
// variant renders, with its policies and API keys, as the pod would see
// them under /etc/infergate.
func TestRenderedConfigIsValid(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "infergate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/infergate")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building infergate: %v\n%s", err, out)
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			root := t.TempDir()
			etc := filepath.Join(root, "etc", "infergate")
			objs := decodeAll(t, mustRender(t, v))
			var config string
			for _, o := range objs["v1/ConfigMap"] {
				cm := o.(*corev1.ConfigMap)
				switch {
				case strings.HasSuffix(cm.Name, "-config"):
					config = cm.Data["config.yaml"]
				case strings.HasSuffix(cm.Name, "-policies"):
					writeFiles(t, filepath.Join(etc, "policies"), cm.Data)
				}
			}
			for _, o := range objs["v1/Secret"] {
				writeFiles(t, filepath.Join(etc, "keys"), o.(*corev1.Secret).StringData)
			}
			// What comes from outside the chart: an existing keys Secret,
			// the Redis password, the /debug token.
			if strings.Contains(config, "/etc/infergate/keys") && !exists(filepath.Join(etc, "keys")) {
				writeFiles(t, filepath.Join(etc, "keys"), map[string]string{"keys.yaml": "keys:\n- {id: k1, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, tenant: acme}\n"})
			}
			if strings.Contains(config, "/etc/infergate/redis/password") {
				writeFiles(t, filepath.Join(etc, "redis"), map[string]string{"password": "secret"})
			}
			if strings.Contains(config, "/etc/infergate/debug/token") {
				writeFiles(t, filepath.Join(etc, "debug"), map[string]string{"token": "s3cret"})
			}
			if config == "" {
				t.Fatal("no config ConfigMap rendered")
			}
			path := filepath.Join(root, "config.yaml")
			if err := os.WriteFile(path, []byte(strings.ReplaceAll(config, "/etc/infergate/", etc+"/")), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput()
			if err != nil {
				t.Fatalf("infergate validate: %v\n%s\nconfig:\n%s", err, out, config)
			}
			t.Logf("%s", out)
		})
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// exported maps each Prometheus series name the dashboard may use to the
// OpenTelemetry instrument (or attribute) name infergate registers; the
// exporter turns dots into underscores and adds _seconds for unit "s" and
// _total for counters.
var exported = map[string]string{
	"gen_ai_server_time_to_first_token_seconds":   "gen_ai.server.time_to_first_token",
	"gen_ai_server_time_per_output_token_seconds": "gen_ai.server.time_per_output_token",
	"gen_ai_server_request_duration_seconds":      "gen_ai.server.request.duration",
	"gen_ai_client_token_usage":                   "gen_ai.client.token.usage",
	"infergate_inter_token_latency_seconds":       "infergate.inter_token_latency",
	"infergate_gateway_duration_seconds":          "infergate.gateway.duration",
	"infergate_checks_duration_seconds":           "infergate.checks.duration",
	"infergate_gate_duration_seconds":             "infergate.gate.duration",
	"infergate_gate_decisions_total":              "infergate.gate.decisions",
	"infergate_meter_active_streams":              "infergate.meter.active_streams",
	"infergate_meter_errors_total":                "infergate.meter.errors",
	"infergate_pool_weight":                       "infergate.pool.weight",
	"infergate_sla_decisions_total":               "infergate.sla.decisions",
	"infergate_ratelimit_limited_total":           "infergate.ratelimit.limited",
	"infergate_ratelimit_tokens_total":            "infergate.ratelimit.tokens",
	"infergate_admission_errors_total":            "infergate.admission.errors",
	"infergate_cost_total":                        "infergate.cost",
	// labels
	"gen_ai_request_model": "gen_ai.request.model",
	"gen_ai_token_type":    "gen_ai.token.type",
	"infergate_pool":       "infergate.pool",
	"infergate_tenant":     "infergate.tenant",
	"error_type":           "error.type",
	"virtual_model":        "virtual_model",
	"decision":             "decision",
	"code":                 "code",
	"reason":               "reason",
	"limit":                "limit",
	"op":                   "op",
	"state":                "state",
}

// TestDashboard checks the Grafana dashboard: it parses, takes its data
// source from a variable, and every series and label it queries is one
// infergate exports (checked against the instrument names in its source).
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "infergate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		SchemaVersion int `json:"schemaVersion"`
		UID           string
		Templating    struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title      string
			Type       string
			Datasource *struct{ UID string }   `json:"datasource"`
			Targets    []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion < 38 {
		t.Errorf("schemaVersion %d, want >= 38", d.SchemaVersion)
	}
	if len(d.Templating.List) == 0 || d.Templating.List[0].Type != "datasource" || d.Templating.List[0].Name != "datasource" {
		t.Errorf("the first variable must be the data source, got %+v", d.Templating.List)
	}

	source := mainModuleSource(t)
	series := regexp.MustCompile(`\b(gen_ai_[a-z_]+|infergate_[a-z_]+)\b`)
	byLabels := regexp.MustCompile(`by \(([^)]*)\)`)
	used := map[string]bool{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			names := series.FindAllString(target.Expr, -1)
			for _, m := range byLabels.FindAllStringSubmatch(target.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "le" {
						names = append(names, l)
					}
				}
			}
			for _, n := range names {
				n = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
				used[n] = true
				otel, ok := exported[n]
				if !ok {
					t.Errorf("panel %q queries %s, which infergate does not export (or add it to `exported`)", p.Title, n)
					continue
				}
				if !strings.Contains(source, `"`+otel+`"`) {
					t.Errorf("panel %q queries %s, but %q is no longer in infergate's source", p.Title, n, otel)
				}
			}
		}
	}
	// What the dashboard is for.
	for _, want := range []string{
		"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
		"gen_ai_client_token_usage", "infergate_gate_decisions_total", "infergate_pool_weight",
		"infergate_sla_decisions_total", "gen_ai_request_model", "infergate_pool",
		"infergate_cost_total", "infergate_tenant",
	} {
		if !used[want] {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// mainModuleSource is infergate's non-test Go source, concatenated.
func mainModuleSource(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	for _, dir := range []string{"extproc", "internal", "xds"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			sb.Write(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return sb.String()
}

// TestValuesRejected checks that mistakes fail at install time with a
// message that says what to change, instead of deploying something broken.
func TestValuesRejected(t *testing.T) {
	eg := func() map[string]any { return readValues(t, filepath.Join(chartDir, "ci", "envoygateway-values.yaml")) }
	cases := []struct {
		name string
		vals func() map[string]any
		want string
	}{
		{"typo at the top", func() map[string]any { return map[string]any{"serviceMonitr": map[string]any{"enabled": true}} }, "serviceMonitr"},
		{"typo inside", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"autoscaling": map[string]any{"maxReplica": 3}}}
		}, "maxReplica"},
		{"unknown mode", func() map[string]any { return map[string]any{"mode": "split"} }, "mode"},
		{"scaled without redis", func() map[string]any { return map[string]any{"mode": "scaled"} }, "set redis.address"},
		{"serve replicas without redis", func() map[string]any { return map[string]any{"extproc": map[string]any{"replicas": 3}} }, "set redis.address"},
		{"serve autoscaling without redis", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"autoscaling": map[string]any{"enabled": true}}}
		}, "set redis.address"},
		{"listen address in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"extproc": map[string]any{"listen": ":1234"}}}
		}, "config.extproc.listen is set by the chart; use the chart value ports.extproc"},
		{"authorization policy without the sidecars' identities", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true, "peerAuthentication": map[string]any{"enabled": true},
				"sidecar": map[string]any{"enabled": true, "workloadSelector": map[string]any{"app": "vllm"}}}}
		}, "istio.authorizationPolicy.sidecarIdentities"},
		{"authorization policy without the gateway's identities", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true, "peerAuthentication": map[string]any{"enabled": true},
				"sidecar": map[string]any{"gatewayIdentities": []any{}}}}
		}, "istio.sidecar.gatewayIdentities"},
		{"TLS neither on, off nor auto", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"tls": map[string]any{"enabled": "yes"}}}
		}, "enabled"},
		{"debug pages without a token", func() map[string]any {
			return map[string]any{"debug": map[string]any{"pprof": true}}
		}, "debug.tokenSecret.name"},
		{"debug pages in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"admin": map[string]any{"debug": map[string]any{"enabled": true}}}}
		}, "config.admin.debug is set by the chart; use the chart value debug"},
		{"plaintext opt-in in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"extproc": map[string]any{"insecureOpenToNetwork": false}}}
		}, "config.extproc.insecureOpenToNetwork is set by the chart; use the chart value extproc.tls"},
		{"extension server without the gate's policy", func() map[string]any {
			return map[string]any{"inferencePools": map[string]any{"extensionServer": map[string]any{"enabled": true}}}
		}, "it needs envoyGateway.enabled"},
		{"extension server in scaled mode without the controller", func() map[string]any {
			v := eg()
			v["mode"] = "scaled"
			v["redis"] = map[string]any{"address": "redis:6379"}
			v["inferencePools"] = map[string]any{"extensionServer": map[string]any{"enabled": true}}
			return v
		}, "served by the SLA controller"},
		{"extension server with two InferencePools in one rule", func() map[string]any {
			v := readValues(t, filepath.Join(chartDir, "ci", "inferencepools-values.yaml"))
			v["inferencePools"].(map[string]any)["extensionServer"] = map[string]any{"enabled": true}
			return v
		}, "a model has one InferencePool"},
		{"extension server in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"gatewayExtension": map[string]any{"enabled": true}}}
		}, "config.gatewayExtension is set by the chart; use the chart value inferencePools.extensionServer"},
		{"admin opt-in in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"admin": map[string]any{"openToNetwork": false}}}
		}, "config.admin.openToNetwork is set by the chart; use the chart value ports.admin"},
		{"redis address in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"ratelimit": map[string]any{"redis": map[string]any{"address": "r:6379"}}}}
		}, "config.ratelimit.redis.address is set by the chart"},
		{"bare on: in a retry", func() map[string]any {
			return map[string]any{"config": map[string]any{"virtualModels": []any{map[string]any{"name": "m", "retry": map[string]any{"true": "5xx"}}}}}
		}, `quote the key "on"`},
		{"bad key hash", func() map[string]any {
			return map[string]any{"apiKeys": map[string]any{"keys": []any{map[string]any{"id": "a", "tenant": "t", "sha256": "not-a-hash"}}}}
		}, "sha256"},
		{"route without models", func() map[string]any {
			v := eg()
			v["envoyGateway"].(map[string]any)["route"].(map[string]any)["models"] = []any{}
			return v
		}, "at least one model"},
		{"route without gateway", func() map[string]any {
			v := eg()
			delete(v["envoyGateway"].(map[string]any)["route"].(map[string]any), "parentRefs")
			return v
		}, "parentRefs"},
		{"too many models for one HTTPRoute", func() map[string]any {
			v := eg()
			var models []any
			for i := 0; i < 16; i++ {
				models = append(models, map[string]any{"name": "m" + itoa(i), "pools": []any{map[string]any{"name": "p", "port": 80, "weight": 1}}})
			}
			v["envoyGateway"].(map[string]any)["route"].(map[string]any)["models"] = models
			return v
		}, "models"},
		{"InferencePools without a gateway", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true}, "inferencePools": map[string]any{"models": []any{
				map[string]any{"name": "m", "pools": []any{map[string]any{"name": "p", "weight": 1}}}}}}
		}, "inferencePools.route.parentRefs"},
		{"InferencePools without the gate", func() map[string]any {
			return map[string]any{"inferencePools": map[string]any{"route": map[string]any{"parentRefs": []any{map[string]any{"name": "gw"}}},
				"models": []any{map[string]any{"name": "m", "pools": []any{map[string]any{"name": "p", "weight": 1}}}}}}
		}, "envoyGateway.enabled or istio.enabled"},
		{"a model on Services and on InferencePools", func() map[string]any {
			v := eg()
			v["inferencePools"] = map[string]any{"models": []any{map[string]any{"name": "llama-3-70b", "pools": []any{map[string]any{"name": "p", "weight": 1}}}}}
			return v
		}, "in both envoyGateway.route.models and inferencePools.models"},
		{"a Service pool of inferencePools with no valid port", func() map[string]any {
			v := eg()
			v["inferencePools"] = map[string]any{"models": []any{map[string]any{"name": "m", "pools": []any{map[string]any{"name": "p", "port": 70000, "weight": 1}}}}}
			return v
		}, "port"},
		{"istio sidecar without selector", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true, "sidecar": map[string]any{"enabled": true}}}
		}, "istio.sidecar.workloadSelector"},
		{"TLS without a Secret, an issuer or generated certificates", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"tls": map[string]any{"enabled": true, "generate": false}}}
		}, "extproc.tls.secretName"},
		{"default TLS without a Secret, an issuer or generated certificates", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"tls": map[string]any{"generate": false}}}
		}, "extproc.tls.generate: true"},
		{"TLS under Istio", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true}, "extproc": map[string]any{"tls": map[string]any{"enabled": true, "secretName": "s"}}}
		}, "istio.peerAuthentication"},
		{"TLS files in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"extproc": map[string]any{"tls": map[string]any{"certFile": "/c"}}}}
		}, "config.extproc.tls is set by the chart; use the chart value extproc.tls"},
		{"xDS TLS files in config", func() map[string]any {
			return map[string]any{"config": map[string]any{"xds": map[string]any{"tls": map[string]any{"certFile": "/c"}}}}
		}, "config.xds.tls is set by the chart; use the chart value xds.tls"},
		{"Envoy's client certificate without cert-manager", func() map[string]any {
			v := eg()
			v["envoyGateway"].(map[string]any)["clientCertificateNamespace"] = "envoy-gateway-system"
			v["extproc"] = map[string]any{"tls": map[string]any{"enabled": true, "secretName": "s"}}
			return v
		}, "extproc.tls.certManager.issuerRef"},
		{"issuer without a name", func() map[string]any {
			return map[string]any{"extproc": map[string]any{"tls": map[string]any{"enabled": true, "certManager": map[string]any{"issuerRef": map[string]any{"kind": "ClusterIssuer"}}}}}
		}, "name"},
		{"NetworkPolicy with no known peers", func() map[string]any {
			return map[string]any{"networkPolicy": map[string]any{"enabled": true}}
		}, "networkPolicy.extprocFrom"},
		{"NetworkPolicy peer misspelt", func() map[string]any {
			return map[string]any{"networkPolicy": map[string]any{"enabled": true, "extprocFrom": []any{map[string]any{"podSelectors": map[string]any{}}}}}
		}, "podSelectors"},
		{"gateway identity that is not a SPIFFE ID", func() map[string]any {
			return map[string]any{"istio": map[string]any{"enabled": true, "sidecar": map[string]any{
				"enabled": true, "workloadSelector": map[string]any{"app": "vllm"}, "gatewayIdentities": []any{"istio-ingressgateway"}}}}
		}, "gatewayIdentities"},
		{"PeerAuthentication without Istio", func() map[string]any {
			return map[string]any{"istio": map[string]any{"peerAuthentication": map[string]any{"enabled": true}}}
		}, "istio.peerAuthentication needs istio.enabled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(t, c.vals())
			if err == nil {
				t.Fatal("rendered without error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}
