package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// upstream answers every request with its name.
func upstream(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// running is one Serve call.
type running struct {
	srv    *Server
	cancel context.CancelFunc
	done   chan error
}

func serve(t *testing.T, srv *Server, lis net.Listener) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Serve and waits for it (idempotent).
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		r.done <- nil
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return")
	}
}

// envoyProc is the test's Envoy, with helpers to send and count requests.
type envoyProc struct{ *envoytest.Envoy }

// startEnvoy renders envoy/xds-test.yaml and runs the pinned Envoy on it.
func startEnvoy(t *testing.T, vars map[string]string) *envoyProc {
	t.Helper()
	return &envoyProc{envoytest.Start(t, envoytest.Render(t, "envoy/xds-test.yaml", vars))}
}

// stat reads one stat from Envoy's admin; -1 when absent.
func (e *envoyProc) stat(name string) int {
	resp, err := http.Get(e.AdminURL + "/stats?filter=" + name)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if ok && k == name {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// waitStat polls until the stat has the value.
func (e *envoyProc) waitStat(t *testing.T, name string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if e.stat(name) == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s = %d, want %d", name, e.stat(name), want)
}

var client = &http.Client{Timeout: 3 * time.Second}

// do sends one request for model and returns the status and body.
func (e *envoyProc) do(t *testing.T, model string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set(request.ModelHeader, model)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// counts sends n requests and counts answers by body ("pool-a", "pool-b")
// or by status for anything that is not a 200.
func (e *envoyProc) counts(t *testing.T, model string, n int) map[string]int {
	t.Helper()
	c := map[string]int{}
	for range n {
		status, body, _ := e.do(t, model)
		if status != http.StatusOK {
			body = fmt.Sprintf("status %d", status)
		}
		c[body]++
	}
	return c
}

// waitFor sends requests until one is answered by pool and returns how
// long that took since start.
func (e *envoyProc) waitFor(t *testing.T, model, pool string, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	var last string
	for time.Since(start) < within {
		status, body, _ := e.do(t, model)
		if status == http.StatusOK && body == pool {
			return time.Since(start)
		}
		last = fmt.Sprintf("%d %q", status, body)
	}
	t.Fatalf("no request reached %s within %v; last answer %s", pool, within, last)
	return 0
}

// weights is the test's route set: "llama" over both pools, and "qwen"
// with a timeout and retries, so Envoy validates those too.
func weights(a, b uint32) []Route {
	return []Route{
		{VirtualModel: "llama", Weights: map[string]uint32{"pool-a": a, "pool-b": b}},
		{VirtualModel: "qwen", Weights: map[string]uint32{"pool-b": 1}, Timeout: 30 * time.Second,
			Retry: &Retry{Attempts: 2, PerTryTimeout: 10 * time.Second}},
	}
}

func mustSet(t *testing.T, s *Server, routes []Route) string {
	t.Helper()
	v, err := s.SetRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestEnvoy drives a real Envoy through the xDS server: weight changes,
// the unknown-model fallback, and a control-plane outage and restart.
func TestEnvoy(t *testing.T) {
	poolA, poolB := upstream(t, "pool-a"), upstream(t, "pool-b")

	logs := &testutil.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("xds server log:\n%s", logs.String())
		}
	})
	newServer := func() *Server {
		return New(Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xdsAddr := lis.Addr().String()
	_, xdsPort, _ := net.SplitHostPort(xdsAddr)
	_, portA, _ := net.SplitHostPort(poolA)
	_, portB, _ := net.SplitHostPort(poolB)

	// 1. Everything to pool-a. The routes are set before Envoy starts, so
	// its listener does not wait out the initial RDS fetch.
	srv := newServer()
	mustSet(t, srv, weights(100, 0))
	run := serve(t, srv, lis)
	envoy := startEnvoy(t, map[string]string{
		"ADMIN_PORT": "0", "LISTEN_PORT": "0", "XDS_PORT": xdsPort,
		"POOL_A_PORT": portA, "POOL_B_PORT": portB,
	})
	envoy.waitFor(t, "llama", "pool-a", time.Now(), 10*time.Second)
	if c := envoy.settled(t, "llama", "pool-a"); c["pool-a"] != 20 {
		t.Fatalf("weights 100/0: %v", c)
	}

	// 2. Everything to pool-b: time to apply weights.
	start := time.Now()
	mustSet(t, srv, weights(0, 100))
	applied := envoy.waitFor(t, "llama", "pool-b", start, 5*time.Second)
	t.Logf("time to apply weights (SetRoutes to first request on pool-b): %v", applied)
	if c := envoy.settled(t, "llama", "pool-b"); c["pool-b"] != 20 {
		t.Fatalf("weights 0/100: %v", c)
	}

	// 3. Half and half.
	mustSet(t, srv, weights(50, 50))
	envoy.waitFor(t, "llama", "pool-a", time.Now(), 5*time.Second)
	if c := envoy.counts(t, "llama", 200); c["pool-a"] < 50 || c["pool-b"] < 50 || c["pool-a"]+c["pool-b"] != 200 {
		t.Fatalf("weights 50/50: %v", c)
	}

	if status, body, _ := envoy.do(t, "qwen"); status != http.StatusOK || body != "pool-b" {
		t.Fatalf("qwen: %d %q", status, body)
	}

	// 4. Unknown models get an OpenAI-style 404, also with a hostile name.
	for _, model := range []string{"gpt-unknown", `x"}],"evil":{"a":"`} {
		status, body, hdr := envoy.do(t, model)
		var v struct {
			Error struct{ Message, Type, Param, Code string }
		}
		if status != http.StatusNotFound || !strings.HasPrefix(hdr.Get("content-type"), "application/json") ||
			json.Unmarshal([]byte(body), &v) != nil || v.Error.Code != "model_not_found" ||
			v.Error.Type != "invalid_request_error" || !strings.Contains(v.Error.Message, model) {
			t.Fatalf("unknown model %q: %d %s %q", model, status, hdr.Get("content-type"), body)
		}
	}

	// 5. The control plane goes away: Envoy keeps the last weights.
	// Without ADS, the RDS subscription's own stats tell whether its
	// stream is up.
	const connected = "http.llm.rds.infergate.control_plane.connected_state"
	mustSet(t, srv, weights(100, 0))
	start = time.Now()
	envoy.waitFor(t, "llama", "pool-a", start, 5*time.Second)
	if c := envoy.settled(t, "llama", "pool-a"); c["pool-a"] != 20 {
		t.Fatalf("weights 100/0 again: %v", c)
	}
	envoy.waitStat(t, connected, 1, 5*time.Second)
	run.stop(t)
	envoy.waitStat(t, connected, 0, 5*time.Second)
	if c := envoy.counts(t, "llama", 20); c["pool-a"] != 20 {
		t.Fatalf("control plane down: %v", c)
	}

	// A new server on the same port, with the same routes: Envoy
	// reconnects, and the next change applies.
	lis, err = net.Listen("tcp", xdsAddr)
	if err != nil {
		t.Fatal(err)
	}
	srv = newServer()
	mustSet(t, srv, weights(100, 0))
	start = time.Now()
	serve(t, srv, lis)
	envoy.waitStat(t, connected, 1, 10*time.Second)
	t.Logf("reconnected after %v", time.Since(start))
	if c := envoy.settled(t, "llama", "pool-a"); c["pool-a"] != 20 {
		t.Fatalf("after reconnect: %v", c)
	}
	start = time.Now()
	mustSet(t, srv, weights(0, 100))
	applied = envoy.waitFor(t, "llama", "pool-b", start, 5*time.Second)
	t.Logf("time to apply weights after reconnect: %v", applied)
	if c := envoy.settled(t, "llama", "pool-b"); c["pool-b"] != 20 {
		t.Fatalf("weights 0/100 after reconnect: %v", c)
	}
	if n := envoy.stat("http.llm.rds.infergate.update_rejected"); n != 0 {
		t.Errorf("Envoy rejected %d updates", n)
	}
}

// settled samples 20 requests until all land on pool, for up to 2 s: Envoy
// applies a new route configuration on each worker thread in turn, so the
// first request on the new weights does not mean every worker has them.
func (e *envoyProc) settled(t *testing.T, model, pool string) map[string]int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		c := e.counts(t, model, 20)
		if c[pool] == 20 || time.Now().After(deadline) {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
}
