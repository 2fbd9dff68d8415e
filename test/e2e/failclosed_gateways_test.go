package e2e

// Fail-closed through the other two ways of wiring infergate into Envoy:
// Envoy Gateway (standalone, envoy/gateway/standalone.yaml; here) and Istio
// (the chart's rendered EnvoyFilters applied to an Envoy shaped like
// Istio's proxies; failclosed_istio_test.go). In both, with infergate down
// every route fails closed (503, or 504 when the gate's message timeout
// fires) within that timeout and nothing reaches a pool; with only the
// meter unreachable streams pass byte for byte and incrementally.
//
// "Down" is three things to Envoy, each its own check:
//   - stopped: the port refuses connections (and infergate itself is
//     stopped);
//   - listening but mute: TCP accepted, not a byte back, not even HTTP/2's
//     SETTINGS (a wedged process, a half-open proxy);
//   - a gRPC server that accepts the ext_proc stream and never answers (a
//     process stuck past the message timeout).
// The endpoint Envoy is configured with is a gwEndpoint, whose behaviour the
// test switches between forwarding to infergate and those three.

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
)

// The gate's message timeout in every wiring checked here (standalone.yaml's
// messageTimeout, the chart's filters.gate.messageTimeout), and when a
// fail-closed answer that has not come has hung: a deadline that tells a
// hang (no answer until the route's or the client's timeout) from an
// answer, not a latency bound (the status and error code say which path
// answered).
const (
	gwMessageTimeout = time.Second
	gwFailBound      = gwMessageTimeout + 10*time.Second
)

// The fail-closed statuses: status_on_error (statusOnError: 503) when the
// gate's stream fails, and 504 when it times out: Envoy 1.40's ext_proc
// answers a message timeout with 504 whatever status_on_error says
// (ext_proc.cc onMessageTimeout, runtime feature
// envoy.reloadable_features.ext_proc_timeout_error; the README's error
// table says "503 (504 on a message timeout)").
const (
	gwStatusOnError = http.StatusServiceUnavailable
	gwStatusTimeout = http.StatusGatewayTimeout
)

// gwMode is what a gwEndpoint does with a connection.
type gwMode int

const (
	gwForward gwMode = iota // pipe to the target (infergate, or a mute gRPC server)
	gwRefuse                // the port is closed: connections are refused
	gwMute                  // accept, read, never write a byte
)

// gwFailure is one way an ext_proc backend fails.
type gwFailure struct {
	how    string
	mode   gwMode
	target string
}

// gwFailures are the ways the gate or the meter (role) fails: mute at the
// TCP level, mute at the gRPC level (muteAddr's server takes the stream and
// never answers), and, for the meter, refused (the gate's refusal comes
// last, with infergate stopped).
func gwFailures(role, muteAddr string) []gwFailure {
	f := []gwFailure{{role + " mute TCP", gwMute, ""}, {role + " mute gRPC", gwForward, muteAddr}}
	if role == "meter" {
		f = append(f, gwFailure{"meter refused", gwRefuse, ""})
	}
	return f
}

// gwEndpoint is an address Envoy's ext_proc cluster points at, switchable at
// run time. Switching cuts every open connection, so Envoy reconnects and
// meets the new behaviour.
type gwEndpoint struct {
	t        *testing.T
	addr     string
	mu       sync.Mutex
	lis      net.Listener // nil while refusing
	mode     gwMode
	target   string
	conns    map[net.Conn]chan struct{} // Envoy's: closed once Envoy has closed it; nil for a pipe's far end
	accepted atomic.Int64
}

func newGWEndpoint(t *testing.T, target string) *gwEndpoint {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &gwEndpoint{t: t, addr: l.Addr().String(), lis: l, target: target, conns: map[net.Conn]chan struct{}{}}
	go e.serve(l)
	t.Cleanup(func() { e.set(gwRefuse, "") })
	return e
}

// set switches the endpoint; target is where gwForward pipes to. It
// returns once Envoy has closed every connection it had: the endpoint sends
// each a FIN and waits for Envoy's close, so no request set sends after it
// returns can ride a connection Envoy has not yet seen cut (that request
// would fail at once instead of meeting the new behaviour).
func (e *gwEndpoint) set(mode gwMode, target string) {
	e.mu.Lock()
	var cut []chan struct{}
	for c, gone := range e.conns {
		if gone == nil {
			c.Close()
			continue
		}
		_ = c.(*net.TCPConn).CloseWrite()
		cut = append(cut, gone)
	}
	clear(e.conns)
	e.mu.Unlock()
	for _, gone := range cut {
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			e.t.Errorf("%s: Envoy kept a connection open 10s after its FIN", e.addr)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mode, e.target = mode, target
	switch {
	case mode == gwRefuse && e.lis != nil:
		e.lis.Close()
		e.lis = nil
	case mode != gwRefuse && e.lis == nil:
		l, err := net.Listen("tcp", e.addr) // the same port: it is in Envoy's config
		if err != nil {
			e.t.Errorf("reopening %s: %v", e.addr, err)
			return
		}
		e.lis = l
		go e.serve(l)
	}
}

func (e *gwEndpoint) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		if e.lis != l {
			e.mu.Unlock()
			c.Close()
			return
		}
		gone := make(chan struct{})
		e.conns[c] = gone
		mode, target := e.mode, e.target
		e.mu.Unlock()
		e.accepted.Add(1)
		go e.handle(c, gone, mode, target)
	}
}

func (e *gwEndpoint) track(c net.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lis == nil {
		return false
	}
	e.conns[c] = nil
	return true
}

// handle serves Envoy's connection c until Envoy closes it, then closes gone.
func (e *gwEndpoint) handle(c net.Conn, gone chan struct{}, mode gwMode, target string) {
	defer close(gone)
	defer c.Close()
	switch mode {
	case gwMute:
		_, _ = io.Copy(io.Discard, c)
	case gwForward:
		u, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer u.Close()
		if !e.track(u) {
			return
		}
		go func() {
			_, _ = io.Copy(c, u)
			_ = c.(*net.TCPConn).CloseWrite() // the far end gone: Envoy's side goes too
		}()
		_, _ = io.Copy(u, c)
	}
}

// gwMuteExtProc is an ext_proc gRPC server that accepts every stream, reads
// every message and never answers one.
type gwMuteExtProc struct {
	extprocv3.UnimplementedExternalProcessorServer
	streams atomic.Int64
}

func (m *gwMuteExtProc) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	m.streams.Add(1)
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
	}
}

func startGWMuteExtProc(t *testing.T) (*gwMuteExtProc, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &gwMuteExtProc{}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, m)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return m, l.Addr().String()
}

// gwPool is a mock pool that also counts every HTTP request it gets, on any
// path (Served counts completions only): "nothing reached a pool" is
// checked on this.
type gwPool struct {
	*pool
	hits atomic.Int64
}

func startGWPool(t *testing.T) *gwPool {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := mock.New(mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	p := &gwPool{pool: &pool{Server: m, Addr: l.Addr().String()}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		m.Handler().ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return p
}

// gwProbe is one request aimed at one route of a gateway's config.
type gwProbe struct {
	route        string // which route it would take without the gate
	method, path string
	body         string
	hdr          map[string]string
}

var gwClient = &http.Client{Timeout: 15 * time.Second}

func gwDo(base string, p gwProbe) (status int, body string, elapsed time.Duration, err error) {
	req, err := http.NewRequest(p.method, base+p.path, strings.NewReader(p.body))
	if err != nil {
		return 0, "", 0, err
	}
	if p.body != "" {
		req.Header.Set("content-type", "application/json")
	}
	for k, v := range p.hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := gwClient.Do(req)
	if err != nil {
		return 0, "", time.Since(start), err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), time.Since(start), err
}

// gwExpectClosed sends every probe at once and wants the status for each
// within gwFailBound, and no request at any pool. With code set, each body
// must be an OpenAI-style error with that code.
func gwExpectClosed(t *testing.T, how, base string, want int, code string, probes []gwProbe, pools ...*gwPool) {
	t.Helper()
	before := make([]int64, len(pools))
	served := make([]int64, len(pools))
	for i, p := range pools {
		before[i], served[i] = p.hits.Load(), p.Served()
	}
	type result struct {
		status  int
		body    string
		elapsed time.Duration
		err     error
	}
	results := make([]result, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Go(func() {
			var r result
			r.status, r.body, r.elapsed, r.err = gwDo(base, p)
			results[i] = r
		})
	}
	wg.Wait()
	var times []string
	for i, r := range results {
		p := probes[i]
		if r.err != nil {
			t.Errorf("%s: %s %s (%s): %v", how, p.method, p.path, p.route, r.err)
			continue
		}
		if r.status != want {
			t.Errorf("%s: %s %s (%s): %d %q, want %d", how, p.method, p.path, p.route, r.status, r.body, want)
		}
		var e openAIError
		if code != "" && (json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Code != code || e.Error.Message == "") {
			t.Errorf("%s: %s %s (%s): body %q, want an OpenAI-style error with code %s", how, p.method, p.path, p.route, r.body, code)
		}
		if r.elapsed > gwFailBound {
			t.Errorf("%s: %s %s (%s): answered after %v, want within %v (message timeout %v)",
				how, p.method, p.path, p.route, r.elapsed, gwFailBound, gwMessageTimeout)
		}
		times = append(times, fmt.Sprintf("%s %d in %v", p.route, r.status, r.elapsed.Round(time.Millisecond)))
	}
	for i, p := range pools {
		if d, s := p.hits.Load()-before[i], p.Served()-served[i]; d != 0 || s != 0 {
			t.Errorf("%s: pool %s got %d requests (%d completions) with the gate down", how, p.Addr, d, s)
		}
	}
	t.Logf("%s: time to %d: %s", how, want, strings.Join(times, "; "))
}

// gwExpectStream streams a completion through base and wants the pool's own
// bytes, event by event (in lock step), with the gate's routing
// header on the request the pool got (the gate ran).
func gwExpectStream(t *testing.T, how, base string, p *gwPool, model string, hdr map[string]string) {
	t.Helper()
	gwExpectStreamWith(t, http.DefaultClient, how, base, p, model, hdr)
}

// gwExpectStreamWith is gwExpectStream through client.
func gwExpectStreamWith(t *testing.T, client *http.Client, how, base string, p *gwPool, model string, hdr map[string]string) {
	t.Helper()
	const tokens, itl = 10, 25 * time.Millisecond
	h := map[string]string{"x-mock-ttft-ms": "60", "x-mock-itl-ms": fmt.Sprint(itl.Milliseconds())}
	for k, v := range hdr {
		h[k] = v
	}
	served := p.Served()
	got := mustLockstepWith(t, client, p, base+"/v1/chat/completions", chatBody(model, tokens, true, ""), h)
	if got.Status != 200 {
		t.Fatalf("%s: status %d: %s", how, got.Status, got.Body)
	}
	if p.Served() != served+1 {
		t.Fatalf("%s: the stream did not come from pool %s", how, p.Addr)
	}
	fwd, _ := p.LastRequest()
	if fwd.Get("x-infergate-model") != model || fwd.Get("authorization") != "" {
		t.Errorf("%s: the pool got x-infergate-model %q, authorization %q: the gate did not decide",
			how, fwd.Get("x-infergate-model"), fwd.Get("authorization"))
	}
	// The gate asks for usage in the stream; the direct request does too.
	want := unasked(t, stream(t, "http://"+p.Addr+"/v1/chat/completions",
		chatBody(model, tokens, true, `,"stream_options":{"include_usage":true}`), h))
	if string(got.Body) != string(want.Body) {
		t.Fatalf("%s: body differs from the pool's own\n got: %q\nwant: %q", how, got.Body, want.Body)
	}
	content := contentEvents(got.Events)
	if len(content) != tokens {
		t.Fatalf("%s: %d content events, want %d", how, len(content), tokens)
	}
	t.Logf("%s: %d bytes byte-exact, first token at %v, last at %v", how, len(got.Body),
		content[0].At.Round(time.Millisecond), content[tokens-1].At.Round(time.Millisecond))
}

// gwReplaceOnce replaces old by new in s, failing unless old occurs exactly
// once.
func gwReplaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q occurs %d times in the resources, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}

// Envoy Gateway v1.9.1, standalone, from envoy/gateway/standalone.yaml: the
// gate's Backend is pointed at a switchable endpoint, the meter at its own
// Backend (the same Envoy Gateway config otherwise: Envoy Gateway already
// gives each extProc entry its own cluster, so a meter-only failure is a
// second Backend for the meter's entry), and the pools at counting mocks.
func TestFailClosedEnvoyGateway(t *testing.T) {
	s := startEnvoyGateway(t)
	poolA, poolB := startGWPool(t), startGWPool(t)
	gate := newGWEndpoint(t, s.Gateway.ExtProcAddr)
	meter := newGWEndpoint(t, s.Gateway.ExtProcAddr)
	mute, muteAddr := startGWMuteExtProc(t)

	b, err := os.ReadFile(s.routesFile)
	if err != nil {
		t.Fatal(err)
	}
	res := string(b)
	res = gwReplaceOnce(t, res, "port: "+port(t, s.Gateway.ExtProcAddr)+"}", "port: "+port(t, gate.addr)+"}")
	res = gwReplaceOnce(t, res, "port: "+port(t, s.PoolA.Addr)+"}", "port: "+port(t, poolA.Addr)+"}")
	res = gwReplaceOnce(t, res, "port: "+port(t, s.PoolB.Addr)+"}", "port: "+port(t, poolB.Addr)+"}")
	res = gwReplaceOnce(t, res, "name: infergate}]\n    shadowMode: true", "name: infergate-meter}]\n    shadowMode: true")
	res += fmt.Sprintf(`
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata: {name: infergate-meter, namespace: default}
spec:
  appProtocols: [gateway.envoyproxy.io/h2c]
  endpoints: [{ip: {address: 127.0.0.1, port: %s}}]
`, port(t, meter.addr))
	if err := os.WriteFile(s.routesFile, []byte(res), 0o644); err != nil {
		t.Fatal(err)
	}
	key := map[string]string{"authorization": "Bearer sk-acme-0001"}
	testutil.Eventually(t, 30*time.Second, func() bool {
		st, _, _, err := gwDo(s.URL, gwProbe{method: "POST", path: "/v1/chat/completions", body: chatBody("llama", 1, false, ""), hdr: key})
		return err == nil && st == 200 && poolA.Served() > 0 && gate.accepted.Load() > 0 && meter.accepted.Load() > 0
	}, "Envoy Gateway to re-translate onto the switchable endpoints and counting pools")

	// Up: gated (no key, 401, nowhere near a pool), and streams intact.
	before := poolA.hits.Load() + poolB.hits.Load()
	if st, body, _, err := gwDo(s.URL, gwProbe{method: "POST", path: "/v1/chat/completions", body: chatBody("llama", 4, true, "")}); err != nil || st != 401 {
		t.Fatalf("no key: %d %q %v, want the gate's 401", st, body, err)
	}
	if poolA.hits.Load()+poolB.hits.Load() != before {
		t.Fatal("a request without a key reached a pool")
	}
	gwExpectStream(t, "Envoy Gateway, infergate up", s.URL, poolA, "llama", key)

	// The meter unreachable, three ways: streams unaffected.
	for _, m := range gwFailures("meter", muteAddr) {
		meter.set(m.mode, m.target)
		gwExpectStream(t, "Envoy Gateway, "+m.how, s.URL, poolA, "llama", key)
	}
	if mute.streams.Load() == 0 {
		t.Error("the mute gRPC server never got the meter's stream: the check did not run")
	}

	// The gate down: every route of the HTTPRoute fails closed. Rule 0
	// matches x-infergate-model: llama (here forged by the client, as if the
	// gate had not run), rule 1 is the catch-all to pool-a. (The meter stays
	// refused: the gate comes first and holds the request, so the meter
	// never sees one.)
	probes := []gwProbe{
		{"rule 1 (catch-all), chat stream", "POST", "/v1/chat/completions", chatBody("llama", 4, true, ""), key},
		{"rule 0 (forged x-infergate-model), chat", "POST", "/v1/chat/completions", chatBody("llama", 4, false, ""),
			map[string]string{"authorization": key["authorization"], "x-infergate-model": "llama"}},
		{"rule 1, completions", "POST", "/v1/completions", `{"model":"llama","prompt":"hi","max_tokens":2}`, key},
		{"rule 1, GET /v1/models", "GET", "/v1/models", "", key},
		{"rule 0, GET /v1/models", "GET", "/v1/models", "", map[string]string{"x-infergate-model": "llama"}},
	}
	for _, down := range gwFailures("gate", muteAddr) {
		gate.set(down.mode, down.target)
		accepted, streams := gate.accepted.Load(), mute.streams.Load()
		// Envoy Gateway's own body: it has no local-reply override (README Limits).
		gwExpectClosed(t, "Envoy Gateway, "+down.how, s.URL, gwStatusTimeout, "", probes, poolA, poolB)
		// The failure must have been met, not routed around.
		if reached := gate.accepted.Load() > accepted; down.mode == gwMute && !reached ||
			down.mode == gwForward && mute.streams.Load() == streams {
			t.Errorf("%s: Envoy never reached the endpoint: the check did not run", down.how)
		}
	}
	s.Gateway.Stop(t)
	gate.set(gwRefuse, "")
	gwExpectClosed(t, "Envoy Gateway, infergate stopped", s.URL, gwStatusOnError, "", probes, poolA, poolB)
}
