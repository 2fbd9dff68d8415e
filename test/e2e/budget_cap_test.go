package e2e

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/testutil"
)

// A client that omits max_tokens on a capped tier (the load tier: 64)
// reserves its prompt estimate + the cap (times n), and the request reaches
// the pool with max_tokens set to the cap: the pool, which would otherwise
// write its own default of 200, cannot write more than was reserved. A
// client's own smaller max_tokens is reserved and sent as is.
func TestTierCapIsTheEffectiveMaxTokens(t *testing.T) {
	const budget, tierCap = 1_000_000, 64 // loadTier's max_tokens
	inOneWindow(t)
	s := startStackWith(t, policyConfig(writeKeys(t), loadPolicies(t, budget), ""), 1)
	cfg := s.PoolA.Config()
	cfg.MaxTokens = 200 // what the pool writes when the request names no limit
	s.PoolA.SetConfig(cfg)
	hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "5", "x-mock-itl-ms": "1"}
	url := s.Envoy.URL + "/v1/chat/completions"
	upstreamMaxTokens := func() any {
		t.Helper()
		_, b := s.PoolA.LastRequest()
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("upstream body %q: %v", b, err)
		}
		return body["max_tokens"]
	}
	remaining := func(r streamResult) int64 {
		t.Helper()
		n, err := strconv.ParseInt(r.Header.Get("x-ratelimit-remaining-tokens"), 10, 64)
		if err != nil {
			t.Fatalf("x-ratelimit-remaining-tokens %q", r.Header.Get("x-ratelimit-remaining-tokens"))
		}
		return n
	}

	body := `{"model":"pool-a","stream":true,"messages":[{"role":"user","content":"tell me a story about envoy"}]}`
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	r := stream(t, url, body, hdr)
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	reserved := budget - remaining(r)
	t.Logf("max_tokens unset: reserved %d (prompt estimate %d + cap %d), upstream max_tokens %v",
		reserved, req.PromptTokens, tierCap, upstreamMaxTokens())
	if want := int64(req.PromptTokens + tierCap); reserved != want {
		t.Errorf("reserved %d tokens, want the prompt estimate %d + the cap %d", reserved, req.PromptTokens, tierCap)
	}
	if got := upstreamMaxTokens(); got != float64(tierCap) {
		t.Errorf("upstream max_tokens %v, want the cap %d", got, tierCap)
	}
	st := s.Gateway.stamp(t, r.RequestID)
	if st.CompletionTokens != tierCap || len(contentEvents(r.Events)) != tierCap {
		t.Errorf("the pool wrote %d tokens (%d events), want the cap %d", st.CompletionTokens, len(contentEvents(r.Events)), tierCap)
	}

	// Within the cap: the client's own value, reserved and sent unchanged.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 1
	}, "the first request to be settled")
	charged := int64(st.PromptTokens + st.CompletionTokens)
	r = stream(t, url, chatBody("pool-a", 10, true, ""), hdr)
	if got, want := budget-charged-remaining(r), int64(req.PromptTokens+10); got != want {
		t.Errorf("max_tokens 10: reserved %d, want %d", got, want)
	}
	if got := upstreamMaxTokens(); got != float64(10) {
		t.Errorf("max_tokens 10 went upstream as %v", got)
	}

	// n=2 without max_tokens: each completion may write the cap.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 2
	}, "the second request to be settled")
	charged += int64(s.Gateway.stamp(t, r.RequestID).PromptTokens + s.Gateway.stamp(t, r.RequestID).CompletionTokens)
	r = stream(t, url, strings.Replace(body, `"stream":true`, `"stream":true,"n":2`, 1), hdr)
	if got, want := budget-charged-remaining(r), int64(req.PromptTokens+2*tierCap); got != want {
		t.Errorf("n=2 without max_tokens: reserved %d, want %d (prompt estimate + 2 × the cap)", got, want)
	}
}
