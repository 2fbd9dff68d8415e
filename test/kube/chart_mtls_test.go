package kube

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The chart's default install (a plain Envoy) on the real API server: the
// generated certificates are Secrets an upgrade keeps; infergate, run from
// the release as its pod would be, serves the ext_proc port over mutual
// TLS; a real Envoy with envoy/snippet.yaml's filters and
// envoy/snippet-mtls.yaml's cluster, holding the release's client Secret
// where the NOTES say, reaches the gate, and the same Envoy without the
// client certificate gets no gate (503). An upgrade of a plaintext release
// to the default is refused with what to do, and goes through once the
// choice is explicit.
func TestChartDefaultMutualTLS(t *testing.T) {
	c := startCluster(t)
	c.createNamespace(t, llmNS)
	// The defaults, with an API key so that the gate admits a request and
	// a virtual model so that infergate serves routes over xDS.
	vals := map[string]any{"apiKeys": ciValues(t, "envoygateway")["apiKeys"], "config": map[string]any{"virtualModels": []any{
		map[string]any{"name": "llama-3-70b", "pools": []any{map[string]any{"cluster": "pool-a"}, map[string]any{"cluster": "pool-b", "priority": 1}}}}}}
	rel, err := c.helmInstall(t, llmNS, relName, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	server, client := relName+"-extproc-tls", relName+"-envoy-client"
	before := map[string]map[string][]byte{server: c.secretData(t, llmNS, server), client: c.secretData(t, llmNS, client)}
	if _, err := c.helmUpgrade(t, llmNS, relName, mergeValues(vals, map[string]any{"podAnnotations": map[string]any{"upgraded": "yes"}})); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	for name, data := range before {
		if after := c.secretData(t, llmNS, name); !equalData(data, after) {
			t.Errorf("the upgrade replaced Secret %s's certificates", name)
		}
	}
	if !strings.Contains(rel.Info.Notes, "/etc/envoy/infergate-tls:         Secret "+client) {
		t.Errorf("the NOTES do not say where Envoy mounts Secret %s:\n%s", client, rel.Info.Notes)
	}

	ig := startInfergateFromRelease(t, c, decodeObjects(t, []byte(rel.Manifest)))
	envoyDir := t.TempDir()
	writeSecret(t, c, llmNS, client, envoyDir)
	fqdn := relName + "." + llmNS + ".svc.cluster.local" // the NOTES' SNI and SAN
	withCert := envoytest.Start(t, plainEnvoy(t, ig, fqdn, envoyDir, true))
	withoutCert := envoytest.Start(t, plainEnvoy(t, ig, fqdn, envoyDir, false))

	if code, body := post(t, withCert.URL, map[string]string{"authorization": "Bearer " + apiKey, "x-request-id": "kube-mtls-1"}); code != http.StatusOK {
		t.Errorf("with the client certificate and a key: %d %s, want the route's 200", code, body)
	}
	if st := ig.stamp(t, "the admitted request", func(l logLine) bool { return l.RequestID == "kube-mtls-1" }); st.Decision != "allow" || st.Tenant != "acme" {
		t.Errorf("the admitted request's log line %+v, want the gate's allow for acme", st)
	}
	if code, body := post(t, withCert.URL, nil); code != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
		t.Errorf("with the client certificate, no key: %d %s, want the gate's 401", code, body)
	}
	stats := get(t, withCert.AdminURL+"/stats?filter=^cluster\\.infergate\\.ssl\\.handshake$")
	if !strings.Contains(stats, "cluster.infergate.ssl.handshake: ") || strings.Contains(stats, "cluster.infergate.ssl.handshake: 0") {
		t.Errorf("Envoy's TLS handshakes with infergate: %q", stats)
	}
	if code, body := post(t, withoutCert.URL, withKey); code != http.StatusServiceUnavailable || !strings.Contains(body, `"gate_unavailable"`) {
		t.Errorf("without the client certificate: %d %s, want Envoy's 503 gate_unavailable", code, body)
	}
	// xDS: the virtual-model routes reach the Envoy with the client
	// certificate over mutual TLS; the one without fails to fetch them.
	const rdsStats = "^(http\\.sla\\.rds\\.infergate\\.update_(success|failure)|cluster\\.infergate-xds\\.ssl\\.handshake)$"
	testutil.Eventually(t, 30*time.Second, func() bool {
		return stat(t, withCert.AdminURL, rdsStats, "http.sla.rds.infergate.update_success") > 0
	}, "Envoy to get the virtual-model routes over xDS")
	if n := stat(t, withCert.AdminURL, rdsStats, "cluster.infergate-xds.ssl.handshake"); n == 0 {
		t.Errorf("Envoy got the routes without a TLS handshake with the xDS port")
	}
	if routes := get(t, withCert.AdminURL+"/config_dump?resource=dynamic_route_configs"); !strings.Contains(routes, "llama-3-70b") {
		t.Errorf("the routes Envoy got over xDS do not name llama-3-70b:\n%s", routes)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		return stat(t, withoutCert.AdminURL, rdsStats, "http.sla.rds.infergate.update_failure") > 0
	}, "the Envoy without a client certificate to fail an xDS fetch")
	if n := stat(t, withoutCert.AdminURL, rdsStats, "http.sla.rds.infergate.update_success"); n != 0 {
		t.Errorf("the Envoy without a client certificate got the routes over xDS (%d updates)", n)
	}

	// A release from before mutual TLS was the default (its port
	// plaintext), upgraded with values that do not name extproc.tls: refused,
	// saying how to choose. (Upgraded with no values at all, Helm reuses
	// the release's own, which here would name it.)
	const legacy = "legacy"
	c.createNamespace(t, legacy)
	plain := map[string]any{"extproc": map[string]any{"tls": map[string]any{"enabled": false}}}
	if _, err := c.helmInstall(t, legacy, relName, plain); err != nil {
		t.Fatalf("helm install (plaintext): %v", err)
	}
	_, err = c.helmUpgrade(t, legacy, relName, map[string]any{"config": map[string]any{"log": map[string]any{"level": "debug"}}})
	if err == nil || !strings.Contains(err.Error(), "extproc.tls.enabled=false") || !strings.Contains(err.Error(), "extproc.tls.enabled=true") {
		t.Errorf("upgrading a plaintext release to the default: %v, want a refusal naming both choices", err)
	}
	if _, err := c.kube.CoreV1().Secrets(legacy).Get(t.Context(), server, metav1.GetOptions{}); err == nil {
		t.Errorf("the refused upgrade created Secret %s", server)
	}
	if _, err := c.helmUpgrade(t, legacy, relName, map[string]any{"extproc": map[string]any{"tls": map[string]any{"enabled": true}}}); err != nil {
		t.Errorf("upgrading with extproc.tls.enabled=true: %v", err)
	} else if len(c.secretData(t, legacy, client)["tls.crt"]) == 0 {
		t.Errorf("the upgrade to mutual TLS made no client certificate")
	}
}

func (c *cluster) secretData(t *testing.T, ns, name string) map[string][]byte {
	t.Helper()
	s, err := c.kube.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Secret %s/%s: %v", ns, name, err)
	}
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if len(s.Data[k]) == 0 {
			t.Errorf("Secret %s/%s has no %s", ns, name, k)
		}
	}
	return s.Data
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// mergeValues is a with b's top-level keys added.
func mergeValues(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// plainEnvoy is a bootstrap of envoy/snippet.yaml's filters and local
// replies in front of a route that answers 200 (a direct response), and
// envoy/snippet-mtls.yaml's infergate cluster pointed at infergate's port
// with fqdn as SNI and SAN, its files in dir (without its client
// certificate unless withCert); and a listener "sla" taking its routes over
// RDS from envoy/sla.yaml's infergate-xds cluster, with the same
// transport_socket, as the NOTES ask.
func plainEnvoy(t *testing.T, ig *infergateProc, fqdn, dir string, withCert bool) string {
	t.Helper()
	var snippet struct {
		HTTPFilters      []any            `json:"http_filters"`
		LocalReplyConfig map[string]any   `json:"local_reply_config"`
		Clusters         []map[string]any `json:"clusters"`
	}
	readSnippet(t, "envoy/snippet.yaml", &snippet)
	var mtls struct {
		Clusters []map[string]any `json:"clusters"`
	}
	readSnippet(t, "envoy/snippet-mtls.yaml", &mtls)
	if len(mtls.Clusters) != 1 || mtls.Clusters[0]["name"] != "infergate" {
		t.Fatalf("envoy/snippet-mtls.yaml: clusters %v, want the infergate cluster", mtls.Clusters)
	}
	cluster := mtls.Clusters[0]
	if !withCert {
		ctx := nested[map[string]any](cluster, "transport_socket", "typed_config", "common_tls_context")
		delete(ctx, "tls_certificates")
	}
	at := func(name string, port int) map[string]any {
		c := map[string]any{}
		b, _ := json.Marshal(cluster)
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		c["name"], c["type"] = name, "STATIC"
		c["load_assignment"] = map[string]any{"cluster_name": name, "endpoints": []any{map[string]any{"lb_endpoints": []any{
			map[string]any{"endpoint": map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": hostIP(t), "port_value": port}}}}}}}}
		return c
	}
	rds := map[string]any{
		"@type":        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"stat_prefix":  "sla",
		"http_filters": []any{map[string]any{"name": "envoy.filters.http.router", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}},
		"rds": map[string]any{"route_config_name": "infergate", "config_source": map[string]any{
			"resource_api_version": "V3", "initial_fetch_timeout": "1s",
			"api_config_source": map[string]any{"api_type": "GRPC", "transport_api_version": "V3",
				"grpc_services": []any{map[string]any{"envoy_grpc": map[string]any{"cluster_name": "infergate-xds"}}}}}},
	}
	hcm := map[string]any{
		"@type":              "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"stat_prefix":        "llm",
		"http_filters":       append(snippet.HTTPFilters, map[string]any{"name": "envoy.filters.http.router", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
		"local_reply_config": snippet.LocalReplyConfig,
		"route_config": map[string]any{"virtual_hosts": []any{map[string]any{"name": "all", "domains": []any{"*"},
			"routes": []any{map[string]any{"match": map[string]any{"prefix": "/"}, "direct_response": map[string]any{"status": 200}}}}}},
	}
	loopback := func() map[string]any {
		return map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 0}}
	}
	listener := func(name string, hcm map[string]any) map[string]any {
		return map[string]any{"name": name, "address": loopback(), "filter_chains": []any{map[string]any{"filters": []any{
			map[string]any{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}}}}}
	}
	boot := map[string]any{
		"node":  map[string]any{"id": "kube-mtls", "cluster": "kube-mtls"}, // RDS needs one
		"admin": map[string]any{"address": loopback()},
		"static_resources": map[string]any{
			"listeners": []any{listener("llm", hcm), listener("sla", rds)},
			"clusters":  []any{at("infergate", ig.extproc), at("infergate-xds", ig.xds)},
		},
	}
	b, err := json.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	// The snippet's own SNI, SAN and mount path, as the NOTES have the user change them.
	conf := strings.ReplaceAll(string(b), "infergate.infergate.svc.cluster.local", fqdn)
	conf = strings.ReplaceAll(conf, "/etc/envoy/infergate-tls/", dir+"/")
	if !strings.Contains(conf, `"sni":"`+fqdn+`"`) || !strings.Contains(conf, `"exact":"`+fqdn+`"`) {
		t.Fatalf("envoy/snippet-mtls.yaml no longer names infergate.infergate.svc.cluster.local as SNI and SAN:\n%s", conf)
	}
	return conf
}

func readSnippet(t *testing.T, rel string, into any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// post sends a one-token chat completion through Envoy and returns the
// status and body.
func post(t *testing.T, base string, hdr map[string]string) (int, string) {
	t.Helper()
	resp, err := chat(base, "llama-3-70b", 1, false, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stat is the value of one of the counters filter selects, read from
// Envoy's admin.
func stat(t *testing.T, admin, filter, name string) int {
	t.Helper()
	for _, line := range strings.Split(get(t, admin+"/stats?filter="+url.QueryEscape(filter)), "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("stat %s: %q", name, line)
			}
			return n
		}
	}
	return 0
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
