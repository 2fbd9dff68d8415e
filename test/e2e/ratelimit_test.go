package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// loadTier is a tenant with a small token budget, added next to the
// shipped example data.
const loadTier = `infergate:
  tiers:
    load:
      rank: 0
      models: ["*"]
      max_tokens: 64
      requests_per_minute: 100000
      tokens_per_minute: %d
      output_tokens_per_hour: 100000000
      checks: []
  tenants:
    loadtest:
      tier: load
`

func loadPolicies(t *testing.T, tokensPerMinute int) string {
	t.Helper()
	dir := copyPolicies(t)
	if err := os.WriteFile(filepath.Join(dir, "loadtest.yaml"), fmt.Appendf(nil, loadTier, tokensPerMinute), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// metricSum adds up every sample of a metric whose labels contain match.
func metricSum(t *testing.T, adminURL, name, match string) float64 {
	t.Helper()
	total := 0.0
	for _, line := range strings.Split(get(t, adminURL+"/metrics"), "\n") {
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			total += v
		}
	}
	return total
}

// 200 concurrent streams against a tokens-per-minute budget admit exactly
// what the budget holds — reservations are charged atomically at
// admission — and every reservation that reached a pool is settled with
// the real usage. On a starved machine the gate may answer after Envoy's
// message timeout (504): such a request may hold a reservation it never
// used, and keeps it (the accounting rule: no meter saw it), so the
// reservations, not the 200s, are what the budget admits exactly.
func TestTokenBudgetUnderConcurrency(t *testing.T) {
	const (
		budget    = 2000
		maxTokens = 32
		clients   = 200
		// "tell me a story about envoy": 27 characters, estimated 7 tokens,
		// plus the chat template's 5 per message and 5 per request: each
		// request reserves 17 + 32 = 49 tokens.
		reservation = 17 + maxTokens
		admitted    = budget / reservation // 40
		// The mock counts 6 prompt words and streams exactly maxTokens.
		actual = 6 + maxTokens
	)
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			extra, replicas := "", 1
			var rdb *redis.Client
			if backend == "redis" {
				srv := redisserver.Start(t)
				extra = "ratelimit: {backend: redis, redis: {address: " + srv.Addr() + "}}"
				replicas = 2
				rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
				defer rdb.Close()
			}
			// Budgets are per clock-aligned minute: run the load inside one.
			inOneWindow(t)
			s := startStackWith(t, policyConfig(writeKeys(t), loadPolicies(t, budget), extra), replicas)
			// Keep every stream open until all 200 are decided, so no
			// settlement refunds budget mid-load: the count is exact.
			hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "1500", "x-mock-itl-ms": "1"}
			var wg sync.WaitGroup
			statuses := make([]int, clients)
			var limitedHeader http.Header
			var mu sync.Mutex
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", maxTokens, true, ""), hdr)
					statuses[i] = r.Status
					if r.Status == 429 {
						mu.Lock()
						limitedHeader = r.Header
						mu.Unlock()
					}
					if r.Status == 200 && len(contentEvents(r.Events)) != maxTokens {
						t.Errorf("an admitted stream was cut: %d content events", len(contentEvents(r.Events)))
					}
				}()
			}
			wg.Wait()
			ok, limited, timedOut := 0, 0, 0
			for _, st := range statuses {
				switch st {
				case 200:
					ok++
				case 429:
					limited++
				case 504:
					timedOut++
				default:
					t.Errorf("unexpected status %d", st)
				}
			}
			t.Logf("%s: %d admitted, %d limited, %d past the gate's message timeout (budget %d tokens, %d per reservation)",
				backend, ok, limited, timedOut, budget, reservation)
			if ok > admitted || ok+timedOut < admitted {
				t.Errorf("admitted %d streams (%d timed out), want exactly %d (= %d / %d)", ok, timedOut, admitted, budget, reservation)
			}
			for _, h := range []string{"retry-after", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
				if limitedHeader.Get(h) == "" {
					t.Errorf("429 lacks %s: %v", h, limitedHeader)
				}
			}
			if int(s.served()) != ok {
				t.Errorf("pools served %d, admitted %d", s.served(), ok)
			}
			// Every reservation is settled, on whichever replica metered it.
			deadline := time.Now().Add(5 * time.Second)
			var reserved, settled, settledTokens float64
			for time.Now().Before(deadline) {
				reserved, settled, settledTokens = 0, 0, 0
				for _, g := range s.Replicas {
					reserved += metricSum(t, g.AdminURL, "infergate_ratelimit_reservations_total", `state="reserved"`)
					settled += metricSum(t, g.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`)
					settledTokens += metricSum(t, g.AdminURL, "infergate_ratelimit_tokens_total", `state="settled"`)
				}
				if reserved == admitted && settled == float64(ok) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if reserved != admitted || settled != float64(ok) {
				t.Errorf("reserved %v (want %d), settled %v (want the %d that were served): drift", reserved, admitted, settled, ok)
			}
			if settledTokens != float64(ok*actual) {
				t.Errorf("settled %v tokens, the mock streamed %d", settledTokens, ok*actual)
				for _, g := range s.Replicas {
					for _, st := range g.stamps() {
						if st.Status == 200 && (st.CompletionTokens != maxTokens || !st.Complete || st.TokenSource != "usage") {
							t.Logf("stamp: %+v", st)
						}
					}
				}
			}
			if rdb != nil {
				keys, err := rdb.Keys(context.Background(), "*tenant=loadtest}:total_tokens*").Result()
				if err != nil || len(keys) != 1 {
					t.Fatalf("total-token counters: %v %v", keys, err)
				}
				// The shared counter holds the real usage of what was served,
				// and the whole reservation of what Envoy cut off.
				v, _ := rdb.Get(context.Background(), keys[0]).Int()
				if want := ok*actual + (admitted-ok)*reservation; v != want {
					t.Errorf("redis counter %d, want %d (real usage, and %d reservations no meter saw)", v, want, admitted-ok)
				}
			}
		})
	}
}

// Redis killed mid-load: the gate does what it is told (deny: a quick 503),
// streams already admitted finish intact, nothing hangs or crashes, and the
// gate recovers when Redis is back.
func TestRedisOutage(t *testing.T) {
	srv := redisserver.Start(t)
	extra := "ratelimit: {backend: redis, onBackendError: deny, redis: {address: " + srv.Addr() + ", timeout: 200ms}}"
	s := startStackWith(t, policyConfig(writeKeys(t), loadPolicies(t, 1_000_000), extra), 1)
	c := chatCall("sk-load-0001", "pool-a", 4)
	if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("before the outage: %d %s", resp.StatusCode, e.Error.Message)
	}

	// Load: 8 workers streaming back to back; Redis dies in the middle.
	hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "50", "x-mock-itl-ms": "5"}
	stop := make(chan struct{})
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 16, true, ""), hdr)
				// A hang detector, not a latency bound: the limiter gives
				// Redis 200 ms; a request that has not ended in 10 s waits
				// on something that will not answer.
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("a request took %v: nothing may hang", d)
				}
				if r.Status == 200 && len(contentEvents(r.Events)) != 16 {
					t.Errorf("an admitted stream was cut during the outage")
				}
				mu.Lock()
				counts[r.Status]++
				mu.Unlock()
			}
		}()
	}
	answered := func(status int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return counts[status] >= 8 }
	}
	testutil.Eventually(t, 30*time.Second, answered(200), "8 streams admitted with Redis up")
	srv.Stop()
	testutil.Eventually(t, 30*time.Second, answered(503), "8 refusals with Redis down")
	close(stop)
	wg.Wait()
	t.Logf("statuses under load with Redis killed: %v", counts)
	// A 504 is the gate's message timeout (a starved machine waiting on
	// the dead Redis past it): refused all the same, by Envoy.
	if counts[200] == 0 || counts[503] == 0 || len(counts) != 2+min(counts[504], 1) {
		t.Errorf("want admitted streams before and 503s (or the gate's 504) after the kill, nothing else: %v", counts)
	}
	for range 3 {
		start := time.Now()
		resp, e := c.do(t, s.Envoy.URL)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "rate_limit_unavailable" {
			t.Fatalf("during the outage: %d %q", resp.StatusCode, e.Error.Code)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("a denial took %v during the outage", d)
		}
	}
	srv.Restart()
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp, _ := c.do(t, s.Envoy.URL)
		return resp.StatusCode == 200
	}, "recovery after Redis came back")
	if m := metricSum(t, s.Gateway.AdminURL, "infergate_admission_errors_total", `op="limiter"`); m < 3 {
		t.Errorf("limiter errors metric %v, want >= 3", m)
	}
}

// A policy that does not compile never replaces the working one, on any
// replica: two replicas sharing one policy directory both stay ready and
// keep deciding with the last good version, the refusal in /healthz, the
// metric and the log; a fixed one takes over as soon as it is loaded.
func TestPolicyReload(t *testing.T) {
	dir := loadPolicies(t, 1_000_000)
	s := startStackWith(t, policyConfig(writeKeys(t), dir, ""), 2)
	c := chatCall("sk-load-0001", "pool-a", 4)
	if resp, _ := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	authz := filepath.Join(dir, "authz.rego")
	orig := mustRead(t, authz)
	os.WriteFile(authz, append(slices.Clone(orig), []byte("\nthis is not rego {\n")...), 0o644)
	for i, g := range s.Replicas {
		testutil.Eventually(t, 3*time.Second, func() bool {
			return metricSum(t, g.AdminURL, "infergate_reload_errors_total", `source="policy"`) >= 1
		}, fmt.Sprintf("replica %d to count the refused reload", i))
		if resp, err := http.Get(g.AdminURL + "/readyz"); err != nil || resp.StatusCode != 200 {
			t.Errorf("replica %d not ready with a refused reload: %v %v", i, resp.StatusCode, err)
		}
		if health := get(t, g.AdminURL+"/healthz"); !strings.Contains(health, "serving the last good version") || !strings.Contains(health, "authz.rego") {
			t.Errorf("replica %d /healthz does not say why: %q", i, health)
		}
	}
	for range 10 { // spread over both replicas by Envoy's round robin
		if resp, _ := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
			t.Fatalf("a broken policy replaced the working one: %d", resp.StatusCode)
		}
	}
	// The load tier narrowed to one model, then the policy fixed: a replica
	// cannot load the narrowed tier before the fix (the directory does not
	// compile), so its /healthz clearing means it loaded both, and from then
	// on every request it decides is refused.
	narrowed := strings.Replace(fmt.Sprintf(loadTier, 1_000_000), `models: ["*"]`, `models: [qwen2.5-7b-instruct]`, 1)
	os.WriteFile(filepath.Join(dir, "loadtest.yaml"), []byte(narrowed), 0o644)
	os.WriteFile(authz, orig, 0o644)
	for i, g := range s.Replicas { // each replica polls on its own
		testutil.Eventually(t, 30*time.Second, func() bool { return get(t, g.AdminURL+"/healthz") == "ok\n" },
			fmt.Sprintf("replica %d /healthz to clear after the fix", i))
	}
	for range 10 { // spread over both replicas by Envoy's round robin
		if resp, _ := c.do(t, s.Envoy.URL); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("after both replicas loaded the fix: %d, want 403 (the narrowed tier)", resp.StatusCode)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
