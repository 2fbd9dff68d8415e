// Package e2e runs infergate end to end against the real thing: the pinned
// Envoy binary, the demo bootstrap from envoy/, infergate's service and the
// mock upstream in-process, and the official OpenAI and Anthropic SDKs as
// clients.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/cli"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// repoRoot is the repository's top directory.
var repoRoot = envoytest.RepoRoot

// pool is a mock inference pool listening on a random port.
type pool struct {
	*mock.Server
	Addr string
}

func startPool(t *testing.T, cfg mock.Config) *pool {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := mock.New(cfg, slog.New(slog.DiscardHandler))
	srv := &http.Server{Handler: m.Handler()}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return &pool{Server: m, Addr: lis.Addr().String()}
}

// gateway is infergate in-process; Stamps reads its request log.
type gateway struct {
	ExtProcAddr string
	XDSAddr     string // virtual-model routes, when the config has virtual models
	AdminURL    string
	requests    *testutil.Buffer
	*stampLog   // requests, parsed
	stop        context.CancelFunc
	done        chan error
	conns       *connTracker
}

// stampLog reads stamps from a request log: infergate serve's, or Envoy's
// standard output, where the module writes its own.
type stampLog struct {
	log   *testutil.Buffer
	index struct { // the request log parsed so far, by request id
		sync.Mutex
		parsed int
		byID   map[string]Stamp
	}
}

func newStampLog(log *testutil.Buffer) *stampLog { return &stampLog{log: log} }

// budgetClocks holds, by test, the budget clock of the infergates the
// test starts (inOneWindow); a test without one uses time.Now.
var budgetClocks sync.Map // *testing.T → func() time.Time

// inOneWindow gives the test whole budget windows without waiting for
// one: every infergate it starts afterwards reads its budget windows from
// a clock shifted forward to the start of the next hour (a minute's start
// too), so the test begins at the start of a minute and of an hour. The
// shift is forward, so Redis TTLs and seals only outlive their windows, as
// on a replica whose clock runs a little ahead. It returns that clock, for
// a test that names windows itself. Call it before starting the stack.
func inOneWindow(t *testing.T) func() time.Time {
	now := time.Now()
	offset := now.Truncate(time.Hour).Add(time.Hour).Sub(now)
	clock := func() time.Time { return time.Now().Add(offset) }
	budgetClocks.Store(t, clock)
	t.Cleanup(func() { budgetClocks.Delete(t) })
	return clock
}

func startInfergate(t *testing.T, yamlConfig string) *gateway {
	t.Helper()
	cfg, err := config.Parse([]byte(yamlConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RateLimit.Embedded.Path == config.DefaultLedgerPath { // one process per file
		cfg.RateLimit.Embedded.Path = filepath.Join(t.TempDir(), "ledger.db")
	}
	logs := &testutil.Buffer{}
	requests := &testutil.Buffer{}
	var opts []cli.Option
	if clock, ok := budgetClocks.Load(t); ok {
		opts = append(opts, cli.WithBudgetClock(clock.(func() time.Time)))
	}
	svc, err := cli.NewService(cfg, slog.New(slog.NewTextHandler(logs, nil)), requests, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ad, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tracker := &connTracker{Listener: ep}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gateway{ExtProcAddr: ep.Addr().String(), AdminURL: "http://" + ad.Addr().String(),
		requests: requests, stampLog: newStampLog(requests), stop: cancel, done: make(chan error, 1), conns: tracker}
	xl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.XDSAddr = xl.Addr().String()
	go func() { g.done <- svc.Serve(ctx, tracker, ad, xl) }()
	t.Cleanup(func() {
		g.Stop(t)
		if t.Failed() {
			t.Logf("infergate log:\n%s\nrequest log:\n%s", logs.String(), requests.String())
		}
	})
	waitHTTP(t, g.AdminURL+"/readyz")
	return g
}

// Stop shuts infergate down gracefully (idempotent).
func (g *gateway) Stop(t *testing.T) {
	g.stop()
	g.conns.CloseAll() // don't wait out long streams on shutdown
	select {
	case <-g.done:
		g.done <- nil
	case <-time.After(10 * time.Second):
		t.Error("infergate did not stop")
	}
}

// Stamp is one request-log line.
type Stamp struct {
	RequestID        string   `json:"request_id"`
	Principal        string   `json:"principal"`
	Tenant           string   `json:"tenant"`
	Model            string   `json:"model"`
	API              string   `json:"api"`
	Pool             string   `json:"pool"`
	PoolsTried       []string `json:"pools_tried"`
	TraceID          string   `json:"trace_id"`
	Totalms          float64  `json:"total_ms"`
	Upstream         string   `json:"upstream"`
	Endpoint         string   `json:"endpoint"`
	Status           int      `json:"status"`
	Attempts         int      `json:"attempts"`
	Stream           bool     `json:"stream"`
	PromptTokens     int      `json:"prompt_tokens"`
	CompletionTokens int      `json:"completion_tokens"`
	TokenSource      string   `json:"token_source"`
	TTFTms           float64  `json:"ttft_ms"`
	ITLP50ms         float64  `json:"itl_p50_ms"`
	ITLP95ms         float64  `json:"itl_p95_ms"`
	ITLMaxms         float64  `json:"itl_max_ms"`
	ContentEvents    int      `json:"content_events"`
	E2Ems            float64  `json:"e2e_ms"`
	Gatewayms        float64  `json:"gateway_ms"`
	Gatems           float64  `json:"gate_ms"`
	Pickerms         float64  `json:"picker_ms"`
	Policyms         float64  `json:"policy_ms"`
	RateLimitms      float64  `json:"ratelimit_ms"`
	Checksms         float64  `json:"checks_ms"`
	Decision         string   `json:"decision"`
	Reason           string   `json:"reason"`
	Complete         bool     `json:"complete"`
	Timing           string   `json:"timing"`
}

// timedFirst and timedStream count the stamps whose TTFT, and whose gaps
// and E2E, the meter vouched for: those in the latency histograms. A busy
// machine can hold up infergate's reads; the meter marks those stamps
// late_read (TTFT and all after it) or late_stream (after the first token)
// and leaves those times out (infergate_meter_errors_total{reason} counts
// them instead).
func timedFirst(sts ...Stamp) int {
	n := 0
	for _, st := range sts {
		if st.Timing != "late_read" {
			n++
		}
	}
	return n
}

func timedStream(sts ...Stamp) int {
	n := 0
	for _, st := range sts {
		if st.Timing == "ok" {
			n++
		}
	}
	return n
}

// stamps returns every request-log line so far.
func (l *stampLog) stamps() []Stamp {
	var out []Stamp
	sc := bufio.NewScanner(strings.NewReader(l.log.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s Stamp
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.RequestID != "" {
			out = append(out, s)
		}
	}
	return out
}

// stamp waits for the request log line of one request. Lines are parsed
// once, as they arrive: tests look up hundreds of requests. A stamp is
// written once its request is settled, by either adapter.
// line is the request-log line of one request as written, once its stamp
// is there.
func (l *stampLog) line(t *testing.T, requestID string) []byte {
	t.Helper()
	l.stamp(t, requestID)
	sc := bufio.NewScanner(strings.NewReader(l.log.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var x struct {
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal(sc.Bytes(), &x) == nil && x.RequestID == requestID {
			return bytes.Clone(sc.Bytes())
		}
	}
	t.Fatalf("no request-log line for %s", requestID)
	return nil
}

func (l *stampLog) stamp(t *testing.T, requestID string) Stamp {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l.index.Lock()
		log := l.log.String()
		for {
			end := strings.IndexByte(log[l.index.parsed:], '\n')
			if end < 0 {
				break
			}
			var s Stamp
			if json.Unmarshal([]byte(log[l.index.parsed:l.index.parsed+end]), &s) == nil && s.RequestID != "" {
				if l.index.byID == nil {
					l.index.byID = map[string]Stamp{}
				}
				l.index.byID[s.RequestID] = s
			}
			l.index.parsed += end + 1
		}
		s, ok := l.index.byID[requestID]
		l.index.Unlock()
		if ok {
			return s
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no stamp for request %s in:\n%s", requestID, l.log.String())
	return Stamp{}
}

// startEnvoy renders envoy/demo.yaml for the given ports, applies edits,
// and runs the pinned Envoy on it. Its log is shown only when the test fails.
func startEnvoy(t *testing.T, bootstrap string, extprocAddrs []string, xdsAddr, poolA, poolB string, edits ...func(*testing.T, string) string) *envoytest.Envoy {
	t.Helper()
	rendered := renderEnvoy(t, bootstrap, map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0",
		"EXTPROC_PORT": port(t, extprocAddrs[0]), "POOL_A_PORT": port(t, poolA), "POOL_B_PORT": port(t, poolB),
		"JWKS_FILE": testIssuer(t).jwksPath, "XDS_PORT": port(t, xdsAddr), "OTLP_PORT": otlpPort(t),
	})
	for _, edit := range edits {
		rendered = edit(t, rendered)
	}
	// More infergate replicas: more endpoints in the infergate cluster, so
	// a request's gate and meter streams may land on different replicas.
	first := "{address: 127.0.0.1, port_value: " + port(t, extprocAddrs[0]) + "}}}"
	for _, addr := range extprocAddrs[1:] {
		line := "        - endpoint: {address: {socket_address: " + first
		if !strings.Contains(rendered, line) {
			t.Fatal("envoy/demo.yaml: infergate endpoint line not found")
		}
		rendered = strings.Replace(rendered, line, line+"\n"+strings.Replace(line, port(t, extprocAddrs[0]), port(t, addr), 1), 1)
	}
	return envoytest.Start(t, rendered)
}

// forwardToGate adds headers to the gate filter's forward_rules, as a user
// who names them in auth.policyHeaders must (Envoy sends the gate only the
// headers listed there).
func forwardToGate(headers ...string) func(*testing.T, string) string {
	return func(t *testing.T, rendered string) string {
		t.Helper()
		const last = "- {exact: user-agent}\n"
		i := strings.Index(rendered, last)
		if i < 0 {
			t.Fatal("the gate's forward_rules: user-agent line not found")
		}
		indent := rendered[strings.LastIndexByte(rendered[:i], '\n')+1 : i]
		var add strings.Builder
		for _, h := range headers {
			add.WriteString(indent + "- {exact: " + h + "}\n")
		}
		at := i + len(last)
		return rendered[:at] + add.String() + rendered[at:]
	}
}

// renderEnvoy fills the port placeholders of a config under envoy/, as
// scripts/render-envoy.sh does.
func renderEnvoy(t *testing.T, rel string, vars map[string]string) string {
	t.Helper()
	return envoytest.Render(t, rel, vars)
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitHTTP polls until url answers 200.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	ready := testutil.HTTPReady(url)
	testutil.Eventually(t, 15*time.Second, func() bool { return ready() == nil }, url+" to answer 200")
}

// stack is Envoy + infergate + two mock pools, the demo topology, on
// either adapter (startAdapterStack): ext_proc (infergate serve beside
// Envoy) or the dynamic module (in Envoy's process).
type stack struct {
	Adapter  adapter
	Envoy    *envoytest.Envoy
	Gateway  *gateway   // the first replica; nil on the module
	Replicas []*gateway // all of them
	PoolA    *pool
	PoolB    *pool     // on the module, PoolA: both of envoy/snippet-module.yaml's pools are one mock here
	Stamps   *stampLog // the request log, whichever process writes it
	AdminURL string    // infergate's /metrics and /debug pages; "" where the adapter serves none yet
	// TimedInEnvoy: the meter times bytes in Envoy as they pass, before
	// Envoy forwards them (the module, the Wasm meter): checkBrackets'
	// upper bound is sound.
	TimedInEnvoy bool
}

// stamp waits for one request's stamp, from either adapter's request log.
func (s *stack) stamp(t *testing.T, requestID string) Stamp {
	t.Helper()
	return s.Stamps.stamp(t, requestID)
}

const testConfig = `
gate:
  maxBodyBytes: 65536
admin:
  debug: {enabled: true} # /debug/requests: the harness listens on loopback
log:
  level: debug
`

func startStack(t *testing.T) *stack {
	return startStackWith(t, testConfig, 1)
}

// startStackWith runs replicas infergate processes with the given config
// behind one Envoy.
func startStackWith(t *testing.T, config string, replicas int) *stack {
	return startStackOn(t, "envoy/demo.yaml", config, replicas)
}

// startStackOn is startStackWith on another bootstrap under envoy/.
func startStackOn(t *testing.T, bootstrap, config string, replicas int) *stack {
	t.Helper()
	return startStackFor(t, bootstrap, func(*stack) string { return config }, replicas)
}

// startStackFor is startStackOn with a config that names the pools'
// addresses; before, if given, runs once the pools are up. Without a
// bootstrap no Envoy is started (the caller brings its own).
func startStackFor(t *testing.T, bootstrap string, config func(*stack) string, replicas int, before ...func(*stack)) *stack {
	t.Helper()
	s := &stack{
		PoolA: startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}),
		PoolB: startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}),
	}
	for _, f := range before {
		f(s)
	}
	var addrs []string
	for range replicas {
		g := startInfergate(t, config(s))
		s.Replicas = append(s.Replicas, g)
		addrs = append(addrs, g.ExtProcAddr)
	}
	s.Adapter, s.Gateway = extProc, s.Replicas[0]
	s.Stamps, s.AdminURL = s.Gateway.stampLog, s.Gateway.AdminURL
	if bootstrap != "" {
		s.Envoy = startEnvoy(t, bootstrap, addrs, s.Replicas[0].XDSAddr, s.PoolA.Addr, s.PoolB.Addr)
	}
	return s
}

// served is the total number of completion requests the pools have seen.
func (s *stack) served() int64 { return s.PoolA.Served() + s.PoolB.Served() }

// event is one SSE event as the client received it.
type event struct {
	At   time.Duration // since the request was sent
	Data string
}

// streamResult is a raw streamed response as the client saw it.
type streamResult struct {
	Status    int
	Header    http.Header
	Body      []byte
	Events    []event
	RequestID string
}

// stream POSTs body and records every byte with its arrival time.
func stream(t *testing.T, url string, body string, hdr map[string]string) streamResult {
	t.Helper()
	return streamWith(t, http.DefaultClient, url, body, hdr)
}

// streamWith is stream through client (e.g. one with a TLS identity).
func streamWith(t *testing.T, client *http.Client, url string, body string, hdr map[string]string) streamResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := streamResult{Status: resp.StatusCode, Header: resp.Header, RequestID: resp.Header.Get("x-request-id")}
	buf := make([]byte, 64<<10)
	var pending []byte
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			at := time.Since(start)
			r.Body = append(r.Body, buf[:n]...)
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.Index(pending, []byte("\n\n"))
				if i < 0 {
					break
				}
				r.Events = append(r.Events, event{At: at, Data: strings.TrimPrefix(string(pending[:i]), "data: ")})
				pending = pending[i+2:]
			}
		}
		if err == io.EOF {
			return r
		}
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
	}
}

// contentEvents keeps the events that carry output text.
func contentEvents(evs []event) []event {
	var out []event
	for _, e := range evs {
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(e.Data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			out = append(out, e)
		}
	}
	return out
}

// connTracker remembers accepted connections so a test can cut them all,
// the way a crashed process would.
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (c *connTracker) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

// CloseAll closes the listener and every connection.
func (c *connTracker) CloseAll() {
	c.Listener.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

func drain(resp *http.Response) { _, _ = io.Copy(io.Discard, resp.Body) }

// hasCount says whether the Prometheus text metrics holds series (name and
// labels) at n; at 0 the series may also be absent (never recorded).
func hasCount(metrics, series string, n int) bool {
	if n == 0 && !strings.Contains(metrics, series+" ") {
		return true
	}
	return strings.Contains(metrics, fmt.Sprintf("%s %d\n", series, n))
}
