package e2e

import (
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// The mesh's identities, as Istio's CA issues them (SPIFFE IDs in the
// certificates its proxies present to each other). The gateway's is the
// chart's istio.sidecar.gatewayIdentities default.
const (
	istioGatewayID = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"
	istioModelID   = "spiffe://cluster.local/ns/models/sa/vllm"
	istioCallerID  = "spiffe://cluster.local/ns/apps/sa/batch-indexer"
	istioPoolAHost = "pool-a.models.svc.cluster.local"
)

// TestIstioGatewayAndSidecarGateOnce runs the chart's Istio example as a
// mesh runs it: the gate and meter in the ingress gateway and in the model
// server's sidecar, the gateway reaching the sidecar over mutual TLS with
// its own identity. A request through the gateway is gated and metered
// once, at the gateway (the sidecar's filters skip the gateway's identity;
// a second gate would no longer see the credential the first removed, and
// refuse it); a caller inside the mesh that skips the gateway meets the
// sidecar's gate, with its key or without.
func TestIstioGatewayAndSidecarGateOnce(t *testing.T) {
	t.Parallel()
	filters := istioEnvoyFilters(t)
	poolA, poolB := startGWPool(t), startGWPool(t)
	g := startInfergate(t, "auth: {keys: "+writeKeys(t)+"}\n")

	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster.local")
	files := func(name string, l testpki.Leaf) (cert, key string) {
		cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		testpki.WriteFile(t, cert, l.CertPEM)
		testpki.WriteFile(t, key, l.KeyPEM)
		return cert, key
	}
	caFile := filepath.Join(dir, "ca.crt")
	testpki.WriteFile(t, caFile, ca.PEM)
	modelCert, modelKey := files("model", ca.Workload(t, istioModelID, istioPoolAHost))
	gwCert, gwKey := files("gateway", ca.Workload(t, istioGatewayID))

	// The sidecar: Istio's mutual TLS on the pod port's inbound chain.
	sidecar := istioStartProxy(t, istioModelSidecar, filters, g.ExtProcAddr, "", poolA, poolB, func(b map[string]any) {
		chain := istioResource(t, b, "listeners", "virtualInbound")["filter_chains"].([]any)[0]
		istioMap(t, "chain", chain)["transport_socket"] = istioTLS(t, "DownstreamTlsContext", `
require_client_certificate: true
common_tls_context:
  tls_certificates: [{certificate_chain: {filename: `+modelCert+`}, private_key: {filename: `+modelKey+`}}]
  validation_context: {trusted_ca: {filename: `+caFile+`}}`)
	})
	sidecarAddr := strings.TrimPrefix(sidecar.url, "http://")

	// The gateway: pool-a is the model server, reached through its
	// sidecar with the gateway's certificate.
	gateway := istioStartProxy(t, istioIngressGateway, filters, g.ExtProcAddr, "", poolA, poolB, func(b map[string]any) {
		c := istioResource(t, b, "clusters", "outbound|8000||"+istioPoolAHost)
		ep := c["load_assignment"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)["lb_endpoints"].([]any)[0]
		host, port := splitHostPort(t, sidecarAddr)
		ep.(map[string]any)["endpoint"] = map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": host, "port_value": port}}}
		c["transport_socket"] = istioTLS(t, "UpstreamTlsContext", `
sni: `+istioPoolAHost+`
common_tls_context:
  tls_certificates: [{certificate_chain: {filename: `+gwCert+`}, private_key: {filename: `+gwKey+`}}]
  validation_context:
    trusted_ca: {filename: `+caFile+`}
    match_typed_subject_alt_names: [{san_type: URI, matcher: {exact: "`+istioModelID+`"}}]`)
	})

	key := map[string]string{"authorization": "Bearer sk-acme-0001"}
	stampsAt := func(pool string) int {
		n := 0
		for _, s := range g.stamps() {
			if s.Pool == pool && s.Complete {
				n++
			}
		}
		return n
	}
	waitStamps := func(how string, want map[string]int) {
		t.Helper()
		got := map[string]int{}
		testutil.Eventually(t, 5*time.Second, func() bool {
			for pool := range want {
				got[pool] = stampsAt(pool)
			}
			return equalCounts(got, want)
		}, how)
		time.Sleep(300 * time.Millisecond) // and no other stamp comes late
		for pool := range want {
			got[pool] = stampsAt(pool)
		}
		if total := len(g.stamps()); !equalCounts(got, want) || total != sum(want) {
			t.Fatalf("%s: stamps by pool %v (%d in all), want %v", how, got, total, want)
		}
		for _, s := range g.stamps() {
			if s.Principal != "acme-prod" {
				t.Errorf("%s: a stamp at %s for principal %q, want the key's, acme-prod", how, s.Pool, s.Principal)
			}
		}
	}
	const atGateway, atSidecar = "outbound|8000||" + istioPoolAHost, "inbound|8000||"

	// Through the gateway: gated and metered there, byte-exact through the
	// sidecar. Without the skip the sidecar's gate answers 401.
	gwExpectStream(t, "gateway → sidecar (mTLS)", gateway.url, poolA, "pool-a", key)
	waitStamps("the gateway's stamp", map[string]int{atGateway: 1, atSidecar: 0})

	// A caller in the mesh with another identity skips the gateway: the
	// sidecar's gate decides and its meter stamps.
	caller := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: ca.Pool(), ServerName: istioPoolAHost, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{ca.Workload(t, istioCallerID).TLS(t)},
	}}}
	defer caller.CloseIdleConnections()
	eastWest := "https://" + sidecarAddr
	gwExpectStreamWith(t, caller, "east-west caller → sidecar", eastWest, poolA, "pool-a", key)
	waitStamps("the sidecar's stamp", map[string]int{atGateway: 1, atSidecar: 1})

	// Without a key it is refused there, and reaches no pool.
	served := poolA.Served()
	got := streamWith(t, caller, eastWest+"/v1/chat/completions", chatBody("pool-a", 10, true, ""), nil)
	if got.Status != http.StatusUnauthorized || got.Header.Get("x-infergate-error") == "" {
		t.Fatalf("east-west caller without a key: status %d, x-infergate-error %q: %s",
			got.Status, got.Header.Get("x-infergate-error"), got.Body)
	}
	if poolA.Served() != served {
		t.Fatal("a refused east-west request reached the pool")
	}
}

// istioResource is the bootstrap's static resource of a kind ("listeners",
// "clusters") named name.
func istioResource(t *testing.T, bootstrap map[string]any, kind, name string) map[string]any {
	t.Helper()
	for _, r := range istioMap(t, "static_resources", bootstrap["static_resources"])[kind].([]any) {
		if m := istioMap(t, kind, r); m["name"] == name {
			return m
		}
	}
	t.Fatalf("no %s named %s", kind, name)
	return nil
}

// istioTLS is a TLS transport socket of the given context type.
func istioTLS(t *testing.T, contextType, config string) map[string]any {
	t.Helper()
	var tc map[string]any
	if err := yaml.Unmarshal([]byte(config), &tc); err != nil {
		t.Fatal(err)
	}
	tc["@type"] = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3." + contextType
	return map[string]any{"name": "envoy.transport_sockets.tls", "typed_config": tc}
}

func splitHostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("address %q: %v %v", addr, err, perr)
	}
	return host, port
}

func equalCounts(a, b map[string]int) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
