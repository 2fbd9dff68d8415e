package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/testutil"
)

// The official SDKs' plainest streaming loops (choices[0] read unguarded,
// no stream_options) run unchanged through the gateway with budgets on:
// the usage-only chunk the gate asked of the pool for the meter never
// reaches them (it would raise IndexError / TypeError), and they print what
// the same loop prints against the pool directly, on chat, completions and
// Responses; each is charged (the spend ledger) exactly what the pool
// billed for it.
func TestPlainSDKLoopsSeeNoUsageChunk(t *testing.T) {
	t.Parallel()
	s := startStackFor(t, "envoy/demo.yaml", func(*stack) string { return policyConfig(writeKeys(t), loadPolicies(t, 1_000_000), spendPrices) }, 1)
	clients := map[string][]string{
		"python": {filepath.Join(repoRoot, ".tools", "py-venv", "bin", "python"), filepath.Join(repoRoot, "test", "clients", "plain_loop.py")},
		"node":   {"node", filepath.Join(repoRoot, "test", "clients", "plain_loop.mjs")},
	}
	run := func(t *testing.T, argv []string, baseURL, api string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*lockstepTimeout)
		defer cancel()
		args := append(argv[1:], "--base-url", baseURL, "--api-key", "sk-load-0001", "--model", "pool-b", "--api", api, "--prompt", "hello plain loop")
		out, err := exec.CommandContext(ctx, argv[0], args...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s %s: %v\n%s", filepath.Base(argv[1]), api, err, stderr)
		}
		return string(out)
	}
	for name, argv := range clients {
		for _, api := range []string{"chat", "completions", "responses"} {
			t.Run(name+"/"+api, func(t *testing.T) {
				direct := run(t, argv, "http://"+s.PoolB.Addr+"/v1", api)
				if direct == "" {
					t.Fatal("the pool streamed no text")
				}
				spent := func() spend.Amount {
					return spendReport(t, s.Gateway.AdminURL+"/debug/spend?format=json&since=2h").Total
				}
				before, billed := spent(), s.PoolB.Usage()
				if got := run(t, argv, s.Envoy.URL+"/v1", api); got != direct {
					t.Errorf("through the gateway %q, directly %q", got, direct)
				}
				// The charge is still the pool's own usage: the meter read
				// the event before it was removed.
				var charged spend.Amount
				testutil.Eventually(t, 10*time.Second, func() bool {
					charged = spent()
					return charged.Requests > before.Requests
				}, "the request's settlement in the spend ledger")
				used := s.PoolB.Usage()
				if in, out := charged.InputTokens-before.InputTokens, charged.OutputTokens-before.OutputTokens; charged.Requests != before.Requests+1 ||
					in != used.PromptTokens-billed.PromptTokens || out != used.CompletionTokens-billed.CompletionTokens {
					t.Errorf("charged %d requests, %d input and %d output tokens; the pool billed 1, %d and %d",
						charged.Requests-before.Requests, in, out, used.PromptTokens-billed.PromptTokens, used.CompletionTokens-billed.CompletionTokens)
				}
			})
		}
	}

	// A client that asked for usage gets the pool's stream byte for byte.
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"pool-b","max_tokens":16,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"asked"}]}`},
		{"/v1/completions", `{"model":"pool-b","max_tokens":16,"stream":true,"stream_options":{"include_usage":true},"prompt":"asked"}`},
	} {
		direct := stream(t, "http://"+s.PoolB.Addr+c.path, c.body, nil)
		got := stream(t, s.Envoy.URL+c.path, c.body, map[string]string{"authorization": "Bearer sk-load-0001"})
		if got.Status != 200 || !bytes.Equal(got.Body, direct.Body) || !bytes.Contains(got.Body, []byte(`"choices":[]`)) {
			t.Errorf("%s, usage asked: status %d, through the gateway\n%s\ndirectly\n%s", c.path, got.Status, got.Body, direct.Body)
		}
	}
}
