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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/spend"
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
	AdminURL string           // the module's admin port (admin.listen), served from Envoy's process
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
	adminAddr := "127.0.0.1:" + freePort(t)
	cfg := fmt.Sprintf("auth: {keys: %s}\npolicy: {dir: %s}\ngate: {maxBodyBytes: 65536}\nlog: {level: debug}\n"+
		"ratelimit: {backend: embedded, embedded: {path: %s}}\nadmin: {listen: %q, debug: {enabled: true}}\n"+
		"models: [pool-a, pool-b]\nprices: {currency: USD, models: {pool-a: {input: 0.15, output: 0.60}}}\n",
		writeKeys(t), policies, filepath.Join(dir, "ledger.db"), adminAddr)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &moduleStack{Pool: startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond}), requests: &testutil.Buffer{},
		AdminURL: "http://" + adminAddr}
	rendered := renderEnvoy(t, "envoy/snippet-module.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "POOL_A_PORT": port(t, s.Pool.Addr), "INFERGATE_CONFIG": cfgPath,
	})
	s.Envoy = envoytest.StartWithEnv(t, []string{"GODEBUG=cgocheck=0", "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir}, s.requests, rendered)
	testutil.Eventually(t, 10*time.Second, func() bool { return testutil.HTTPReady(s.AdminURL+"/readyz")() == nil },
		"the module's admin port")
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
	if err := json.Unmarshal(s.stampLine(t, requestID), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// stampLine waits for the module's stamp of a request and returns its
// request-log line as written.
func (s *moduleStack) stampLine(t *testing.T, requestID string) []byte {
	t.Helper()
	var line []byte
	testutil.Eventually(t, 10*time.Second, func() bool {
		sc := bufio.NewScanner(strings.NewReader(s.requests.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var x Stamp
			if json.Unmarshal(sc.Bytes(), &x) == nil && x.RequestID == requestID {
				line = bytes.Clone(sc.Bytes())
				return true
			}
		}
		return false
	}, "the module's stamp of "+requestID)
	return line
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

	// The module's stamps reach serve's sinks, on the admin port its
	// process serves: the request's metric series, its line on
	// /debug/requests, its charge on /debug/spend.
	t.Run("admin", func(t *testing.T) {
		resp, body := s.post(t, chatBody("pool-a", 6, false, ""), acme)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		id := resp.Header.Get("x-request-id")
		var st spendLine // settled, then recorded by every sink
		if err := json.Unmarshal(s.stampLine(t, id), &st); err != nil || st.Cost == "" || st.TokenSource != "usage" {
			t.Fatalf("stamp %+v (%v): want the pool's usage, priced", st, err)
		}
		metrics := get(t, s.AdminURL+"/metrics")
		for _, series := range [][]string{
			{"gen_ai_client_token_usage", `gen_ai_request_model="pool-a"`, `gen_ai_token_type="output"`, `gen_ai_operation_name="chat"`},
			{"gen_ai_server_request_duration_seconds", `gen_ai_request_model="pool-a"`, `infergate_pool="pool"`},
			{"infergate_gate_decisions_total", `code="allowed"`, `decision="allow"`},
			{"infergate_gate_decisions_total", `code="invalid_api_key"`, `decision="deny"`}, // "no key"
			{"infergate_cost_total", `gen_ai_request_model="pool-a"`, `infergate_tenant="acme"`},
		} {
			if !hasSeries(metrics, series[0], series[1:]...) {
				t.Errorf("/metrics has no series %s with %v", series[0], series[1:])
			}
		}
		if recent := get(t, s.AdminURL+"/debug/requests?format=json"); !strings.Contains(recent, id) {
			t.Errorf("/debug/requests does not list %s", id)
		}
		rep := spendReport(t, s.AdminURL+"/debug/spend?format=json&since=2h&by=tenant,model")
		var acmeA spend.Amount
		for _, r := range rep.Rows {
			if r.Tenant == "acme" && r.Model == "pool-a" {
				acmeA = r.Window
			}
		}
		// Every acme request on pool-a was settled on the pool's usage and
		// priced: the stamp's is one of them.
		if acmeA.Requests == 0 || acmeA.OutputTokens < int64(st.CompletionTokens) || acmeA.Cost < pico(t, st.Cost.String()) {
			t.Errorf("/debug/spend acme/pool-a = %+v; want at least the stamp's %d output tokens, cost %s", acmeA, st.CompletionTokens, st.Cost)
		}
		if h := get(t, s.AdminURL+"/healthz"); !strings.HasPrefix(h, "ok") {
			t.Errorf("/healthz: %q", h)
		}
	})

	// GET /v1/models is the gate's own answer from the catalog (models:),
	// decided as any request: no pool sees it, a caller without a key is
	// refused.
	t.Run("models", func(t *testing.T) {
		before := s.Pool.Served()
		list := func(hdr map[string]string) (*http.Response, []byte) {
			req, err := http.NewRequest(http.MethodGet, s.Envoy.URL+"/v1/models", nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			return resp, b.Bytes()
		}
		resp, body := list(acme)
		var got struct {
			Object string
			Data   []struct{ ID, Object string }
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &got) != nil || got.Object != "list" {
			t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, body)
		}
		var ids []string
		for _, m := range got.Data {
			ids = append(ids, m.ID)
		}
		if !slices.Contains(ids, "pool-a") {
			t.Errorf("acme's listing %v lacks pool-a", ids)
		}
		if st := s.stamp(t, resp.Header.Get("x-request-id")); st.Status != 200 || st.Decision != "allow" || st.Tenant != "acme" {
			t.Errorf("stamp of the listing = %+v", st)
		}
		if resp, body := list(nil); resp.StatusCode != 401 || errorCode(body) == "" {
			t.Errorf("GET /v1/models without a key: %d %s", resp.StatusCode, body)
		}
		if s.Pool.Served() != before {
			t.Error("a listing reached the pool")
		}
	})
}

// hasSeries reports whether Prometheus text metrics hold a sample of the
// metric named name (or its _bucket, _count, _sum) with every label of labels.
func hasSeries(metrics, name string, labels ...string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !strings.Contains(rest, "{") {
			continue
		}
		if suffix, _, _ := strings.Cut(rest, "{"); suffix != "" && suffix != "_bucket" && suffix != "_count" && suffix != "_sum" && suffix != "_total" {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if all {
			return true
		}
	}
	return false
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
