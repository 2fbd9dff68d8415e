package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
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

	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// Tenants of the Redis Cluster test, each with its own key and counters.
// clbefore and clafter hold an output budget of exactly clAdmitted
// requests of clMaxTokens; clflow's budgets are out of reach.
const (
	clMaxTokens = 32
	clAdmitted  = 40
	clFlowMax   = 8    // max_tokens of the failover traffic
	clFlowLimit = 1e12 // clflow's token budgets
	// clPreload is charged to clflow's hourly output counter in Redis
	// before the failover, so that an answer's x-ratelimit-remaining-tokens
	// tells who admitted it: at most clFlowLimit-clPreload when Redis did,
	// near clFlowLimit when a replica's own counters did.
	clPreload = 5e11
	// clWorkers stream back to back during the failover: no more charges
	// than this can be in flight when the primary dies.
	clWorkers = 8
	// clBound tells a hung request from an answer during the failover: a
	// hang detector, not a latency bound (a stream of clFlowMax tokens
	// takes ~40 ms, Redis's timeout is 200 ms; the answer's kind is
	// checked apart).
	clBound = 10 * time.Second
)

var clusterKeys = map[string]struct{ id, tenant string }{
	"sk-cl-before": {"cl-before", "clbefore"},
	"sk-cl-flow":   {"cl-flow", "clflow"},
	"sk-cl-after":  {"cl-after", "clafter"},
	"sk-cl-warm":   {"cl-warm", "clwarm"},
}

var clusterData = fmt.Sprintf(`infergate:
  tiers:
    clbudget:
      rank: 0
      models: ["*"]
      max_tokens: 64
      requests_per_minute: 100000
      tokens_per_minute: 100000000
      output_tokens_per_hour: %d
      checks: []
    clflow:
      rank: 0
      models: ["*"]
      max_tokens: 64
      requests_per_minute: 100000000
      tokens_per_minute: %d
      output_tokens_per_hour: %d
      checks: []
  tenants:
    clbefore: {tier: clbudget}
    clafter: {tier: clbudget}
    clflow: {tier: clflow}
    clwarm: {tier: clflow}
`, clAdmitted*clMaxTokens, int64(clFlowLimit), int64(clFlowLimit))

// Budgets on a Redis Cluster (3 primaries, 1 replica each), two infergate
// replicas behind Envoy: a budget is enforced exactly across the replicas;
// the primary holding the counters is killed while requests flow, and
// while its replica takes over the configured fallback answers (deny: 503
// rate_limit_unavailable; local: admitted on the replica's own counters),
// nothing hangs, and no more charges are lost than were in flight; once
// the replica has taken over, budgets are enforced exactly again.
func TestRedisCluster(t *testing.T) {
	for _, mode := range []string{"deny", "local"} {
		t.Run(mode, func(t *testing.T) { testRedisCluster(t, mode) })
	}
}

func testRedisCluster(t *testing.T, onError string) {
	// The budgets are hourly: keep the test inside one hour.
	clock := inOneWindow(t)
	cluster := redisserver.StartCluster(t, redisserver.ClusterOptions{})
	rdb := cluster.NewClient(t)
	ctx := context.Background()
	extra := fmt.Sprintf("ratelimit:\n  backend: redis\n  onBackendError: %s\n  redis:\n    mode: cluster\n    addresses: [%s]\n",
		onError, strings.Join(cluster.Addrs(), ", "))
	s := startStackWith(t, policyConfig(clusterKeysFile(t), clusterPolicies(t), extra), 2)
	url := s.Envoy.URL + "/v1/chat/completions"
	tag := "{" + ratelimit.DefaultClusterHashTag + "}"
	hour := clock().Truncate(time.Hour).UnixMilli()
	outputCounter := func(tenant string) string {
		return fmt.Sprintf("ig:rl:%s:tenant=%s/model=pool-a:output_tokens:3600000:%d", tag, tenant, hour)
	}

	// Warm up both replicas' Redis clients (connections to the counters'
	// primary, the scripts on it): a cold gate under a burst of
	// requests with the race detector on can exceed Envoy's 1 s ext_proc
	// message timeout (a 504) before it has decided.
	var warm sync.WaitGroup
	for range 20 {
		warm.Go(func() {
			send(url, chatBody("pool-a", 4, true, ""), map[string]string{"authorization": "Bearer sk-cl-warm"})
		})
	}
	warm.Wait()

	// 1. A budget, exactly, across both replicas.
	budget(t, s, url, "sk-cl-before")
	if v, err := rdb.Get(ctx, outputCounter("clbefore")).Int64(); err != nil || v != clAdmitted*clMaxTokens {
		t.Errorf("clbefore's output counter = %d, %v; want %d", v, err, clAdmitted*clMaxTokens)
	}

	// 2. The counters' primary dies under load.
	victim := cluster.PrimaryFor(tag)
	flowHdr := map[string]string{"authorization": "Bearer sk-cl-flow", "x-mock-ttft-ms": "20", "x-mock-itl-ms": "2"}
	flowBody := chatBody("pool-a", clFlowMax, true, "")
	if r := send(url, flowBody, flowHdr); r.status != 200 {
		t.Fatalf("first clflow request: %d %v %s", r.status, r.err, r.body)
	}
	preload(t, victim.Addr(), outputCounter("clflow"))
	served0 := s.served()

	var (
		mu      sync.Mutex
		results []sent
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for range clWorkers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := send(url, flowBody, flowHdr)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	testutil.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= 20 }, "20 answers before the kill")
	killedAt := time.Now()
	promoted, promotion := cluster.KillPrimary(victim)
	t.Logf("killed the counters' primary %s; its replica %s promoted after %v", victim.Addr(), promoted.Addr(), promotion)
	// Keep the load on until every answer of the last second came from
	// Redis again (a failing Redis is retried once a second).
	deadline := time.Now().Add(15 * time.Second)
	for {
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		lastFallback := time.Time{}
		for _, r := range results {
			if classify(r) != "redis" && r.end.After(lastFallback) {
				lastFallback = r.end
			}
		}
		mu.Unlock()
		if time.Since(lastFallback) > time.Second && time.Since(killedAt) > promotion+time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("answers still not all from Redis 15 s after the kill")
			break
		}
	}
	close(stop)
	wg.Wait()

	// What the clients saw.
	counts := map[string]int{}
	var slowest time.Duration
	var firstFallback, lastFallback time.Time
	redisAdmitted := 1 // the first request
	for _, r := range results {
		c := classify(r)
		counts[c]++
		if d := r.end.Sub(r.start); d > slowest {
			slowest = d
		}
		switch c {
		case "redis":
			redisAdmitted++
		case "local", "unavailable":
			if firstFallback.IsZero() || r.end.Before(firstFallback) {
				firstFallback = r.end
			}
			if r.end.After(lastFallback) {
				lastFallback = r.end
			}
		default:
			if counts[c] <= 3 {
				t.Errorf("unexpected answer: %d %v %s", r.status, r.err, r.body)
			}
		}
	}
	t.Logf("onBackendError %s: %d requests by %d workers: %v; slowest %v (bound %v)",
		onError, len(results), clWorkers, counts, slowest.Round(time.Millisecond), clBound)
	if slowest > clBound {
		t.Errorf("a request took %v, more than %v: something hung", slowest, clBound)
	}
	if firstFallback.IsZero() {
		t.Fatalf("no request was answered by the fallback while the primary was down")
	}
	t.Logf("switch: promotion %v after the kill; fallback answers from %v to %v after the kill (%v)",
		promotion.Round(time.Millisecond), firstFallback.Sub(killedAt).Round(time.Millisecond),
		lastFallback.Sub(killedAt).Round(time.Millisecond), lastFallback.Sub(firstFallback).Round(time.Millisecond))
	switch onError {
	case "deny":
		if counts["local"] != 0 || counts["unavailable"] == 0 {
			t.Errorf("onBackendError deny: want 503s and no local admissions: %v", counts)
		}
	case "local":
		if counts["unavailable"] != 0 || counts["local"] == 0 {
			t.Errorf("onBackendError local: want local admissions and no 503: %v", counts)
		}
	}
	if served := s.served() - served0; served != int64(counts["redis"]+counts["local"]) {
		t.Errorf("pools served %d, clients got %d admitted", served, counts["redis"]+counts["local"])
	}

	// The ledger: the counters on the promoted replica against what Redis
	// admitted (every clflow request charges exactly clFlowMax output
	// tokens: reserved, streamed and settled).
	out := counterOn(t, promoted.Addr(), outputCounter("clflow"))
	lostTokens := int64(clPreload) + int64(redisAdmitted*clFlowMax) - out
	requests := sumCounters(t, promoted.Addr(), "ig:rl:"+tag+":tenant=clflow/principal=cl-flow:requests:*")
	lostRequests := int64(redisAdmitted) - requests
	t.Logf("ledger: Redis admitted %d (pools served %d in all); counters on the promoted replica: %d requests, %d output tokens: %d request charges and %d token charges (%d requests' worth) lost",
		redisAdmitted, s.served()-served0+1, requests, out-int64(clPreload), lostRequests, lostTokens, lostTokens/clFlowMax)
	// Settlements refund what a reservation estimated beyond the real use
	// (the mock counts 6 prompt words and streams exactly clFlowMax); those
	// that failed while the primary was down leave their reservation
	// charged: an over-charge, never an under-charge.
	tokens := sumCounters(t, promoted.Addr(), "ig:rl:"+tag+":tenant=clflow:total_tokens:*")
	t.Logf("ledger: the per-minute token counters hold %d tokens beyond the %d the Redis-admitted streams used (refunds of settlements lost in the switch)",
		tokens-int64(redisAdmitted*(6+clFlowMax)), redisAdmitted*(6+clFlowMax))
	if lostRequests < -clWorkers || lostRequests > clWorkers || lostTokens < -clWorkers*clFlowMax || lostTokens > clWorkers*clFlowMax {
		t.Errorf("lost %d requests and %d tokens: more than the %d requests in flight at the kill", lostRequests, lostTokens, clWorkers)
	}

	// 3. Budgets exact again, on the promoted replica, the dead node still
	// dead.
	budget(t, s, url, "sk-cl-after")
	if v := counterOn(t, promoted.Addr(), outputCounter("clafter")); v != clAdmitted*clMaxTokens {
		t.Errorf("clafter's output counter = %d; want %d", v, clAdmitted*clMaxTokens)
	}
	if p := cluster.PrimaryFor(tag); p != promoted {
		t.Errorf("the counters moved to %s", p.Addr())
	}
}

// budget sends 100 concurrent streams with key: exactly clAdmitted are
// admitted (whichever replica decides), the others are 429 with
// x-ratelimit-* headers, and the pools serve exactly the admitted ones.
func budget(t *testing.T, s *stack, url, key string) {
	t.Helper()
	// 100, not 200 as TestTokenBudgetUnderConcurrency: with six Redis
	// nodes, two replicas and Envoy on a shared two-core machine under the
	// race detector, 200 at once push some gate answers past Envoy's 1 s
	// ext_proc message timeout (504) while the gate is still deciding.
	const clients = 100
	hdr := map[string]string{"authorization": "Bearer " + key, "x-mock-ttft-ms": "200", "x-mock-itl-ms": "1"}
	served0 := s.served()
	results := make([]sent, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { results[i] = send(url, chatBody("pool-a", clMaxTokens, true, ""), hdr) })
	}
	wg.Wait()
	statuses := map[int]int{}
	var limited http.Header
	for _, r := range results {
		statuses[r.status]++
		if r.status == 429 {
			limited = r.header
		}
		if r.end.Sub(r.start) > clBound {
			t.Errorf("a request took %v", r.end.Sub(r.start))
		}
	}
	t.Logf("%s: %v (budget %d requests)", key, statuses, clAdmitted)
	if statuses[200] != clAdmitted || statuses[429] != clients-clAdmitted {
		t.Errorf("%s: %v; want %d admitted and %d limited", key, statuses, clAdmitted, clients-clAdmitted)
	}
	for _, h := range []string{"retry-after", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
		if limited.Get(h) == "" {
			t.Errorf("429 lacks %s: %v", h, limited)
		}
	}
	if got := s.served() - served0; got != clAdmitted {
		t.Errorf("pools served %d, want %d", got, clAdmitted)
	}
}

// sent is one request as the client saw it, answer read to the end.
type sent struct {
	start, end time.Time
	status     int
	header     http.Header
	body       string
	err        error
}

var clusterHTTP = &http.Client{Timeout: 10 * time.Second}

func send(url, body string, hdr map[string]string) sent {
	r := sent{start: time.Now()}
	defer func() { r.end = time.Now() }()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := clusterHTTP.Do(req)
	if err != nil {
		r.err = err
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r.status, r.header, r.body, r.err = resp.StatusCode, resp.Header, string(b), err
	r.end = time.Now()
	return r
}

// classify says who answered a clflow request: "redis" or "local" (the
// replica's own counters) for an admitted one, by its remaining tokens;
// "unavailable" for onBackendError deny's 503; anything else is wrong.
func classify(r sent) string {
	switch {
	case r.err != nil:
		return "error"
	case r.status == 200:
		rem, err := strconv.ParseInt(r.header.Get("x-ratelimit-remaining-tokens"), 10, 64)
		switch {
		case err != nil || !strings.Contains(r.body, "[DONE]"):
			return "error"
		case rem <= int64(clFlowLimit-clPreload):
			return "redis"
		default:
			return "local"
		}
	case r.status == 503 && strings.Contains(r.body, "rate_limit_unavailable"):
		return "unavailable"
	}
	return fmt.Sprintf("status %d", r.status)
}

// preload charges clPreload to counter on its primary and waits until the
// replica has it too.
func preload(t *testing.T, primary, counter string) {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.IncrBy(ctx, counter, int64(clPreload)).Err(); err != nil {
		t.Fatalf("INCRBY %s: %v", counter, err)
	}
	if n, err := conn.Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
}

// counterOn reads one counter on one node.
func counterOn(t *testing.T, addr, counter string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	v, err := c.Get(context.Background(), counter).Int64()
	if err != nil {
		t.Fatalf("GET %s on %s: %v", counter, addr, err)
	}
	return v
}

// sumCounters adds up the counters matching pattern on one node.
func sumCounters(t *testing.T, addr, pattern string) int64 {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var keys []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil || len(keys) == 0 {
		t.Fatalf("SCAN %s on %s: %v, %d keys", pattern, addr, err, len(keys))
	}
	slices.Sort(keys)
	var sum int64
	for _, k := range keys {
		v, err := c.Get(ctx, k).Int64()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		sum += v
	}
	return sum
}

func clusterKeysFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("keys:\n")
	for key, k := range clusterKeys {
		sum := sha256.Sum256([]byte(key))
		fmt.Fprintf(&b, "- id: %s\n  sha256: %s\n  tenant: %s\n", k.id, hex.EncodeToString(sum[:]), k.tenant)
	}
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func clusterPolicies(t *testing.T) string {
	t.Helper()
	dir := copyPolicies(t)
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(clusterData), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
