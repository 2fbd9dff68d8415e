package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// Test API keys for the tenants of policies/data.yaml.
var testKeys = map[string]struct{ id, tenant, tier string }{
	"sk-acme-0001":     {"acme-prod", "acme", ""},            // premium
	"sk-globex-0001":   {"globex-app", "globex", ""},         // standard
	"sk-initech-0001":  {"initech-dev", "initech", ""},       // free
	"sk-acme-batch":    {"acme-batch", "acme", "free"},       // a premium tenant's key held to the free tier
	"sk-load-0001":     {"load-client", "loadtest", ""},      // see loadData
	"sk-vandelay-0001": {"vandelay-indexer", "vandelay", ""}, // search: embeddings only
}

// writeKeys writes a keys file (hashes only) and returns its path.
func writeKeys(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("keys:\n")
	for key, k := range testKeys {
		sum := sha256.Sum256([]byte(key))
		fmt.Fprintf(&b, "- id: %s\n  sha256: %s\n  tenant: %s\n", k.id, hex.EncodeToString(sum[:]), k.tenant)
		if k.tier != "" {
			fmt.Fprintf(&b, "  labels: {tier: %s}\n", k.tier)
		}
	}
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// copyPolicies copies policies/ into a temp dir the test may edit.
func copyPolicies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join(repoRoot, "policies"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".rego") || strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".json")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, "policies", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644)
	}
	return dir
}

func policyConfig(keys, policyDir, extra string) string {
	return fmt.Sprintf(`
auth:
  keys: %s
  jwt: {enabled: true}
policy:
  dir: %s
  reloadInterval: 200ms
log: {level: debug}
%s`, keys, policyDir, extra)
}

type call struct {
	method, path, key, body string
	hdr                     map[string]string
}

func (c call) do(t *testing.T, base string) (*http.Response, openAIError) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		req.Header.Set("content-type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("authorization", "Bearer "+c.key)
	}
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e openAIError
	if resp.StatusCode >= 400 && req.Method != http.MethodHead {
		_ = jsonDecode(resp, &e)
	} else {
		drain(resp)
	}
	resp.Body.Close()
	return resp, e
}

func chatCall(key, model string, maxTokens int) call {
	return call{method: "POST", path: "/v1/chat/completions", key: key, body: chatBody(model, maxTokens, true, "")}
}

func embeddingsCall(key, model string) call {
	return call{method: "POST", path: "/v1/embeddings", key: key, body: `{"model":"` + model + `","input":["one sentence","another"]}`}
}

// Keys, tenants, tiers and models decide through the real Envoy with the
// shipped policies; JWT claims verified by Envoy's jwt_authn decide too.
func TestPolicyDecidesThroughEnvoy(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), ""), 1)
	jwt := testIssuer(t)
	cases := []struct {
		name   string
		call   call
		status int
		code   string
	}{
		{"no credentials", chatCall("", "llama-3.1-8b-instruct", 8), 401, "invalid_api_key"},
		{"unknown key", chatCall("sk-nope", "llama-3.1-8b-instruct", 8), 401, "invalid_api_key"},
		{"free tier, small model", chatCall("sk-initech-0001", "llama-3.1-8b-instruct", 8), 200, ""},
		{"free tier, large model", chatCall("sk-initech-0001", "llama-3.1-70b-instruct", 8), 403, "permission_denied"},
		{"standard tier, large model", chatCall("sk-globex-0001", "llama-3.1-70b-instruct", 8), 200, ""},
		{"standard tier, max_tokens over the cap", chatCall("sk-globex-0001", "llama-3.1-70b-instruct", 5000), 400, "invalid_request"},
		{"premium tier, any model", chatCall("sk-acme-0001", "some-new-model", 8), 200, ""},
		{"premium tenant, key held to free", chatCall("sk-acme-batch", "some-new-model", 8), 403, "permission_denied"},
		{"JWT standard tenant", chatCall(jwt.sign(t, map[string]any{"sub": "alice", "tenant": "globex"}), "llama-3.1-70b-instruct", 8), 200, ""},
		{"JWT free tenant", chatCall(jwt.sign(t, map[string]any{"sub": "bob", "tenant": "initech"}), "llama-3.1-70b-instruct", 8), 403, "permission_denied"},
		{"search tier, embeddings", embeddingsCall("sk-vandelay-0001", "bge-m3"), 200, ""},
		{"search tier, chat", chatCall("sk-vandelay-0001", "bge-m3", 8), 403, "permission_denied"},
		{"search tier, embeddings of another model", embeddingsCall("sk-vandelay-0001", "llama-3.1-8b-instruct"), 403, "permission_denied"},
		{"JWT with a bad signature", chatCall(jwt.sign(t, map[string]any{"sub": "eve", "tenant": "acme"})+"x", "llama-3.1-8b-instruct", 8), 401, "invalid_api_key"},
	}
	allowed := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, e := c.call.do(t, s.Envoy.URL)
			if resp.StatusCode != c.status || e.Error.Code != c.code {
				t.Fatalf("status %d code %q (%s), want %d %q", resp.StatusCode, e.Error.Code, e.Error.Message, c.status, c.code)
			}
			if strings.Contains(e.Error.Message, "sk-") {
				t.Errorf("a key leaked into the error: %s", e.Error.Message)
			}
			if c.status == 200 {
				allowed++
				for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
					"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
					if resp.Header.Get(h) == "" {
						t.Errorf("admitted response lacks %s", h)
					}
				}
			}
		})
	}
	if n := s.served(); n != int64(allowed) {
		t.Errorf("pools served %d requests; %d were allowed", n, allowed)
	}
	if log := s.Gateway.requests.String(); strings.Contains(log, "sk-") {
		t.Error("a key reached the request log")
	}
}

// Every request gets the policy's decision, whatever its method, path or
// headers; only allowed ones reach a pool.
func TestNoRequestBypassesTheGate(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), ""), 1)
	key := "sk-initech-0001" // free tier
	cases := []struct {
		name   string
		call   call
		status int
	}{
		{"GET /v1/models without a key", call{method: "GET", path: "/v1/models"}, 401},
		{"GET /v1/models with a key", call{method: "GET", path: "/v1/models", key: key}, 200},
		{"DELETE a completion", call{method: "DELETE", path: "/v1/chat/completions", key: key}, 405},
		{"HEAD", call{method: "HEAD", path: "/v1/models", key: key}, 404},
		{"double slash", call{method: "POST", path: "//v1/chat/completions", key: key, body: chatBody("llama-3.1-8b-instruct", 4, true, "")}, 200},
		{"dot segments", call{method: "POST", path: "/v1/x/../chat/completions", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, "")}, 403},
		{"percent-encoded letters", call{method: "POST", path: "/v1/chat/%63ompletions", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, "")}, 403},
		// Envoy itself refuses escaped slashes (path_with_escaped_slashes_action).
		{"encoded slash", call{method: "POST", path: "/v1/chat%2Fcompletions", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, "")}, 400},
		{"trailing dot", call{method: "POST", path: "/v1/chat/completions.", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, "")}, 404},
		{"mixed case", call{method: "POST", path: "/V1/Chat/Completions", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, "")}, 404},
		{"spoofed tenant header", call{method: "POST", path: "/v1/chat/completions", key: key, body: chatBody("llama-3.1-70b-instruct", 4, true, ""),
			hdr: map[string]string{"x-infergate-tenant": "acme", "x-infergate-model": "pool-a"}}, 403},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.served()
			resp, e := c.call.do(t, s.Envoy.URL)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, e.Error.Message, c.status)
			}
			reached := s.served() > before
			if resp.StatusCode >= 400 && reached {
				t.Fatalf("denied with %d but reached a pool", resp.StatusCode)
			}
			if c.name != "encoded slash" { // the gate saw it: its decision is stamped
				id := resp.Header.Get("x-request-id")
				if id == "" {
					t.Fatal("no x-request-id on the response")
				}
				st := s.Gateway.stamp(t, id)
				if st.Decision == "" {
					t.Errorf("no decision recorded: %+v", st)
				}
			}
		})
	}
}

// A key added to the keys file works within 2 s, without a restart.
func TestKeysReload(t *testing.T) {
	keysPath := writeKeys(t)
	s := startStackWith(t, policyConfig(keysPath, filepath.Join(repoRoot, "policies"), ""), 1)
	c := chatCall("sk-new-globex", "llama-3.1-8b-instruct", 4)
	if resp, _ := c.do(t, s.Envoy.URL); resp.StatusCode != 401 {
		t.Fatalf("unknown key: %d", resp.StatusCode)
	}
	sum := sha256.Sum256([]byte("sk-new-globex"))
	f, err := os.OpenFile(keysPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "- id: globex-new\n  sha256: %s\n  tenant: globex\n", hex.EncodeToString(sum[:]))
	f.Close()
	start := time.Now()
	testutil.Eventually(t, 2*time.Second, func() bool {
		resp, _ := c.do(t, s.Envoy.URL)
		return resp.StatusCode == 200
	}, "the new key to be accepted")
	t.Logf("new key accepted after %v", time.Since(start))
}
