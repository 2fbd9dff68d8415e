package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil"
)

// A pool's own upstream credential (envoy/pool-credential.yaml): the gate
// removes the client's key, and Envoy sets pool-b's key on pool-b's cluster
// (an upstream credential_injector filter reading a generic secret through
// file-based SDS), whatever route picked the cluster. The key is read from
// a file laid out like a mounted Kubernetes Secret and rotated the way the
// kubelet does it. pool-b is a hosted API over TLS (poolcred_tls_test.go).

const poolCredBootstrap = "envoy/pool-credential.yaml"

// secretVolume is a directory laid out like a Kubernetes Secret volume:
// api-key -> ..data/api-key, ..data -> ..<version>/.
type secretVolume struct {
	dir     string
	version int
}

func newSecretVolume(t *testing.T, key string) *secretVolume {
	t.Helper()
	v := &secretVolume{dir: filepath.Join(t.TempDir(), "pool-b-secret")}
	if err := os.Mkdir(v.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v.write(t, key)
	if err := os.Symlink(filepath.Join("..data", "api-key"), v.path()); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *secretVolume) path() string { return filepath.Join(v.dir, "api-key") }

// write puts key in a new version directory and swaps ..data to it with a
// rename, atomically, as the kubelet's atomic writer does.
func (v *secretVolume) write(t *testing.T, key string) {
	t.Helper()
	v.version++
	ver := fmt.Sprintf("..v%d", v.version)
	if err := os.Mkdir(filepath.Join(v.dir, ver), 0o755); err != nil {
		t.Fatal(err)
	}
	// With a trailing newline, as `kubectl create secret --from-file` of a
	// file written by echo would have it: Envoy trims it.
	if err := os.WriteFile(filepath.Join(v.dir, ver, "api-key"), []byte(key+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// writeCredentialSDS writes the SDS file naming the key file (what a
// ConfigMap would hold: no secret in it) and returns its path.
func writeCredentialSDS(t *testing.T, keyFile string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pool-b-credential.yaml")
	sds := `resources:
- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
  name: pool-b-credential
  generic_secret: {secret: {filename: ` + keyFile + `}}
`
	if err := os.WriteFile(path, []byte(sds), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startPoolCredStack is startHostedStack with the harness's config and
// the right certificate.
func startPoolCredStack(t *testing.T, key string) (*stack, *secretVolume, *hostedPool) {
	t.Helper()
	return startHostedStack(t, key, hostedOptions{})
}

// authAt sends one chat completion for model with the client's own
// credentials (key as a Bearer token and as x-api-key) and returns the Authorization and x-api-key values the pool
// that served it received, and which pool that was.
func authAt(t *testing.T, s *stack, key, model string, stream bool) (servedBy string, auth, apiKey []string) {
	t.Helper()
	a, b := s.PoolA.Served(), s.PoolB.Served()
	c := call{method: "POST", path: "/v1/chat/completions", key: key, body: chatBody(model, 4, stream, ""),
		hdr: map[string]string{"x-api-key": key}}
	if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("%s: status %d: %+v", model, resp.StatusCode, e)
	}
	p := s.PoolA
	servedBy = "pool-a"
	switch {
	case s.PoolB.Served() > b && s.PoolA.Served() == a:
		p, servedBy = s.PoolB, "pool-b"
	case s.PoolA.Served() > a && s.PoolB.Served() == b:
	default:
		t.Fatalf("%s: served by neither or both pools", model)
	}
	h, _ := p.LastRequest()
	return servedBy, h.Values("Authorization"), h.Values("X-Api-Key")
}

func TestPoolCredentialInjectedPerCluster(t *testing.T) {
	const key1, key2 = "sk-pool-b-first-3f9a1c", "sk-pool-b-second-7be042"
	s, vol, hosted := startPoolCredStack(t, key1)

	// pool-b: exactly its own key, one value; the client's key is gone.
	_, auth, apiKey := authAt(t, s, "sk-client", "pool-b", false)
	if want := []string{"Bearer " + key1}; !reflect.DeepEqual(auth, want) {
		t.Errorf("pool-b received Authorization %q, want %q", auth, want)
	}
	if len(apiKey) > 0 {
		t.Errorf("pool-b received x-api-key %q", apiKey)
	}
	// pool-a: no credential at all (testConfig has no API keys: the gate
	// removes the client's credential headers regardless).
	_, auth, apiKey = authAt(t, s, "sk-client", "pool-a", false)
	if len(auth) > 0 || len(apiKey) > 0 {
		t.Errorf("pool-a received Authorization %q, x-api-key %q; want none", auth, apiKey)
	}
	// A virtual model split 80/20 over both pools: the key follows the
	// cluster Envoy picked, not the route.
	seen := map[string]bool{}
	for i := 0; i < 60 && !(seen["pool-a"] && seen["pool-b"]); i++ {
		pool, auth, _ := authAt(t, s, "sk-client", "some-virtual-model", false)
		seen[pool] = true
		want := []string(nil)
		if pool == "pool-b" {
			want = []string{"Bearer " + key1}
		}
		if !reflect.DeepEqual(auth, want) {
			t.Fatalf("virtual model via %s: Authorization %q, want %q", pool, auth, want)
		}
	}
	if !seen["pool-a"] || !seen["pool-b"] {
		t.Fatalf("the weighted route picked only %v in 60 requests", seen)
	}

	// Rotation: a Secret update (..data swap) reaches Envoy without a restart.
	vol.write(t, key2)
	rotatedAt := time.Now()
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, auth, _ := authAt(t, s, "sk-client", "pool-b", false)
		return reflect.DeepEqual(auth, []string{"Bearer " + key2})
	}, "pool-b to receive the rotated key")
	t.Logf("rotated key in use after %v", time.Since(rotatedAt).Round(time.Millisecond))

	// Streaming through the injecting cluster: byte-exact, new key, event by
	// event (in lock step).
	hdr := map[string]string{"x-mock-ttft-ms": "50", "x-mock-itl-ms": "20", "authorization": "Bearer sk-client"}
	got := mustLockstep(t, hosted, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-b", 12, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("stream: status %d: %s", got.Status, got.Body)
	}
	h, _ := s.PoolB.LastRequest()
	if want := []string{"Bearer " + key2}; !reflect.DeepEqual(h.Values("Authorization"), want) {
		t.Errorf("stream: pool-b received Authorization %q, want %q", h.Values("Authorization"), want)
	}
	want := unasked(t, stream(t, hosted.PlainURL+"/v1/chat/completions",
		chatBody("pool-b", 12, true, `,"stream_options":{"include_usage":true}`), hdr))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("stream through the gateway differs from the direct one\n got: %q\nwant: %q", got.Body, want.Body)
	}
	if n := len(contentEvents(got.Events)); n != 12 {
		t.Errorf("stream: %d content events, want 12", n)
	}
	if st := s.Gateway.stamp(t, got.RequestID); st.Pool != "pool-b" || !st.Complete || st.Status != 200 {
		t.Errorf("stream stamp = %+v", st)
	}

	// Never in plain text: not in Envoy's config dump (which does hold the
	// secret resource, redacted), not in infergate's request log or pages.
	dump := get(t, s.Envoy.AdminURL+"/config_dump?include_eds")
	if !strings.Contains(dump, `"pool-b-credential"`) || !strings.Contains(dump, "dynamic_active_secrets") {
		t.Fatalf("the config dump has no pool-b-credential secret: the check below would prove nothing")
	}
	recent := get(t, s.Gateway.AdminURL+"/debug/requests?format=json")
	if !strings.Contains(recent, got.RequestID) {
		t.Errorf("/debug/requests does not list the stream %s", got.RequestID)
	}
	for name, text := range map[string]string{
		"envoy /config_dump":           dump,
		"infergate request log":        s.Gateway.requests.String(),
		"infergate /debug/requests":    recent,
		"the client's response header": fmt.Sprint(got.Header),
	} {
		for _, key := range []string{key1, key2} {
			if strings.Contains(text, key) {
				t.Errorf("%s contains pool-b's key %q", name, key)
			}
		}
	}
	if strings.Contains(dump, vol.dir) {
		t.Errorf("envoy /config_dump shows the key file's path %s (Envoy 1.40 redacts it)", vol.dir)
	}
}

// envoy/pool-credential.yaml is envoy/demo.yaml plus the node, the hosted
// pool-b cluster (TLS, DNS, credential) and auto_host_rewrite on the routes
// that may pick it: the same infergate filters, routes and other clusters.
func TestPoolCredentialBootstrapMatchesDemo(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"LISTEN_PORT": "1", "ADMIN_PORT": "2", "EXTPROC_PORT": "3", "POOL_A_PORT": "4",
		"POOL_B_PORT": "5", "JWKS_FILE": "/jwks.json", "XDS_PORT": "6", "OTLP_PORT": "7", "POOL_B_CREDENTIAL_SDS": "/sds.yaml",
		"POOL_B_HOST": "api.example.com", "POOL_B_ADDRESS": "api.example.com", "POOL_B_CA": "/ca.crt"}
	parse := func(rel string) map[string]any {
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(renderEnvoy(t, rel, vars)), &doc); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return doc
	}
	demo, cred := parse("envoy/demo.yaml"), parse(poolCredBootstrap)
	if node, ok := cred["node"].(map[string]any); !ok || node["id"] == nil || node["cluster"] == nil {
		t.Errorf("%s: file-based SDS needs node.id and node.cluster, got %v", poolCredBootstrap, cred["node"])
	}
	delete(cred, "node")
	// pool-b's cluster as a whole: the tests that run it check what it does.
	for _, doc := range []map[string]any{demo, cred} {
		res := doc["static_resources"].(map[string]any)
		var kept []any
		for _, c := range res["clusters"].([]any) {
			if c.(map[string]any)["name"] != "pool-b" {
				kept = append(kept, c)
			}
		}
		res["clusters"] = kept
	}
	if n := deleteKey(cred, "auto_host_rewrite"); n != 2 {
		t.Errorf("%s: auto_host_rewrite on %d routes, want 2 (pool-b's and the weighted one)", poolCredBootstrap, n)
	}
	if !reflect.DeepEqual(demo, cred) {
		a, _ := yaml.Marshal(demo)
		b, _ := yaml.Marshal(cred)
		t.Errorf("%s differs from envoy/demo.yaml beyond node, pool-b's cluster and host rewriting:\n%s", poolCredBootstrap, lineDiff(string(a), string(b)))
	}
}

// deleteKey removes key from every map in v and says how many it removed.
func deleteKey(v any, key string) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v[key]; ok {
			delete(v, key)
			n++
		}
		for _, e := range v {
			n += deleteKey(e, key)
		}
	case []any:
		for _, e := range v {
			n += deleteKey(e, key)
		}
	}
	return n
}

// lineDiff lists the lines only one side has (enough to spot the drift).
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "- demo.yaml: "+l)
		case n < 0:
			out = append(out, "+ pool-credential.yaml: "+l)
		}
	}
	return strings.Join(out, "\n")
}
