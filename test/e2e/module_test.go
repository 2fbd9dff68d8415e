package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The gate and the meter as a dynamic module inside Envoy
// (cmd/infergate-module, envoy/snippet-module.yaml): the module is built
// here (with the test-only panic hook, tag infergate_panic_hook), loaded by
// the pinned Envoy from a temp search path, configured by the same file
// serve reads; its request log is Envoy's standard output.

// moduleStack is Envoy with the module in front of one mock pool.
type moduleStack struct {
	Envoy    *envoytest.Envoy
	Pool     *pool
	requests *testutil.Buffer // Envoy's stdout: the module's request log
}

// buildModule builds libinfergate.so into dir, with the panic hook.
func buildModule(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-tags", "infergate_panic_hook", "-buildmode=c-shared",
		"-o", filepath.Join(dir, "libinfergate.so"), "./cmd/infergate-module")
	cmd.Dir, cmd.Env = repoRoot, append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the module: %v\n%s", err, out)
	}
}

// moduleBudget is a tenant's token budget per hour in the test's policy:
// loadtest's requests reserve 17 + 32 = 49 tokens each and use 6 + 32 = 38
// (the mock's usage), so the first two are admitted only if the first was
// charged its usage, not its reservation (38 + 49 ≤ 90 < 49 + 49), and the
// third is refused only if both were charged (76 + 49 > 90).
const moduleBudget = `package infergate.ratelimit

limits contains {
	"name": "module-test-tokens-per-hour",
	"key": "tenant=loadtest/module-test",
	"unit": "total_tokens",
	"amount": 90,
	"window": "1h",
} if input.tenant == "loadtest"
`

func startModuleStack(t *testing.T) *moduleStack {
	t.Helper()
	dir := t.TempDir()
	buildModule(t, dir)
	policies := loadPolicies(t, 1000000)
	if err := os.WriteFile(filepath.Join(policies, "module_budget.rego"), []byte(moduleBudget), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "infergate.yaml")
	cfg := fmt.Sprintf("auth: {keys: %s}\npolicy: {dir: %s}\ngate: {maxBodyBytes: 65536}\nlog: {level: debug}\n"+
		"ratelimit: {backend: embedded, embedded: {path: %s}}\n", writeKeys(t), policies, filepath.Join(dir, "ledger.db"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &moduleStack{Pool: startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}), requests: &testutil.Buffer{}}
	rendered := renderEnvoy(t, "envoy/snippet-module.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "POOL_A_PORT": port(t, s.Pool.Addr), "INFERGATE_CONFIG": cfgPath,
	})
	s.Envoy = envoytest.StartWithEnv(t, []string{"GODEBUG=cgocheck=0", "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir}, s.requests, rendered)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("module request log:\n%s", s.requests.String())
		}
	})
	return s
}

// stamp waits for the module's stamp of a request: it is written once the
// request is settled.
func (s *moduleStack) stamp(t *testing.T, requestID string) Stamp {
	t.Helper()
	var st Stamp
	testutil.Eventually(t, 10*time.Second, func() bool {
		sc := bufio.NewScanner(strings.NewReader(s.requests.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var x Stamp
			if json.Unmarshal(sc.Bytes(), &x) == nil && x.RequestID == requestID {
				st = x
				return true
			}
		}
		return false
	}, "the module's stamp of "+requestID)
	return st
}

func (s *moduleStack) post(t *testing.T, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.Envoy.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp, b.Bytes()
}

// errorCode is the code of an OpenAI-style error body ("" if it is none).
func errorCode(b []byte) string {
	var e struct {
		Error struct{ Type, Code string }
	}
	if json.Unmarshal(b, &e) != nil || e.Error.Type == "" {
		return ""
	}
	return e.Error.Code
}

func TestModule(t *testing.T) {
	s := startModuleStack(t)
	acme := map[string]string{"authorization": "Bearer sk-acme-0001"}

	// Byte-exact and incremental: in lock step a buffering filter deadlocks
	// the stream. The stamp is the module's: TTFT and ITL timed in Envoy's
	// process, the usage read from the pool's own chunk.
	t.Run("streaming", func(t *testing.T) {
		const tokens = 12
		hdr := map[string]string{"authorization": "Bearer sk-acme-0001", "x-mock-ttft-ms": "100", "x-mock-itl-ms": "20"}
		got := mustLockstep(t, s.Pool, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", tokens, true, ""), hdr)
		if got.Status != 200 {
			t.Fatalf("status %d: %s", got.Status, got.Body)
		}
		fwdHdr, fwd := s.Pool.LastRequest()
		if !bytes.Contains(fwd, []byte(`"include_usage":true`)) {
			t.Errorf("upstream body lacks the injected include_usage: %s", fwd)
		}
		if fwdHdr.Get("authorization") != "" || fwdHdr.Get("x-infergate-model") != "pool-a" {
			t.Errorf("upstream headers: authorization %q (the gateway credential must stop at the gate), x-infergate-model %q",
				fwdHdr.Get("authorization"), fwdHdr.Get("x-infergate-model"))
		}
		// The client asked for no usage: the module removes the usage
		// event after its meter read it.
		want := unasked(t, stream(t, "http://"+s.Pool.Addr+"/v1/chat/completions",
			chatBody("pool-a", tokens, true, `,"stream_options":{"include_usage":true}`), hdr))
		if !bytes.Equal(got.Body, want.Body) {
			t.Fatalf("body through the module differs from the direct body, less its usage event\n got: %q\nwant: %q", got.Body, want.Body)
		}
		// A client that asked for usage gets the pool's stream whole.
		asked := chatBody("pool-a", tokens, true, `,"stream_options":{"include_usage":true}`)
		if got, want := mustLockstep(t, s.Pool, s.Envoy.URL+"/v1/chat/completions", asked, hdr),
			stream(t, "http://"+s.Pool.Addr+"/v1/chat/completions", asked, hdr); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
			t.Errorf("usage asked: status %d, through the module\n%q\nwant\n%q", got.Status, got.Body, want.Body)
		}
		if n := len(seqsOf(got.Events, isChatContent)); n != tokens {
			t.Fatalf("got %d content events, want %d", n, tokens)
		}
		st := s.stamp(t, got.RequestID)
		if st.Status != 200 || !st.Stream || !st.Complete || st.Decision != "allow" || st.Tenant != "acme" || st.Model != "pool-a" {
			t.Errorf("stamp = %+v", st)
		}
		if st.CompletionTokens != tokens || st.TokenSource != "usage" || st.PromptTokens == 0 || st.ContentEvents != tokens {
			t.Errorf("stamp tokens = %d (%s), prompt %d, events %d; want %d from usage", st.CompletionTokens, st.TokenSource,
				st.PromptTokens, st.ContentEvents, tokens)
		}
		// The first token left the pool after the client sent the request
		// and reached the client before it acknowledged it: TTFT is within
		// those two, as the module read it; gaps were timed (11 of them).
		if st.TTFTms <= 0 || st.TTFTms > got.Received[firstContent(got)].Sub(got.Sent).Seconds()*1000 || st.ITLP50ms <= 0 || st.ITLMaxms <= 0 {
			t.Errorf("stamp timings: ttft %v ms (client saw the first token after %v), itl p50 %v ms, max %v ms",
				st.TTFTms, got.Received[firstContent(got)].Sub(got.Sent), st.ITLP50ms, st.ITLMaxms)
		}
	})

	t.Run("no key", func(t *testing.T) {
		before := s.Pool.Served()
		resp, body := s.post(t, chatBody("pool-a", 8, false, ""), nil)
		if resp.StatusCode != 401 || resp.Header.Get("x-infergate-error") == "" || errorCode(body) == "" ||
			!strings.Contains(resp.Header.Get("content-type"), "application/json") {
			t.Errorf("no key: %d %v %s", resp.StatusCode, resp.Header, body)
		}
		if s.Pool.Served() != before {
			t.Error("an unauthenticated request reached the pool")
		}
		st := s.stamp(t, resp.Header.Get("x-request-id"))
		if st.Status != 401 || st.Decision != "deny" {
			t.Errorf("stamp of the refusal = %+v", st)
		}
	})

	// A budget admits while the charges fit and refuses once they do not;
	// each charge is the pool's usage (moduleBudget's arithmetic).
	t.Run("budget", func(t *testing.T) {
		load := map[string]string{"authorization": "Bearer sk-load-0001"}
		usage := s.Pool.Usage()
		var charged int
		for i := range 2 {
			resp, body := s.post(t, chatBody("pool-a", 32, false, ""), load)
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, body)
			}
			if resp.Header.Get("x-ratelimit-limit-tokens") == "" || resp.Header.Get("x-ratelimit-remaining-tokens") == "" {
				t.Errorf("request %d: no x-ratelimit-*-tokens headers: %v", i+1, resp.Header)
			}
			st := s.stamp(t, resp.Header.Get("x-request-id")) // settled before it is stamped
			if st.TokenSource != "usage" {
				t.Errorf("request %d: token source %q", i+1, st.TokenSource)
			}
			charged += st.PromptTokens + st.CompletionTokens
		}
		u := s.Pool.Usage()
		if pool := u.PromptTokens + u.CompletionTokens - usage.PromptTokens - usage.CompletionTokens; int64(charged) != pool || pool != 76 {
			t.Errorf("stamped %d tokens, the pool billed %d; want 76 both", charged, pool)
		}
		before := s.Pool.Served()
		resp, body := s.post(t, chatBody("pool-a", 32, false, ""), load)
		if resp.StatusCode != 429 || errorCode(body) == "" {
			t.Fatalf("third request: %d %s; want 429 (76 + 49 > 90)", resp.StatusCode, body)
		}
		if s.Pool.Served() != before {
			t.Error("a refused request reached the pool")
		}
	})

	// A panic in the module fails its request closed and Envoy serves on.
	t.Run("panic", func(t *testing.T) {
		for stage, want := range map[string]int{"request_headers": 503, "decide": 500} {
			hdr := map[string]string{"authorization": "Bearer sk-acme-0001", "x-test-panic-at": stage}
			resp, body := s.post(t, chatBody("pool-a", 4, false, ""), hdr)
			if resp.StatusCode != want || errorCode(body) != "gate_error" {
				t.Errorf("panic at %s: %d %s; want %d gate_error", stage, resp.StatusCode, body, want)
			}
		}
		// On the response path the response passes whole; the meter stops.
		hdr := map[string]string{"authorization": "Bearer sk-acme-0001", "x-test-panic-at": "response_body"}
		if resp, body := s.post(t, chatBody("pool-a", 4, false, ""), hdr); resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"usage"`)) {
			t.Errorf("panic on the response: %d %s; want the pool's answer", resp.StatusCode, body)
		}
		resp, body := s.post(t, chatBody("pool-a", 4, false, ""), acme)
		if resp.StatusCode != 200 {
			t.Fatalf("after the panics: %d %s", resp.StatusCode, body)
		}
		if ready := testutil.HTTPReady(s.Envoy.AdminURL + "/ready"); ready() != nil {
			t.Errorf("Envoy not ready after the panics: %v", ready())
		}
	})
}

// firstContent is the index of the first content event of a chat stream.
func firstContent(r lockstepResult) int {
	for i, e := range r.Events {
		if isChatContent(e) {
			return i
		}
	}
	return 0
}
