package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// TestPeerLanes checks the peer lanes' wiring without installing, running
// or timing a peer (make bench-overhead does that): each lane's command,
// environment and headers point at the mock and pass its cadence on,
// LiteLLM's config reads what the harness sets, scripts/install-peers.sh
// prints every name a launch reads, and the report has its peers section.
func TestPeerLanes(t *testing.T) {
	root := envoytest.RepoRoot
	const mockURL, port = "http://127.0.0.1:4000/v1", 4321
	vars := map[string]string{
		"LITELLM_BIN": "/peers/litellm", "LITELLM_VERSION": "1.2.3",
		"NODE_BIN": "/peers/node", "PORTKEY_SERVER": "/peers/start-server.js", "PORTKEY_VERSION": "4.5.6",
	}
	script, err := os.ReadFile(filepath.Join(root, "scripts", "install-peers.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range allPeers {
		for _, name := range peerInstallVars[key] {
			if !strings.Contains(string(script), "printf '"+name+"=%q\\n'") {
				t.Errorf("%s: scripts/install-peers.sh does not print %s", key, name)
			}
			without := maps.Clone(vars)
			delete(without, name)
			if _, err := launchPeer(root, key, without, port, mockURL); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s without %s: %v, want an error naming it", key, name, err)
			}
		}
	}
	if _, err := launchPeer(root, "nginx", vars, port, mockURL); err == nil {
		t.Error("an unknown peer launched")
	}

	lite, err := launchPeer(root, peerLiteLLM, vars, port, mockURL)
	if err != nil {
		t.Fatal(err)
	}
	if lite.bin != vars["LITELLM_BIN"] || lite.version != "1.2.3" || lite.ready != "/health/liveliness" {
		t.Errorf("litellm launch: %+v", lite)
	}
	for _, want := range [][]string{{"--host", "127.0.0.1"}, {"--port", "4321"}, {"--num_workers", "1"}} {
		if i := slices.Index(lite.args, want[0]); i < 0 || i+1 >= len(lite.args) || lite.args[i+1] != want[1] {
			t.Errorf("litellm args %q lack %s %s", lite.args, want[0], want[1])
		}
	}
	for _, want := range []string{"MOCK_API_BASE=" + mockURL, "LITELLM_MASTER_KEY=" + benchKey} {
		if !slices.Contains(lite.env, want) {
			t.Errorf("litellm env %q lacks %s", lite.env, want)
		}
	}
	i := slices.Index(lite.args, "--config")
	if i < 0 || i+1 >= len(lite.args) {
		t.Fatalf("litellm args %q: no --config", lite.args)
	}
	raw, err := os.ReadFile(lite.args[i+1])
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ModelList []struct {
			LiteLLMParams struct {
				APIBase string `yaml:"api_base"`
			} `yaml:"litellm_params"`
		} `yaml:"model_list"`
		GeneralSettings struct {
			MasterKey      string `yaml:"master_key"`
			ForwardHeaders bool   `yaml:"forward_client_headers_to_llm_api"`
		} `yaml:"general_settings"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ModelList) == 0 || cfg.ModelList[0].LiteLLMParams.APIBase != "os.environ/MOCK_API_BASE" {
		t.Errorf("litellm.yaml: the model's api_base is not the harness's MOCK_API_BASE: %+v", cfg.ModelList)
	}
	if cfg.GeneralSettings.MasterKey != "os.environ/LITELLM_MASTER_KEY" || !cfg.GeneralSettings.ForwardHeaders {
		t.Errorf("litellm.yaml: master key from LITELLM_MASTER_KEY and the client's headers forwarded, got %+v", cfg.GeneralSettings)
	}

	pk, err := launchPeer(root, peerPortkey, vars, port, mockURL)
	if err != nil {
		t.Fatal(err)
	}
	if pk.bin != vars["NODE_BIN"] || pk.version != "4.5.6" || pk.ready != "/" ||
		!slices.Equal(pk.args, []string{vars["PORTKEY_SERVER"], "--port=4321", "--headless"}) {
		t.Errorf("portkey launch: %+v", pk)
	}
	if pk.headers["x-portkey-provider"] != "openai" || pk.headers["x-portkey-custom-host"] != mockURL {
		t.Errorf("portkey headers %v: not the mock as an OpenAI provider", pk.headers)
	}
	if fwd := strings.Split(pk.headers["x-portkey-forward-headers"], ","); !slices.Equal(fwd, mockHeaders) {
		t.Errorf("portkey forwards %q, want the mock's cadence headers %q", fwd, mockHeaders)
	}
	// Later @hono/node-server releases fail Portkey's streams (peerInfo).
	var pkg struct {
		Overrides map[string]string `json:"overrides"`
	}
	raw, err = os.ReadFile(filepath.Join(root, "bench/overhead/peers/portkey/package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatal(err)
	}
	if pkg.Overrides["@hono/node-server"] != "1.14.1" {
		t.Errorf("portkey package.json does not hold @hono/node-server at 1.14.1: %+v", pkg)
	}

	rep := &Report{}
	for _, key := range allPeers {
		rep.Peers = append(rep.Peers, peerInfo(key))
	}
	md := peersMarkdown(rep)
	for _, want := range []string{"**Peers**", "LiteLLM proxy", "Portkey gateway", "infergate over each peer", "**auth:**"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
