package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// The parity table: the same cases, with the same assertions, through both
// adapters (docs/testing.md, "Parity": what runs on both and what differs).
// One stack per adapter; the cases run in order on it, fail-closed last (it
// takes the gate away).
func TestParity(t *testing.T) {
	for _, a := range adapters {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			inOneWindow(t) // ext_proc: the budget's hour starts now (the module reads the wall clock)
			s := startAdapterStack(t, a, parityConfig(t))
			t.Run("streaming", func(t *testing.T) { parityStreaming(t, s) })
			t.Run("no key", func(t *testing.T) { parityNoKey(t, s) })
			t.Run("apis", func(t *testing.T) { parityAPIs(t, s) })
			t.Run("budget", func(t *testing.T) { parityBudget(t, s) })
			t.Run("hostile", func(t *testing.T) { parityHostile(t, s) })
			t.Run("fail closed", func(t *testing.T) { parityFailClosed(t, s) })
		})
	}
}

// budgetPolicy is a tenant's token budget per hour in the parity policy:
// loadtest's requests reserve 17 + 32 = 49 tokens each and use 6 + 32 = 38
// (the mock's usage), so the first two are admitted only if the first was
// charged its usage, not its reservation (38 + 49 ≤ 90 < 49 + 49), and the
// third is refused only if both were charged (76 + 49 > 90).
const budgetPolicy = `package infergate.ratelimit

limits contains {
	"name": "parity-tokens-per-hour",
	"key": "tenant=loadtest/parity",
	"unit": "total_tokens",
	"amount": 90,
	"window": "1h",
} if input.tenant == "loadtest"
`

// parityConfig is the configuration both adapters read: the test keys, the
// shipped policies with budgetPolicy, the embedded ledger.
func parityConfig(t *testing.T) func(*stack) string {
	t.Helper()
	policies := loadPolicies(t, 1_000_000)
	if err := os.WriteFile(filepath.Join(policies, "parity_budget.rego"), []byte(budgetPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`auth: {keys: %s}
policy: {dir: %s}
gate: {maxBodyBytes: 65536}
log: {level: debug}
ratelimit: {backend: embedded, embedded: {path: %s}}
`, writeKeys(t), policies, filepath.Join(t.TempDir(), "ledger.db"))
	return func(s *stack) string {
		admin := "admin: {debug: {enabled: true}}\n" // serve's address: its flag
		if s.Adapter == module {
			admin = fmt.Sprintf("admin: {listen: %q, debug: {enabled: true}}\n", strings.TrimPrefix(s.AdminURL, "http://"))
		}
		return cfg + admin
	}
}

var acmeKey = map[string]string{"authorization": "Bearer sk-acme-0001"}

// with is hdr plus acme's key.
func with(hdr map[string]string) map[string]string {
	out := map[string]string{"authorization": acmeKey["authorization"]}
	for k, v := range hdr {
		out[k] = v
	}
	return out
}

// metricsOf reads series (name → label match) from the adapter's /metrics;
// nil where it serves none.
func (s *stack) metricsOf(t *testing.T, series map[string][2]string) map[string]float64 {
	t.Helper()
	if s.AdminURL == "" {
		return nil
	}
	out := map[string]float64{}
	for k, nm := range series {
		out[k] = metricSum(t, s.AdminURL, nm[0], nm[1])
	}
	return out
}

// checkTiming brackets a lock-step stream's stamp. Where the adapter serves
// the stamp's detail (/debug/requests), every content event is bracketed
// (checkBrackets); from the request log alone, on both: the first token
// came no earlier than the pool's configured TTFT after the request left
// (the mock waits that long after it arrives), the gaps were timed, and,
// for a meter timing in Envoy, the first token and the longest gap fit in
// what the client saw.
func (s *stack) checkTiming(t *testing.T, r lockstepResult, seqs []int, st Stamp, ttft time.Duration) {
	t.Helper()
	if s.AdminURL != "" {
		checkBrackets(t, s.AdminURL, r, seqs, s.TimedInEnvoy)
	} else if msDur(st.TTFTms)+time.Microsecond < ttft {
		t.Errorf("stamp TTFT %.3f ms: before the pool's TTFT of %v", st.TTFTms, ttft)
	}
	if st.Timing == "late_read" { // the meter's reads were held up: it timed nothing
		t.Logf("%s: the meter's reads were held up (timing %q): its times are not the stream's", s.Adapter, st.Timing)
		return
	}
	first, last := r.Received[seqs[0]].Sub(r.Sent), r.Received[seqs[len(seqs)-1]].Sub(r.Sent)
	if st.TTFTms <= 0 || (s.TimedInEnvoy && msDur(st.TTFTms) > first) {
		t.Errorf("stamp TTFT %v ms; the client saw the first token after %v", st.TTFTms, first)
	}
	if st.Timing != "ok" { // late_stream: held up after the first token, the gaps are not the stream's
		t.Logf("%s: the meter's reads were held up after the first token (timing %q): its gaps are not the stream's", s.Adapter, st.Timing)
		return
	}
	if st.ITLP50ms <= 0 || st.ITLP95ms < st.ITLP50ms || st.ITLMaxms < st.ITLP95ms || (s.TimedInEnvoy && msDur(st.ITLMaxms) > last-ttft) {
		t.Errorf("stamp gaps: p50 %v, p95 %v, max %v ms; the client saw the last token after %v", st.ITLP50ms, st.ITLP95ms, st.ITLMaxms, last)
	}
}

// Byte-exact and incremental: in lock step a buffering gateway deadlocks
// the stream. The gate adds stream_options.include_usage for the meter and
// the gateway removes the usage event before this client, which did not ask
// for it: what it gets is the pool's answer to that upstream body, less
// that one event; a client that asked gets the pool's stream whole. The
// gateway credential stops at the gate. The stamp is bracketed and its
// usage is the pool's.
func parityStreaming(t *testing.T, s *stack) {
	const tokens = 12
	const ttft = 200 * time.Millisecond
	hdr := with(map[string]string{"x-mock-ttft-ms": "200", "x-mock-itl-ms": "30"})
	labels := `gen_ai_operation_name="chat",gen_ai_request_model="pool-a",infergate_pool="pool-a"`
	series := map[string][2]string{
		"ttft":    {"gen_ai_server_time_to_first_token_seconds_count", labels},
		"tpot":    {"gen_ai_server_time_per_output_token_seconds_count", labels},
		"dur":     {"gen_ai_server_request_duration_seconds_count", labels},
		"output":  {"gen_ai_client_token_usage_sum", `gen_ai_token_type="output",infergate_pool="pool-a"`},
		"itl":     {"infergate_inter_token_latency_seconds_count", `gen_ai_request_model="pool-a",infergate_pool="pool-a"`},
		"allowed": {"infergate_gate_decisions_total", `code="allowed",decision="allow"`},
		"late":    {"infergate_meter_errors_total", `reason="late_`},
	}
	before := s.metricsOf(t, series)

	got := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", tokens, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("status %d: %s", got.Status, got.Body)
	}
	fwdHdr, fwd := s.PoolA.LastRequest()
	if !bytes.Contains(fwd, []byte(`"include_usage":true`)) {
		t.Errorf("upstream body lacks the injected include_usage: %s", fwd)
	}
	if fwdHdr.Get("authorization") != "" || fwdHdr.Get("x-infergate-model") != "pool-a" {
		t.Errorf("upstream headers: authorization %q (the gateway credential must stop at the gate), x-infergate-model %q",
			fwdHdr.Get("authorization"), fwdHdr.Get("x-infergate-model"))
	}
	asked := chatBody("pool-a", tokens, true, `,"stream_options":{"include_usage":true}`)
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", asked, hdr))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("body through the gateway differs from the direct body, less its usage event\n got: %q\nwant: %q", got.Body, want.Body)
	}
	seqs := seqsOf(got.Events, isChatContent)
	if len(seqs) != tokens {
		t.Fatalf("got %d content events, want %d", len(seqs), tokens)
	}
	st := s.stamp(t, got.RequestID)
	s.checkTiming(t, got, seqs, st, ttft)
	if st.Status != 200 || !st.Stream || !st.Complete || st.Decision != "allow" || st.Tenant != "acme" || st.Model != "pool-a" || st.API != "chat" {
		t.Errorf("stamp = %+v", st)
	}
	if s.Adapter == extProc && st.Pool != "pool-a" {
		t.Errorf("stamp pool %q", st.Pool)
	}
	if st.CompletionTokens != tokens || st.TokenSource != "usage" || st.PromptTokens == 0 || st.ContentEvents != tokens {
		t.Errorf("stamp tokens = %d (%s), prompt %d, events %d; want %d from usage", st.CompletionTokens, st.TokenSource,
			st.PromptTokens, st.ContentEvents, tokens)
	}

	// The same request in Prometheus, under the OpenTelemetry GenAI names;
	// a stamp whose reads were held up is counted apart, not timed.
	if after := s.metricsOf(t, series); after != nil {
		first, n := float64(timedFirst(st)), float64(timedStream(st))
		for k, want := range map[string]float64{"ttft": first, "tpot": n, "dur": n, "output": tokens, "itl": (tokens - 1) * n, "allowed": 1, "late": 1 - n} {
			if d := after[k] - before[k]; d != want {
				t.Errorf("/metrics: %s{%s} moved by %v, want %v", series[k][0], series[k][1], d, want)
			}
		}
	}

	// A client that asked for usage gets the pool's stream whole.
	if got, want := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/chat/completions", asked, hdr),
		stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", asked, hdr); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("usage asked: status %d, through the gateway\n%q\nwant\n%q", got.Status, got.Body, want.Body)
	}
}

// A request without a key gets its OpenAI-style 401 from the gate, never
// reaches the pool, and is stamped as denied.
func parityNoKey(t *testing.T, s *stack) {
	before := s.served()
	resp, body := s.post(t, chatBody("pool-a", 8, false, ""), nil)
	if resp.StatusCode != 401 || errorCode(body) == "" || !strings.Contains(resp.Header.Get("content-type"), "application/json") {
		t.Errorf("no key: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if s.served() != before {
		t.Error("an unauthenticated request reached the pool")
	}
	st := s.stamp(t, resp.Header.Get("x-request-id"))
	if st.Status != 401 || st.Decision != "deny" {
		t.Errorf("stamp of the refusal = %+v", st)
	}
}

// isTextContent: a text completion event carrying output text.
func isTextContent(e event) bool {
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	return json.Unmarshal([]byte(e.Data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Text != ""
}

// Every API (chat: parityStreaming): completions, the Responses API and
// Anthropic's Messages stream byte-exact and in lock step, stamped with
// their API, bracketed, one content event per token and the usage the pool
// reported and billed; embeddings, float and base64, byte-exact, stamped
// with no first token and the input tokens the pool billed.
func parityAPIs(t *testing.T, s *stack) {
	const tokens = 10
	const ttft = 100 * time.Millisecond
	hdr := with(map[string]string{"x-mock-ttft-ms": "100", "x-mock-itl-ms": "20"})

	t.Run("completions", func(t *testing.T) {
		body := func(extra string) string {
			return fmt.Sprintf(`{"model":"pool-a","max_tokens":%d,"stream":true,"prompt":"tell me a story about envoy"%s}`, tokens, extra)
		}
		billed := s.PoolA.Usage()
		got := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/completions", body(""), hdr)
		used := s.PoolA.Usage()
		want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/completions", body(`,"stream_options":{"include_usage":true}`), hdr))
		if got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
			t.Fatalf("status %d; body through the gateway differs from the direct body, less its usage event\n got: %q\nwant: %q", got.Status, got.Body, want.Body)
		}
		seqs := seqsOf(got.Events, isTextContent)
		if len(seqs) != tokens {
			t.Fatalf("%d content events, want %d", len(seqs), tokens)
		}
		st := s.stamp(t, got.RequestID)
		s.checkTiming(t, got, seqs, st, ttft)
		if st.API != "completions" || st.Status != 200 || !st.Stream || !st.Complete || st.ContentEvents != tokens || st.TokenSource != "usage" ||
			int64(st.PromptTokens) != used.PromptTokens-billed.PromptTokens || int64(st.CompletionTokens) != used.CompletionTokens-billed.CompletionTokens ||
			st.CompletionTokens != tokens {
			t.Errorf("stamp %+v; the pool billed %d + %d", st, used.PromptTokens-billed.PromptTokens, used.CompletionTokens-billed.CompletionTokens)
		}
	})
	for _, a := range namedAPIs {
		t.Run(a.api, func(t *testing.T) {
			got, before, after := a.throughGateway(t, s, tokens, hdr)
			st := s.stamp(t, got.RequestID)
			a.checkStamp(t, s, st, got, tokens, before, after, ttft)
		})
	}
	t.Run("embeddings", func(t *testing.T) { embeddingsStamped(t, s, 100) })
}

// Each charge is the pool's usage, and a budget admits while the charges
// fit and refuses once they do not (budgetPolicy's arithmetic); a refused
// request never reaches the pool.
func parityBudget(t *testing.T, s *stack) {
	load := map[string]string{"authorization": "Bearer sk-load-0001"}
	usage := s.PoolA.Usage()
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
		if st.TokenSource != "usage" || st.Tenant != "loadtest" {
			t.Errorf("request %d: token source %q, tenant %q", i+1, st.TokenSource, st.Tenant)
		}
		charged += st.PromptTokens + st.CompletionTokens
	}
	u := s.PoolA.Usage()
	if pool := u.PromptTokens + u.CompletionTokens - usage.PromptTokens - usage.CompletionTokens; int64(charged) != pool || pool != 76 {
		t.Errorf("stamped %d tokens, the pool billed %d; want 76 both", charged, pool)
	}
	before := s.served()
	resp, body := s.post(t, chatBody("pool-a", 32, false, ""), load)
	if resp.StatusCode != 429 || errorCode(body) == "" {
		t.Fatalf("third request: %d %s; want 429 (76 + 49 > 90)", resp.StatusCode, body)
	}
	if s.served() != before {
		t.Error("a refused request reached the pool")
	}
}

// Hostile clients get their error from the gate, never reach the pool, and
// the stream after them is served byte for byte: JSON nested far deeper
// than 64 levels (refused by the depth check, not the parser's stack),
// model names of 60 KB with and without a key, a body over the gate's limit.
func parityHostile(t *testing.T, s *stack) {
	long := strings.Repeat("m", 60_000)
	for _, c := range []struct {
		name, body string
		hdr        map[string]string
		status     int
		code, msg  string
	}{
		{"deep [", strings.Repeat("[", 60_000), acmeKey, 400, "invalid_json", "nests deeper than 64 levels"},
		{`deep {"a":`, strings.Repeat(`{"a":`, 12_000), acmeKey, 400, "invalid_json", "nests deeper than 64 levels"},
		{"long model, no key", `{"model":"` + long + `","messages":[{"role":"user","content":"hi"}]}`, nil, 401, "", ""},
		{"long model, premium key", `{"model":"` + long + `","messages":[{"role":"user","content":"hi"}]}`, acmeKey, 400, "", ""},
		{"over the gate's limit", chatBody("pool-a", 4, false, "") + strings.Repeat(" ", 70_000), acmeKey, 413, "request_too_large", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := s.served()
			resp, e := post(t, s.Envoy.URL+"/v1/chat/completions", "application/json", c.body, c.hdr)
			if resp.StatusCode != c.status || e.Error.Message == "" || (c.code != "" && e.Error.Code != c.code) || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("%d %+v; want %d %s %q", resp.StatusCode, e.Error, c.status, c.code, c.msg)
			}
			if s.served() != before {
				t.Error("a hostile request reached the pool")
			}
			if st := s.stamp(t, resp.Header.Get("x-request-id")); st.Status != c.status || st.Decision != "deny" || len(st.Model) > 256 {
				t.Errorf("stamp: status %d, decision %q, model of %d bytes", st.Status, st.Decision, len(st.Model))
			}
		})
	}
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", chatBody("pool-a", 4, true, `,"stream_options":{"include_usage":true}`), nil))
	if got := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 4, true, ""), acmeKey); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("after the hostile requests: status %d, body %q", got.Status, got.Body)
	}
}

// Without its gate a request fails closed, in OpenAI's format, promptly,
// and nothing reaches the pool. On ext_proc the gate is another process:
// stopped, Envoy answers 503 gate_unavailable. On the module the gate is in
// Envoy: a panic in it (the test build's hook) fails its request with
// gate_error (503 in the request's headers, 500 in the decision) and Envoy
// serves on.
func parityFailClosed(t *testing.T, s *stack) {
	type attempt struct {
		hdr       map[string]string
		status    int
		typ, code string
	}
	var attempts []attempt
	switch s.Adapter {
	case extProc:
		s.Gateway.Stop(t)
		attempts = []attempt{{acmeKey, 503, "gateway_error", "gate_unavailable"}}
	case module:
		for stage, status := range map[string]int{"request_headers": 503, "decide": 500} {
			attempts = append(attempts, attempt{with(map[string]string{"x-test-panic-at": stage}), status, "", "gate_error"})
		}
	}
	before := s.served()
	for _, a := range attempts {
		start := time.Now()
		resp, e := post(t, s.Envoy.URL+"/v1/chat/completions", "application/json", chatBody("pool-a", 3, true, ""), a.hdr)
		// A hang detector, not a latency bound.
		if elapsed := time.Since(start); elapsed > 10*time.Second {
			t.Errorf("took %v to fail: it hung", elapsed)
		}
		if resp.StatusCode != a.status || e.Error.Code != a.code || (a.typ != "" && e.Error.Type != a.typ) || e.Error.Message == "" {
			t.Errorf("%v: %d %+v; want %d %s %s", a.hdr, resp.StatusCode, e.Error, a.status, a.typ, a.code)
		}
	}
	if n := s.served() - before; n != 0 {
		t.Fatalf("the pool served %d requests without their gate", n)
	}
	if s.Adapter == module {
		if resp, body := s.post(t, chatBody("pool-a", 4, false, ""), acmeKey); resp.StatusCode != 200 {
			t.Fatalf("after the panics: %d %s", resp.StatusCode, body)
		}
		if err := testutil.HTTPReady(s.Envoy.AdminURL + "/ready")(); err != nil {
			t.Errorf("Envoy not ready after the panics: %v", err)
		}
	}
}
