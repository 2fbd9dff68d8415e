package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Shadow mode evaluates and records the policy's denials but enforces none.
func TestShadowModeRecordsWithoutEnforcing(t *testing.T) {
	t.Parallel()
	cfg := policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), "") + "\n" // policy.shadow below
	cfg = strings.Replace(cfg, "reloadInterval: 200ms", "reloadInterval: 200ms\n  shadow: true", 1)
	s := startStackWith(t, cfg, 1)
	resp, e := chatCall("sk-initech-0001", "llama-3.1-70b-instruct", 4).do(t, s.Envoy.URL)
	if resp.StatusCode != 200 {
		t.Fatalf("shadow mode enforced a denial: %d %s", resp.StatusCode, e.Error.Message)
	}
	st := s.Gateway.stamp(t, resp.Header.Get("x-request-id"))
	if st.Decision != "shadow_deny" || !strings.Contains(st.Reason, "not available on the free tier") {
		t.Errorf("stamp decision %q reason %q", st.Decision, st.Reason)
	}
	if m := metricSum(t, s.Gateway.AdminURL, "infergate_gate_decisions_total", `decision="shadow_deny"`); m != 1 {
		t.Errorf("shadow_deny metric %v", m)
	}
}

// A policy can require an external check (moderation): it runs with its
// own timeout, denies what it rejects, and its time is kept apart from the
// gateway's in the stamp.
func TestModerationCheck(t *testing.T) {
	var calls atomic.Int64
	moderation := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		time.Sleep(40 * time.Millisecond) // a slow classifier
		if strings.Contains(string(body), "forbidden") {
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(map[string]string{"reason": "the prompt asks for forbidden content"})
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer moderation.Close()
	dir := copyPolicies(t)
	tier := strings.Replace(fmt.Sprintf(loadTier, 1_000_000), "checks: []", "checks: [moderation]", 1)
	os.WriteFile(filepath.Join(dir, "loadtest.yaml"), []byte(tier), 0o644)
	extra := "checks: {moderation: {url: " + moderation.URL + ", timeout: 500ms, onError: deny}}"
	s := startStackWith(t, policyConfig(writeKeys(t), dir, extra), 1)

	ok := chatCall("sk-load-0001", "pool-a", 4)
	resp, e := ok.do(t, s.Envoy.URL)
	if resp.StatusCode != 200 {
		t.Fatalf("clean prompt: %d %s", resp.StatusCode, e.Error.Message)
	}
	st := s.Gateway.stamp(t, resp.Header.Get("x-request-id"))
	if st.Checksms < 40 {
		t.Errorf("checks_ms %.3f, want >= 40 (the classifier's time)", st.Checksms)
	}
	// Counted once, in moderation: gateway + moderation + model adds up to
	// the total (a moderation also in gateway time would not).
	if sum := st.Gatewayms + st.Checksms + st.E2Ems; math.Abs(sum-st.Totalms) > 0.01 {
		t.Errorf("gateway %.3f + moderation %.3f + model %.3f = %.3f != total %.3f", st.Gatewayms, st.Checksms, st.E2Ems, sum, st.Totalms)
	}
	bad := ok
	bad.body = `{"model":"pool-a","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"something forbidden"}]}`
	resp, e = bad.do(t, s.Envoy.URL)
	if resp.StatusCode != 400 || e.Error.Code != "content_policy_violation" || !strings.Contains(e.Error.Message, "forbidden content") {
		t.Errorf("flagged prompt: %d %+v", resp.StatusCode, e.Error)
	}
	if calls.Load() != 2 || s.served() != 1 {
		t.Errorf("moderation calls %d, pool requests %d; want 2 and 1", calls.Load(), s.served())
	}
	// The flagged request's reservation was released, not left charged.
	if r, st := metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="reserved"`),
		metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`); r != st {
		t.Errorf("reserved %v, settled %v", r, st)
	}
}
