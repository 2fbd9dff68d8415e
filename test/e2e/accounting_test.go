package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// vllmHeader asks the stand-in pool (vllmPool) for vLLM's answer to a
// request with prompt_logprobs: the usage first, then the prompt's
// logprobs, far more than 64 KiB of them.
const vllmHeader = "x-test-vllm-prompt-logprobs"

// The pool's usage in vllmBody.
const vllmPrompt, vllmCompletion = 4000, 60

// vllmBody is a non-streamed chat answer as vLLM writes one for
// "prompt_logprobs": 20: usage, then prompt_logprobs and prompt_token_ids.
func vllmBody() string {
	var b strings.Builder
	b.WriteString(`{"id":"chatcmpl-vllm","object":"chat.completion","created":1700000000,"model":"pool-a",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Once upon a time"},"logprobs":null,"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":` + strconv.Itoa(vllmPrompt) + `,"completion_tokens":` + strconv.Itoa(vllmCompletion) +
		`,"total_tokens":` + strconv.Itoa(vllmPrompt+vllmCompletion) + `,"prompt_tokens_details":null},"prompt_logprobs":[null`)
	for i := 0; b.Len() < 200<<10; i++ {
		b.WriteString(`,{"` + strconv.Itoa(1000+i) + `":{"logprob":-2.5,"rank":4,"decoded_token":" \"usage\": {}"}}`)
	}
	b.WriteString(`],"prompt_token_ids":[1,2,3],"kv_transfer_params":null}`)
	return b.String()
}

// vllmPool serves pool-a: the mock, except for a request carrying
// vllmHeader, answered with vllmBody.
func vllmPool(t *testing.T, mock http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := vllmBody()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(vllmHeader) == "" {
			mock.ServeHTTP(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		w.Header().Set("content-length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	})}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// The charge falls only on proof, through real Envoy: a non-streamed
// answer whose usage comes before 200 KiB of prompt_logprobs is charged the
// pool's usage (not the prompt estimate); a non-streamed request the client
// hangs up on mid-generation, and one Envoy answers itself with a 504
// (the route's timeout), keep their whole reservation; an error the pool
// answered itself costs no tokens. Each charge is read
// from the budget the next request sees (x-ratelimit-remaining-tokens).
func TestAccountingChargesOnlyOnProof(t *testing.T) {
	const budget = 1_000_000
	inOneWindow(t) // one budget window for the whole test
	s := startStackFor(t, "", func(*stack) string { return policyConfig(writeKeys(t), loadPolicies(t, budget), "") }, 1)
	poolA := vllmPool(t, s.PoolA.Handler())
	// pool-b's route times out after 300 ms: Envoy's own 504.
	routeTimeout := func(t *testing.T, rendered string) string {
		t.Helper()
		const route = "route: {cluster: pool-b, timeout: 0s}"
		if !strings.Contains(rendered, route) {
			t.Fatal("envoy/demo.yaml: pool-b's route not found")
		}
		return strings.Replace(rendered, route, "route: {cluster: pool-b, timeout: 0.3s}", 1)
	}
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, poolA, s.PoolB.Addr, routeTimeout)
	url := s.Envoy.URL + "/v1/chat/completions"
	const key = "Bearer sk-load-0001"

	settled := 0.0
	waitSettled := func(what string) {
		t.Helper()
		settled++
		testutil.Eventually(t, 10*time.Second, func() bool {
			return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == settled
		}, what+" to be settled")
	}
	post := func(ctx context.Context, model string, hdr map[string]string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(chatBody(model, 64, false, "")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("content-type", "application/json")
		req.Header.Set("authorization", key)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return http.DefaultClient.Do(req)
	}
	// vllm sends the stand-in's answer; it returns the tokens the budget
	// had left when it was admitted (its own reservation taken).
	vllm := func() int64 {
		t.Helper()
		resp, err := post(context.Background(), "pool-a", map[string]string{vllmHeader: "1"})
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		n, err := strconv.ParseInt(resp.Header.Get("x-ratelimit-remaining-tokens"), 10, 64)
		if err != nil {
			t.Fatalf("x-ratelimit-remaining-tokens %q", resp.Header.Get("x-ratelimit-remaining-tokens"))
		}
		waitSettled("the vLLM answer")
		return n
	}

	// (a) The first request of the window: its reservation is what the
	// budget lost; its charge, what the next one finds gone.
	left := vllm()
	reserved := budget - left
	next := vllm()
	// The stand-in's answer is charged this much each time (the next
	// ones read the budget through another of them).
	vllmCharge := left - next
	if vllmCharge != vllmPrompt+vllmCompletion {
		t.Errorf("usage after 200 KiB of prompt_logprobs: charged %d tokens, want the pool's %d + %d (reserved %d)",
			vllmCharge, vllmPrompt, vllmCompletion, reserved)
	}
	left = next

	// (b) A non-streamed request hung up on while the pool generates.
	served := s.PoolA.Served()
	ctx, hangUp := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		resp, err := post(ctx, "pool-a", map[string]string{"x-mock-ttft-ms": "60000"})
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return s.PoolA.Served() > served }, "the request to reach the pool")
	hangUp()
	if err := <-done; err == nil {
		t.Fatal("the request was answered before the hang-up")
	}
	waitSettled("the request hung up on")
	next = vllm()
	if charged := left - next - vllmCharge; charged != reserved {
		t.Errorf("a non-streamed request hung up on mid-generation: charged %d tokens, want its reservation %d", charged, reserved)
	}
	left = next

	// (c) Envoy's own 504: the pool may be generating still.
	resp, err := post(context.Background(), "pool-b", map[string]string{"x-mock-ttft-ms": "60000"})
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want Envoy's 504", resp.StatusCode)
	}
	waitSettled("the 504")
	next = vllm()
	if charged := left - next - vllmCharge; charged != reserved {
		t.Errorf("Envoy's 504: charged %d tokens, want its reservation %d", charged, reserved)
	}
	left = next

	// An error the pool itself answered (Envoy says via_upstream), read
	// whole, with no usage: the request alone, no tokens.
	resp, err = post(context.Background(), "pool-a", map[string]string{"x-mock-status": "400"})
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want the pool's 400", resp.StatusCode)
	}
	waitSettled("the pool's error")
	if charged := left - vllm() - vllmCharge; charged != 0 {
		t.Errorf("the pool's own error: charged %d tokens, want none", charged)
	}
}
