package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The drop-in snippet users copy is exactly what the tested bootstraps run
// (demo.yaml, and sla.yaml with its routes over xDS): same filters, same
// local replies, same cluster protocol settings.
func TestSnippetMatchesTestedBootstrap(t *testing.T) {
	t.Parallel()
	var snippet struct {
		HTTPFilters          []any            `yaml:"http_filters"`
		LocalReplyConfig     any              `yaml:"local_reply_config"`
		ResponseHeadersToAdd any              `yaml:"response_headers_to_add"`
		Tracing              any              `yaml:"tracing"`
		Clusters             []map[string]any `yaml:"clusters"`
	}
	readYAML(t, "envoy/snippet.yaml", &snippet)
	for _, bootstrap := range []string{"envoy/demo.yaml", "envoy/sla.yaml", "envoy/inference-pool.yaml", "envoy/inference-pool-sla.yaml"} {
		t.Run(bootstrap, func(t *testing.T) {
			checkSnippet(t, bootstrap, snippet.HTTPFilters, snippet.LocalReplyConfig, snippet.Clusters)
		})
	}
	// The virtual-host response headers: static in demo.yaml; the xDS
	// server adds the same ones to the routes it serves (internal/cli).
	demo := readDemo(t, "envoy/demo.yaml")
	hcm := demo.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	vhost := hcm["route_config"].(map[string]any)["virtual_hosts"].([]any)[0].(map[string]any)
	if !reflect.DeepEqual(vhost["response_headers_to_add"], snippet.ResponseHeadersToAdd) {
		t.Errorf("envoy/snippet.yaml response_headers_to_add differs from envoy/demo.yaml's")
	}
	for _, bootstrap := range []string{"envoy/demo.yaml", "envoy/sla.yaml"} {
		tc := readDemo(t, bootstrap).StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig["tracing"]
		if !reflect.DeepEqual(tc, snippet.Tracing) {
			t.Errorf("envoy/snippet.yaml tracing differs from %s's", bootstrap)
		}
	}
}

// The gate filter forwards the headers gate.ForwardedHeaders lists (what the
// gate reads, the default policy headers) and every x-infergate-* under
// either spelling; infergate warns about policy headers outside them.
func TestSnippetForwardsGateHeaders(t *testing.T) {
	t.Parallel()
	var snippet struct {
		HTTPFilters []struct {
			Name        string `yaml:"name"`
			TypedConfig struct {
				ForwardRules struct {
					AllowedHeaders struct {
						Patterns []map[string]string `yaml:"patterns"`
					} `yaml:"allowed_headers"`
				} `yaml:"forward_rules"`
			} `yaml:"typed_config"`
		} `yaml:"http_filters"`
	}
	readYAML(t, "envoy/snippet.yaml", &snippet)
	var exact, prefix []string
	for _, p := range snippet.HTTPFilters[0].TypedConfig.ForwardRules.AllowedHeaders.Patterns {
		if len(p) != 1 {
			t.Fatalf("pattern %v", p)
		}
		exact, prefix = appendNonEmpty(exact, p["exact"]), appendNonEmpty(prefix, p["prefix"])
	}
	if snippet.HTTPFilters[0].Name != "infergate.gate" || !slices.Equal(exact, gate.ForwardedHeaders) ||
		!slices.Equal(prefix, []string{request.ReservedHeaderPrefix, strings.ReplaceAll(request.ReservedHeaderPrefix, "-", "_")}) {
		t.Errorf("the gate forwards %v and prefixes %v; want %v and x-infergate-, x_infergate_", exact, prefix, gate.ForwardedHeaders)
	}
	def, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if extra := gate.UnforwardedHeaders(def.Auth.PolicyHeaders); len(extra) > 0 {
		t.Errorf("the default policy headers %v are not forwarded to the gate", extra)
	}
}

func appendNonEmpty(s []string, v string) []string {
	if v == "" {
		return s
	}
	return append(s, v)
}

type bootstrapDoc struct {
	StaticResources struct {
		Listeners []struct {
			FilterChains []struct {
				Filters []struct {
					TypedConfig map[string]any `yaml:"typed_config"`
				} `yaml:"filters"`
			} `yaml:"filter_chains"`
		} `yaml:"listeners"`
		Clusters []map[string]any `yaml:"clusters"`
	} `yaml:"static_resources"`
}

func readDemo(t *testing.T, bootstrap string) bootstrapDoc {
	t.Helper()
	var demo bootstrapDoc
	rendered := renderEnvoy(t, bootstrap, map[string]string{"LISTEN_PORT": "1", "ADMIN_PORT": "2",
		"EXTPROC_PORT": "3", "POOL_A_PORT": "4", "POOL_B_PORT": "5", "JWKS_FILE": "/jwks.json", "XDS_PORT": "6", "OTLP_PORT": "7", "EPP_PORT": "8"})
	if err := yaml.Unmarshal([]byte(rendered), &demo); err != nil {
		t.Fatalf("%s: %v", bootstrap, err)
	}
	return demo
}

func checkSnippet(t *testing.T, bootstrap string, filters []any, localReply any, clusters []map[string]any) {
	demo := readDemo(t, bootstrap)

	hcm := demo.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	var infergateFilters []any
	for _, f := range hcm["http_filters"].([]any) {
		if name, _ := f.(map[string]any)["name"].(string); strings.HasPrefix(name, "infergate.") {
			infergateFilters = append(infergateFilters, f)
		}
	}
	if len(infergateFilters) != 3 || !reflect.DeepEqual(infergateFilters, filters) {
		t.Errorf("envoy/snippet.yaml http_filters differ from %s's infergate filters", bootstrap)
	}
	if !reflect.DeepEqual(hcm["local_reply_config"], localReply) {
		t.Errorf("envoy/snippet.yaml local_reply_config differs from %s's", bootstrap)
	}
	demoCluster, snippetCluster := clusterNamed(demo.StaticResources.Clusters, "infergate"), clusterNamed(clusters, "infergate")
	if demoCluster == nil || snippetCluster == nil {
		t.Fatal("infergate cluster missing")
	}
	for _, k := range []string{"name", "connect_timeout", "typed_extension_protocol_options"} {
		if !reflect.DeepEqual(demoCluster[k], snippetCluster[k]) {
			t.Errorf("infergate cluster %s differs between %s and the snippet", k, bootstrap)
		}
	}
}

func clusterNamed(clusters []map[string]any, name string) map[string]any {
	for _, c := range clusters {
		if c["name"] == name {
			return c
		}
	}
	return nil
}

// grpcClusters are the clusters v's gRPC services (envoy_grpc) name.
func grpcClusters(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if g, ok := v["envoy_grpc"].(map[string]any); ok {
			out = append(out, g["cluster_name"].(string))
		}
		for _, e := range v {
			out = append(out, grpcClusters(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, grpcClusters(e)...)
		}
	}
	return out
}

// The snippet works unedited next to infergate on the same machine: put
// into a bootstrap with nothing but a router and a route, real Envoy
// accepts it (every cluster it names is one it defines), and the infergate
// cluster is serve's default address, 127.0.0.1:50051.
func TestSnippetIsCompleteOnLoopback(t *testing.T) {
	t.Parallel()
	var snippet map[string]any
	readYAML(t, "envoy/snippet.yaml", &snippet)
	var clusters []map[string]any
	for _, c := range snippet["clusters"].([]any) {
		clusters = append(clusters, c.(map[string]any))
	}
	ig := clusterNamed(clusters, "infergate")
	addr, _ := yaml.Marshal(ig["load_assignment"])
	if !strings.Contains(string(addr), "address: 127.0.0.1") || !strings.Contains(string(addr), "port_value: 50051") {
		t.Errorf("the snippet's infergate cluster is not 127.0.0.1:50051:\n%s", addr)
	}
	// Envoy resolves a tracer's cluster only when it exports: validate
	// mode passes an undefined one, so every gRPC service's is checked here.
	for _, name := range grpcClusters(snippet) {
		if clusterNamed(clusters, name) == nil {
			t.Errorf("the snippet names cluster %q and does not define it", name)
		}
	}
	filters := append(snippet["http_filters"].([]any), map[string]any{"name": "envoy.filters.http.router",
		"typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
	bootstrap := map[string]any{
		"static_resources": map[string]any{
			"listeners": []any{map[string]any{
				"name":    "llm",
				"address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 10000}},
				"filter_chains": []any{map[string]any{"filters": []any{map[string]any{
					"name": "envoy.filters.network.http_connection_manager",
					"typed_config": map[string]any{
						"@type":              "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
						"stat_prefix":        "llm",
						"http_filters":       filters,
						"local_reply_config": snippet["local_reply_config"],
						"tracing":            snippet["tracing"],
						"route_config": map[string]any{"virtual_hosts": []any{map[string]any{
							"name": "llm", "domains": []any{"*"},
							"response_headers_to_add": snippet["response_headers_to_add"],
							"routes": []any{map[string]any{"match": map[string]any{"prefix": "/"},
								"route": map[string]any{"cluster": "infergate"}}},
						}}},
					},
				}}}},
			}},
			"clusters": snippet["clusters"],
		},
	}
	b, err := yaml.Marshal(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snippet-bootstrap.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(envoytest.Binary(t), "--mode", "validate", "-c", path, "--log-level", "warn").CombinedOutput(); err != nil {
		t.Errorf("envoy --mode validate on envoy/snippet.yaml in a bootstrap: %v\n%s", err, out)
	}
}

func readYAML(t *testing.T, rel string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// Every shipped Envoy config drops headers with underscores: only the gate
// sets x-infergate-*, under any spelling.
func TestShippedConfigsDropUnderscoreHeaders(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"envoy/demo.yaml", "envoy/sla.yaml", "envoy/overhead.yaml", "envoy/overhead-plain.yaml", "envoy/xds-test.yaml", "envoy/inference-pool.yaml", "envoy/inference-pool-sla.yaml"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "headers_with_underscores_action: DROP_HEADER") {
			t.Errorf("%s does not drop headers with underscores", f)
		}
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy/gateway/standalone.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "withUnderscoresAction: DropHeader") {
		t.Error("envoy/gateway/standalone.yaml's ClientTrafficPolicy does not drop headers with underscores")
	}
}

// Envoy Gateway's usage filter (envoy/gateway/standalone.yaml's Lua, which
// TestEnvoyGatewayStandalone runs) is envoy/snippet.yaml's infergate.usage
// script, byte for byte (test/charts keeps the chart's copy identical too).
func TestEnvoyGatewayUsageLuaMatchesSnippet(t *testing.T) {
	t.Parallel()
	var snippet struct {
		HTTPFilters []struct {
			Name        string `yaml:"name"`
			TypedConfig struct {
				DefaultSourceCode struct {
					InlineString string `yaml:"inline_string"`
				} `yaml:"default_source_code"`
			} `yaml:"typed_config"`
		} `yaml:"http_filters"`
	}
	readYAML(t, "envoy/snippet.yaml", &snippet)
	var want string
	for _, f := range snippet.HTTPFilters {
		if f.Name == "infergate.usage" {
			want = f.TypedConfig.DefaultSourceCode.InlineString
		}
	}
	if !strings.Contains(want, "function envoy_on_response") {
		t.Fatalf("envoy/snippet.yaml has no infergate.usage script (got %q)", want)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy/gateway/standalone.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var found int
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if !strings.Contains(doc, "\nkind: EnvoyExtensionPolicy\n") {
			continue
		}
		var policy struct {
			Spec struct {
				Lua []struct{ Type, Inline string } `yaml:"lua"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &policy); err != nil {
			t.Fatal(err)
		}
		for _, l := range policy.Spec.Lua {
			found++
			if l.Type != "Inline" || l.Inline != want {
				t.Errorf("envoy/gateway/standalone.yaml's Lua (%s) differs from envoy/snippet.yaml's infergate.usage script", l.Type)
			}
		}
	}
	if found != 1 {
		t.Errorf("envoy/gateway/standalone.yaml has %d Lua filters, want the usage filter", found)
	}
}
