//go:build unix

package e2e

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
)

// A stamp is right or marked, never silently wrong, when infergate stops
// running while a request's first token passes through Envoy: infergate
// runs as its own process, stopped (SIGSTOP) once the client has the
// response's headers and let go (SIGCONT) once the client has the whole
// response. Judged by bracketing on the client's clock: the stamp's first
// token, counted from Envoy's receipt of the request, came no sooner than
// the mock's TTFT after the client sent it and no later than the client
// received it; a stamp that cannot say so must be marked late_read.
// Before, the meter stamped the first token when it could read it again.
func TestStampUnderStoppedInfergate(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "infergate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/infergate")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building infergate: %v\n%s", err, out)
	}
	pool := startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond})
	cfg := filepath.Join(t.TempDir(), "infergate.yaml")
	if err := os.WriteFile(cfg, []byte(testConfig+"ratelimit: {embedded: {path: "+filepath.Join(t.TempDir(), "ledger.db")+"}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	extproc, admin := freeLoopbackAddr(t), freeLoopbackAddr(t)
	requests, logs := &testutil.Buffer{}, &testutil.Buffer{}
	ig := exec.Command(bin, "serve", "--config", cfg, "--extproc-listen", extproc, "--admin-listen", admin)
	ig.Stdout, ig.Stderr = requests, logs
	if err := ig.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ig.Process.Signal(syscall.SIGCONT)
		_ = ig.Process.Kill()
		_ = ig.Wait()
		if t.Failed() {
			t.Logf("infergate log:\n%s\nrequest log:\n%s", logs.String(), requests.String())
		}
	})
	waitHTTP(t, "http://"+admin+"/readyz")
	env := startEnvoy(t, "envoy/demo.yaml", []string{extproc}, freeLoopbackAddr(t), pool.Addr, pool.Addr)

	const mockTTFT = 100 * time.Millisecond
	req, err := http.NewRequest(http.MethodPost, env.URL+"/v1/chat/completions", strings.NewReader(chatBody("pool-a", 5, true, "")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-mock-ttft-ms", "100")
	req.Header.Set("x-mock-itl-ms", "10")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if err := ig.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var firstAt time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); firstAt.IsZero() && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			firstAt = time.Now()
		}
	}
	if err := ig.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := sc.Err(); err != nil || firstAt.IsZero() {
		t.Fatalf("reading the stream: %v (a first token: %v)", err, !firstAt.IsZero())
	}

	st := stampOf(t, requests, resp.Header.Get("x-request-id"))
	first := msDuration(st.GatewayMs + st.ChecksMs + st.TTFTMs) // after Envoy received the request
	t.Logf("timing %q: first token %v after Envoy's receipt (gateway %.2fms, TTFT %.2fms); the client had it %v after sending",
		st.Timing, first, st.GatewayMs, st.TTFTMs, firstAt.Sub(sent))
	switch st.Timing {
	case "late_read":
	case "ok":
		if first < mockTTFT || first > firstAt.Sub(sent) {
			t.Errorf("silently wrong: the stamp's first token came %v after Envoy had the request; the client sent it, "+
				"the mock waited %v, and the client had the token %v after sending", first, mockTTFT, firstAt.Sub(sent))
		}
	default:
		t.Errorf("timing %q, want ok or late_read", st.Timing)
	}
}

// clockStamp is what this test reads of a request-log line.
type clockStamp struct {
	RequestID string  `json:"request_id"`
	Timing    string  `json:"timing"`
	TTFTMs    float64 `json:"ttft_ms"`
	GatewayMs float64 `json:"gateway_ms"`
	ChecksMs  float64 `json:"checks_ms"`
}

// stampOf polls the request log for the request's line (waitFor).
func stampOf(t *testing.T, log *testutil.Buffer, id string) clockStamp {
	t.Helper()
	var found clockStamp
	testutil.Eventually(t, 10*time.Second, func() bool {
		for line := range strings.Lines(log.String()) {
			var s clockStamp
			if json.Unmarshal([]byte(line), &s) == nil && s.RequestID == id && id != "" {
				found = s
				return true
			}
		}
		return false
	}, "the stamp of request "+id)
	return found
}

func msDuration(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// freeLoopbackAddr is a loopback address the kernel chose, free when returned.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
