package e2e

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The drop-in snippet users copy is exactly what the tested demo bootstrap
// runs: same filters, same local replies, same cluster protocol settings.
func TestSnippetMatchesTestedBootstrap(t *testing.T) {
	var demo struct {
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
	var snippet struct {
		HTTPFilters          []any            `yaml:"http_filters"`
		LocalReplyConfig     any              `yaml:"local_reply_config"`
		ResponseHeadersToAdd any              `yaml:"response_headers_to_add"`
		Clusters             []map[string]any `yaml:"clusters"`
	}
	demoYAML := renderEnvoy(t, "envoy/demo.yaml", map[string]string{"LISTEN_PORT": "1", "ADMIN_PORT": "2",
		"EXTPROC_PORT": "3", "POOL_A_PORT": "4", "POOL_B_PORT": "5", "JWKS_FILE": "/jwks.json"})
	if err := yaml.Unmarshal([]byte(demoYAML), &demo); err != nil {
		t.Fatalf("envoy/demo.yaml: %v", err)
	}
	readYAML(t, "envoy/snippet.yaml", &snippet)

	hcm := demo.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	var infergateFilters []any
	for _, f := range hcm["http_filters"].([]any) {
		if name, _ := f.(map[string]any)["name"].(string); strings.HasPrefix(name, "infergate.") {
			infergateFilters = append(infergateFilters, f)
		}
	}
	if len(infergateFilters) != 2 || !reflect.DeepEqual(infergateFilters, snippet.HTTPFilters) {
		t.Errorf("envoy/snippet.yaml http_filters differ from envoy/demo.yaml's infergate filters")
	}
	vhost := hcm["route_config"].(map[string]any)["virtual_hosts"].([]any)[0].(map[string]any)
	if !reflect.DeepEqual(vhost["response_headers_to_add"], snippet.ResponseHeadersToAdd) {
		t.Errorf("envoy/snippet.yaml response_headers_to_add differs from envoy/demo.yaml's")
	}
	if !reflect.DeepEqual(hcm["local_reply_config"], snippet.LocalReplyConfig) {
		t.Errorf("envoy/snippet.yaml local_reply_config differs from envoy/demo.yaml's")
	}
	var demoCluster map[string]any
	for _, c := range demo.StaticResources.Clusters {
		if c["name"] == "infergate" {
			demoCluster = c
		}
	}
	if demoCluster == nil || len(snippet.Clusters) != 1 {
		t.Fatal("infergate cluster missing")
	}
	for _, k := range []string{"name", "connect_timeout", "typed_extension_protocol_options"} {
		if !reflect.DeepEqual(demoCluster[k], snippet.Clusters[0][k]) {
			t.Errorf("infergate cluster %s differs between demo and snippet", k)
		}
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
