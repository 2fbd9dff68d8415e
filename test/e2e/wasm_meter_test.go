package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The in-Envoy meter (envoy/wasm-meter.yaml): the same gate, the meter as a
// proxy-wasm module in Envoy, its summaries through Envoy's gRPC access log.

var wasmBuild struct {
	once sync.Once
	path string
	err  error
}

// meterWasm builds the module (as make wasm does) once per test run.
func meterWasm(t *testing.T) string {
	t.Helper()
	wasmBuild.once.Do(func() {
		wasmBuild.path = filepath.Join(repoRoot, "bin", "infergate-meter.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasmBuild.path, "./cmd/infergate-meter-wasm")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			wasmBuild.err = fmt.Errorf("building the Wasm meter: %v\n%s", err, out)
		}
	})
	if wasmBuild.err != nil {
		t.Fatal(wasmBuild.err)
	}
	return wasmBuild.path
}

// startWasmStack is startStackWith(config, 1) on envoy/wasm-meter.yaml,
// with meter.wasm: the access-log service takes the module's summaries.
func startWasmStack(t *testing.T, config string) *stack {
	t.Helper()
	wasm := meterWasm(t)
	config = withWasmMeter(t, config)
	s := startStackFor(t, "", func(*stack) string { return config }, 1)
	s.Envoy = envoytest.Start(t, renderEnvoy(t, "envoy/wasm-meter.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0",
		"EXTPROC_PORT": port(t, s.Gateway.ExtProcAddr), "POOL_A_PORT": port(t, s.PoolA.Addr), "POOL_B_PORT": port(t, s.PoolB.Addr),
		"JWKS_FILE": testIssuer(t).jwksPath, "OTLP_PORT": otlpPort(t), "WASM_FILE": wasm,
	}))
	s.TimedInEnvoy = true
	return s
}

// withWasmMeter sets meter.wasm: true in a YAML config.
func withWasmMeter(t *testing.T, config string) string {
	t.Helper()
	doc := map[string]any{}
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		t.Fatal(err)
	}
	meter, _ := doc["meter"].(map[string]any)
	if meter == nil {
		meter = map[string]any{}
	}
	meter["wasm"] = true
	doc["meter"] = meter
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Through the Wasm meter the body is byte-identical to the mock's own
// answer and arrives event by event; the stamp infergate makes from the
// summary is the ext_proc meter's.
func TestWasmMeterStreamsByteExact(t *testing.T) {
	s := startWasmStack(t, testConfig)
	const tokens = 12
	hdr := map[string]string{"x-mock-ttft-ms": "200", "x-mock-itl-ms": "30"}
	got := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", tokens, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("status %d: %s", got.Status, got.Body)
	}
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
		chatBody("pool-a", tokens, true, `,"stream_options":{"include_usage":true}`), hdr))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("body through the gateway differs from the direct body\n got: %q\nwant: %q", got.Body, want.Body)
	}
	seqs := seqsOf(got.Events, isChatContent)
	if len(seqs) != tokens {
		t.Fatalf("got %d content events, want %d", len(seqs), tokens)
	}
	checkBrackets(t, s.Gateway.AdminURL, got, seqs, true)

	st := s.Gateway.stamp(t, got.RequestID)
	t.Logf("stamp %+v", st)
	if st.Pool != "pool-a" || st.Status != 200 || !st.Stream || !st.Complete || st.Decision != "allow" ||
		st.Model != "pool-a" || !strings.HasPrefix(st.Upstream, "127.0.0.1:") || st.Attempts != 1 {
		t.Errorf("stamp = %+v", st)
	}
	if st.CompletionTokens != tokens || st.TokenSource != "usage" || st.PromptTokens == 0 || st.ContentEvents != tokens {
		t.Errorf("stamp tokens = %d (%s), prompt %d, %d events; want %d from usage", st.CompletionTokens, st.TokenSource,
			st.PromptTokens, st.ContentEvents, tokens)
	}
	if st.Gatewayms <= 0 || st.E2Ems < st.TTFTms {
		t.Errorf("stamp gateway %.3fms, e2e %.3fms, ttft %.3fms", st.Gatewayms, st.E2Ems, st.TTFTms)
	}
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	for _, want := range []string{
		`gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="pool-a",infergate_pool="pool-a"} 1`,
		`infergate_inter_token_latency_seconds_count{gen_ai_request_model="pool-a",infergate_pool="pool-a"} 11`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s; have:\n%s", want, grep(metrics, "gen_ai_"))
		}
	}
}

// The Wasm meter's stamped TTFT and gaps lie between the mock's writes and
// the client's receipts, as the ext_proc meter's do (TestStampMatchesCadence).
func TestWasmMeterStampMatchesCadence(t *testing.T) {
	stampsMatchCadence(t, startWasmStack(t, testConfig), true)
}

// The summary settles the gate's reservation: the request is charged its
// usage, and the next one sees the budget less that charge.
func TestWasmMeterSettlesTheBudget(t *testing.T) {
	const budget, maxTokens = 1_000_000, 10
	inOneWindow(t) // one budget window
	s := startWasmStack(t, policyConfig(writeKeys(t), loadPolicies(t, budget), ""))
	hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "5", "x-mock-itl-ms": "1"}
	url := s.Envoy.URL + "/v1/chat/completions"
	remaining := func(r streamResult) int64 {
		t.Helper()
		var n int64
		if _, err := fmt.Sscan(r.Header.Get("x-ratelimit-remaining-tokens"), &n); err != nil {
			t.Fatalf("x-ratelimit-remaining-tokens %q", r.Header.Get("x-ratelimit-remaining-tokens"))
		}
		return n
	}
	first := stream(t, url, chatBody("pool-a", maxTokens, true, ""), hdr)
	if first.Status != 200 {
		t.Fatalf("status %d: %s", first.Status, first.Body)
	}
	reserved := budget - remaining(first)
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 1
	}, "the request to be settled")
	st := s.Gateway.stamp(t, first.RequestID)
	charged := int64(st.PromptTokens + st.CompletionTokens)
	// The mock counts 6 prompt words and streams exactly max_tokens.
	if st.TokenSource != "usage" || st.PromptTokens != 6 || st.CompletionTokens != maxTokens || st.Tenant != "loadtest" {
		t.Errorf("stamp %+v: want usage 6 + %d for tenant loadtest", st, maxTokens)
	}
	if got := metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_tokens_total", `state="settled"`); got != float64(charged) {
		t.Errorf("settled %v tokens, the usage was %d", got, charged)
	}
	second := stream(t, url, chatBody("pool-a", maxTokens, true, ""), hdr)
	if got := budget - remaining(second); got != charged+reserved {
		t.Errorf("after one settled request the budget is down %d, want its usage %d + the new reservation %d", got, charged, reserved)
	}
	t.Logf("reserved %d, charged %d (usage)", reserved, charged)
}

// A client that leaves mid-stream: the summary Envoy logs says so, the
// stamp is incomplete with the events that passed, and the reservation is
// kept: a stream cut before its end proves no lower cost.
func TestWasmMeterCutStream(t *testing.T) {
	s := startWasmStack(t, policyConfig(writeKeys(t), loadPolicies(t, 1_000_000), ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Envoy.URL+"/v1/chat/completions",
		strings.NewReader(chatBody("pool-a", 60, true, "")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("authorization", "Bearer sk-load-0001")
	req.Header.Set("x-mock-ttft-ms", "20")
	req.Header.Set("x-mock-itl-ms", "20")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	id := resp.Header.Get("x-request-id")
	// Read about five content events, then leave.
	var body []byte
	buf := make([]byte, 4096)
	seen := func() int {
		return bytes.Count(body, []byte(`"content":"`)) - bytes.Count(body, []byte(`"content":""`))
	}
	for seen() < 5 {
		n, err := resp.Body.Read(buf)
		body = append(body, buf[:n]...)
		if err == io.EOF {
			t.Fatal("the stream ended before the client left")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()

	st := s.Gateway.stamp(t, id)
	t.Logf("stamp %+v", st)
	// At least what the client read went by the meter; less than the whole.
	if st.Complete || st.TokenSource != "events" || st.ContentEvents < seen() || st.ContentEvents >= 60 || st.CompletionTokens != st.ContentEvents {
		t.Errorf("cut stream's stamp: complete %v, %d events, %d tokens (%s); want incomplete, at least the %d the client read, counted by events",
			st.Complete, st.ContentEvents, st.CompletionTokens, st.TokenSource, seen())
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 1
	}, "the cut request to be settled")
	// A stream cut before its end proves no cost: its reservation stays.
	if got, want := metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_tokens_total", `state="settled"`),
		metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_tokens_total", `state="reserved"`); got != want || got < float64(st.PromptTokens+60) {
		t.Errorf("settled %v tokens, want the reservation: %v", got, want)
	}
	if n := metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="incomplete"`); n != 1 {
		t.Errorf("meter errors (incomplete) = %v, want 1", n)
	}
}

// The APIs that name their events (the Responses API, Anthropic's
// Messages) through the Wasm meter, as TestStampsMatchCadencePerAPI runs
// them through the ext_proc one: byte-identical, the stamp's API, its
// cadence, one content event per token, and the usage the mock reported
// and billed.
func TestWasmMeterPerAPI(t *testing.T) {
	s := startWasmStack(t, testConfig)
	const tokens, ttft, itl = 16, 50, 20
	hdr := map[string]string{"x-mock-ttft-ms": fmt.Sprint(ttft), "x-mock-itl-ms": fmt.Sprint(itl)}
	for _, a := range namedAPIs {
		t.Run(a.api, func(t *testing.T) {
			got, before, ledger := a.throughGateway(t, s, tokens, hdr)
			st := s.Gateway.stamp(t, got.RequestID)
			t.Logf("stamp %+v", st)
			a.checkStamp(t, s, st, got, tokens, before, ledger, ttft*time.Millisecond)
		})
	}
}
