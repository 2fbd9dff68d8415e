package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// pool-b of envoy/pool-credential.yaml is a hosted HTTPS API. Here it is a
// local mock serving TLS with a certificate from the test's own CA, for
// hostedName, on 127.0.0.1: Envoy connects to the address, sends the name as
// SNI and checks the certificate against the CA and the name.

const hostedName = "pool-b.hosted.test"

// hostedPool is the mock served over HTTPS (HTTP/2 or HTTP/1.1 by ALPN, as
// `infergate-bench mock --tls-cert --tls-key` serves it); PlainURL serves the same
// mock in plain text for the test's own reference requests.
type hostedPool struct {
	*pool    // Addr: the HTTPS port
	PlainURL string

	mu     sync.Mutex
	hellos []string // the SNI of every ClientHello, whether the handshake completed or not
}

func startHostedPool(t *testing.T, cert tls.Certificate, http1Only bool) *hostedPool {
	t.Helper()
	m := mock.New(mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	h := &hostedPool{}
	listen := func() net.Listener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return lis
	}
	tlsLis, plainLis := listen(), listen()
	quiet := log.New(io.Discard, "", 0) // refused handshakes are expected
	srv := &http.Server{Handler: m.Handler(), ErrorLog: quiet, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			h.mu.Lock()
			h.hellos = append(h.hellos, hello.ServerName)
			h.mu.Unlock()
			return nil, nil // the config above
		},
	}}
	if http1Only {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
	}
	plain := &http.Server{Handler: m.Handler()}
	go srv.ServeTLS(tlsLis, "", "") // offers h2 (unless http1Only) and http/1.1, as the mock command does
	go plain.Serve(plainLis)
	t.Cleanup(func() { srv.Close(); plain.Close() })
	h.pool = &pool{Server: m, Addr: tlsLis.Addr().String()}
	h.PlainURL = "http://" + plainLis.Addr().String()
	return h
}

// Hellos returns the SNI of every TLS handshake attempted so far.
func (h *hostedPool) Hellos() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.hellos...)
}

// hostedCert makes the certificate the hosted mock serves, given the CA
// Envoy trusts.
type hostedCert func(t *testing.T, trusted *testpki.CA) testpki.Leaf

// validHostedCert is the right certificate: hostedName, from the trusted CA.
func validHostedCert(t *testing.T, trusted *testpki.CA) testpki.Leaf {
	return trusted.Server(t, hostedName)
}

// hostedOptions vary the hosted stack.
type hostedOptions struct {
	config    string     // infergate's config (testConfig if empty)
	cert      hostedCert // validHostedCert if nil
	http1Only bool       // the mock offers HTTP/1.1 alone by ALPN
}

// startHostedStack is startStackFor on envoy/pool-credential.yaml with pool-b
// the hosted mock: the harness's placeholders plus pool-b's credential, name,
// address and CA, rendered here so the shared harness stays as it is.
func startHostedStack(t *testing.T, key string, opt hostedOptions) (*stack, *secretVolume, *hostedPool) {
	t.Helper()
	if opt.config == "" {
		opt.config = testConfig
	}
	if opt.cert == nil {
		opt.cert = validHostedCert
	}
	vol := newSecretVolume(t, key)
	sds := writeCredentialSDS(t, vol.path())
	ca := testpki.NewCA(t, "hosted pool test CA")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	hosted := startHostedPool(t, opt.cert(t, ca).TLS(t), opt.http1Only)
	s := startStackFor(t, "", func(*stack) string { return opt.config }, 1, func(s *stack) { s.PoolB = hosted.pool })
	rendered := renderEnvoy(t, poolCredBootstrap, map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0",
		"EXTPROC_PORT": port(t, s.Gateway.ExtProcAddr), "POOL_A_PORT": port(t, s.PoolA.Addr), "POOL_B_PORT": port(t, hosted.Addr),
		"JWKS_FILE": testIssuer(t).jwksPath, "XDS_PORT": port(t, s.Gateway.XDSAddr), "OTLP_PORT": otlpPort(t),
		"POOL_B_CREDENTIAL_SDS": sds, "POOL_B_HOST": hostedName, "POOL_B_ADDRESS": "127.0.0.1", "POOL_B_CA": caFile,
	})
	s.Envoy = envoytest.Start(t, rendered)
	return s, vol, hosted
}

// Through the real Envoy and infergate, a hosted pool gets TLS with its
// name as SNI, HTTP/2 by ALPN, its name as Host, exactly its own credential
// and never the client's gateway key (in either header), and streams stay
// byte-exact and incremental.
func TestPoolCredentialHostedTLS(t *testing.T) {
	const poolKey = "sk-hosted-pool-b-5d21e8"
	const gatewayKey = "sk-acme-0001" // a real gateway key: auth.keys has it
	config := testConfig + "auth: {keys: " + writeKeys(t) + "}\n"
	s, _, hosted := startHostedStack(t, poolKey, hostedOptions{config: config})
	envoyHost := strings.TrimPrefix(s.Envoy.URL, "http://")

	// checkHosted checks what pool-b received for the request just served.
	checkHosted := func(what string) {
		t.Helper()
		h, _ := hosted.LastRequest()
		if want := []string{"Bearer " + poolKey}; !reflect.DeepEqual(h.Values("Authorization"), want) {
			t.Errorf("%s: pool-b received Authorization %q, want %q", what, h.Values("Authorization"), want)
		}
		for name, values := range h {
			if strings.EqualFold(name, "X-Api-Key") || strings.Contains(strings.Join(values, " "), gatewayKey) {
				t.Errorf("%s: pool-b received the client's credential: %s: %q", what, name, values)
			}
		}
		info := hosted.LastRequestInfo()
		var sni, alpn string
		if info.TLS != nil {
			sni, alpn = info.TLS.ServerName, info.TLS.NegotiatedProtocol
		}
		if info.TLS == nil || sni != hostedName || alpn != "h2" || info.Proto != "HTTP/2.0" {
			t.Errorf("%s: pool-b's request arrived as %s, over TLS %t, SNI %q, ALPN %q; want HTTP/2.0 over TLS, SNI %q, ALPN h2",
				what, info.Proto, info.TLS != nil, sni, alpn, hostedName)
		}
		if info.Host != hostedName {
			t.Errorf("%s: pool-b received Host %q, want %q (auto_host_rewrite)", what, info.Host, hostedName)
		}
	}

	// The client's gateway key as a Bearer token, then as x-api-key (the
	// gate reads either, and removes both).
	for _, hdr := range []map[string]string{
		{"authorization": "Bearer " + gatewayKey},
		{"x-api-key": gatewayKey},
		{"authorization": "Bearer " + gatewayKey, "x-api-key": gatewayKey},
	} {
		c := call{method: "POST", path: "/v1/chat/completions", body: chatBody("pool-b", 4, false, ""), hdr: hdr}
		if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
			t.Fatalf("%v: status %d: %+v", hdr, resp.StatusCode, e)
		}
		checkHosted(fmt.Sprint(hdr))
	}
	// A wrong gateway key never gets as far as the pool.
	before := hosted.Served()
	if resp, _ := (call{method: "POST", path: "/v1/chat/completions", key: "sk-not-a-key", body: chatBody("pool-b", 4, false, "")}).do(t, s.Envoy.URL); resp.StatusCode != 401 {
		t.Errorf("unknown gateway key: status %d, want 401", resp.StatusCode)
	}
	if hosted.Served() != before {
		t.Error("a request with an unknown gateway key reached pool-b")
	}

	// The weighted route rewrites Host only for the hosted pool: pool-a, a
	// STATIC cluster without a hostname, keeps the client's, in plain text.
	seen := map[string]bool{}
	for i := 0; i < 60 && !(seen["pool-a"] && seen["pool-b"]); i++ {
		pool, auth, _ := authAt(t, s, gatewayKey, "some-virtual-model", false)
		seen[pool] = true
		if pool == "pool-b" {
			checkHosted("virtual model via pool-b")
			continue
		}
		if info := s.PoolA.LastRequestInfo(); info.Host != envoyHost || info.TLS != nil || len(auth) > 0 {
			t.Errorf("virtual model via pool-a: Host %q (want %q), TLS %v, Authorization %q", info.Host, envoyHost, info.TLS != nil, auth)
		}
	}
	if !seen["pool-a"] || !seen["pool-b"] {
		t.Fatalf("the weighted route picked only %v in 60 requests", seen)
	}

	// Streaming over TLS and HTTP/2: byte-exact against the same mock asked
	// directly, every event arriving on its own (in lock step).
	const tokens = 12
	hdr := map[string]string{"x-mock-ttft-ms": "50", "x-mock-itl-ms": "20", "authorization": "Bearer " + gatewayKey}
	got := mustLockstep(t, hosted, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-b", tokens, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("stream: status %d: %s", got.Status, got.Body)
	}
	checkHosted("stream")
	want := unasked(t, stream(t, hosted.PlainURL+"/v1/chat/completions",
		chatBody("pool-b", tokens, true, `,"stream_options":{"include_usage":true}`), hdr))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("stream through the gateway differs from the direct one\n got: %q\nwant: %q", got.Body, want.Body)
	}
	if content := contentEvents(got.Events); len(content) != tokens {
		t.Fatalf("stream: %d content events, want %d", len(content), tokens)
	}
	if st := s.Gateway.stamp(t, got.RequestID); st.Pool != "pool-b" || !st.Complete || st.Status != 200 || st.CompletionTokens != tokens {
		t.Errorf("stream stamp = %+v", st)
	}

	// Every handshake Envoy made named the pool.
	for _, sni := range hosted.Hellos() {
		if sni != hostedName {
			t.Errorf("a handshake with pool-b sent SNI %q, want %q", sni, hostedName)
		}
	}
}

// A hosted API without HTTP/2 gets HTTP/1.1 over the same TLS (ALPN), with
// its name, its key and an incremental, byte-exact stream.
func TestPoolCredentialHostedHTTP1(t *testing.T) {
	const poolKey = "sk-hosted-http1-pool-b-0c4f"
	s, _, hosted := startHostedStack(t, poolKey, hostedOptions{http1Only: true})
	hdr := map[string]string{"x-mock-ttft-ms": "50", "x-mock-itl-ms": "20", "authorization": "Bearer sk-client"}
	got := mustLockstep(t, hosted, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-b", 8, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("stream: status %d: %s", got.Status, got.Body)
	}
	info := hosted.LastRequestInfo()
	if info.TLS == nil || info.TLS.ServerName != hostedName || info.TLS.NegotiatedProtocol != "http/1.1" || info.Proto != "HTTP/1.1" || info.Host != hostedName {
		t.Errorf("pool-b's request arrived as %s for Host %q, over TLS %t; want HTTP/1.1 by ALPN, SNI and Host %q", info.Proto, info.Host, info.TLS != nil, hostedName)
	}
	if h, _ := hosted.LastRequest(); !reflect.DeepEqual(h.Values("Authorization"), []string{"Bearer " + poolKey}) {
		t.Errorf("pool-b received Authorization %q, want its own key", h.Values("Authorization"))
	}
	want := unasked(t, stream(t, hosted.PlainURL+"/v1/chat/completions",
		chatBody("pool-b", 8, true, `,"stream_options":{"include_usage":true}`), hdr))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("stream through the gateway differs from the direct one\n got: %q\nwant: %q", got.Body, want.Body)
	}
	if content := contentEvents(got.Events); len(content) != 8 {
		t.Errorf("stream: %d content events, want 8", len(content))
	}
}

// A hosted pool whose certificate is not from the trusted CA, or not for
// its name, is refused: Envoy tries (the handshake names the pool), fails
// it for that reason, answers 503, and no request reaches the pool.
func TestPoolCredentialHostedTLSRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cert hostedCert
		stat string // the Envoy counter the refusal increments
	}{
		{"another CA", func(t *testing.T, _ *testpki.CA) testpki.Leaf {
			return testpki.NewCA(t, "an impostor's CA").Server(t, hostedName)
		}, "cluster.pool-b.ssl.fail_verify_error"},
		{"another name", func(t *testing.T, trusted *testpki.CA) testpki.Leaf {
			return trusted.Server(t, "other.hosted.test")
		}, "cluster.pool-b.ssl.fail_verify_san"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, hosted := startHostedStack(t, "sk-hosted-pool-b-never-sent", hostedOptions{cert: tc.cert})
			c := call{method: "POST", path: "/v1/chat/completions", key: "sk-client", body: chatBody("pool-b", 4, false, "")}
			resp, e := c.do(t, s.Envoy.URL)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status %d (%+v), want 503", resp.StatusCode, e)
			}
			if n := hosted.Served(); n != 0 {
				t.Errorf("pool-b served %d requests over a refused connection", n)
			}
			if hellos := hosted.Hellos(); len(hellos) == 0 || hellos[0] != hostedName {
				t.Errorf("handshakes seen by pool-b: SNI %q, want at least one with %q", hellos, hostedName)
			}
			if n := envoyCounter(t, s.Envoy.AdminURL, tc.stat); n == 0 {
				t.Errorf("%s = 0: refused for another reason", tc.stat)
			}
			// pool-a, in plain text, is unaffected.
			if resp, e := (call{method: "POST", path: "/v1/chat/completions", key: "sk-client", body: chatBody("pool-a", 4, false, "")}).do(t, s.Envoy.URL); resp.StatusCode != 200 {
				t.Errorf("pool-a: status %d: %+v", resp.StatusCode, e)
			}
		})
	}
}

// envoyCounter reads one counter from Envoy's admin /stats.
func envoyCounter(t *testing.T, adminURL, name string) int {
	t.Helper()
	var n int
	for _, line := range strings.Split(get(t, adminURL+"/stats"), "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			fmt.Sscan(v, &n)
		}
	}
	return n
}
