package e2e

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// A request Envoy retried on the next pool is charged once, for the attempt
// that answered: pool-a fails a share of requests with 503 (no tokens) and
// then resets non-streamed requests before answering (after spending their
// prefill); each is retried on pool-b. The shared Redis counters end at
// exactly the answering attempts' real usage, as the pools themselves count
// it, and the stamps show both attempts and the pool charged.
func TestRetryAcrossPoolsChargesTheAnsweringAttempt(t *testing.T) {
	const (
		budget     = 1_000_000
		maxTokens  = 8
		streamed   = 40 // phase 1: pool-a answers 503 to a quarter of them
		nonStreams = 10 // phase 2: pool-a resets every one before answering
	)
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	extra := "ratelimit: {backend: redis, redis: {address: " + srv.Addr() + "}}\n" + fallbackConfig
	// Budgets are per clock-aligned minute (and hour): run inside one.
	inOneWindow(t)
	s := startStackOn(t, "envoy/sla.yaml", policyConfig(writeKeys(t), loadPolicies(t, budget), extra), 1)
	hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "5", "x-mock-itl-ms": "2"}
	url := s.Envoy.URL + "/v1/chat/completions"

	var ids []string
	send := func(asStream bool) {
		t.Helper()
		r := stream(t, url, chatBody("llama", maxTokens, asStream, ""), hdr)
		if r.Status != http.StatusOK {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		ids = append(ids, r.RequestID)
	}
	s.PoolA.SetFaults(mock.Faults{ErrorRate: 0.25, ErrorStatus: http.StatusServiceUnavailable})
	for range streamed {
		send(true)
	}
	a1, b1 := s.PoolA.Usage(), s.PoolB.Usage()
	s.PoolA.SetFaults(mock.Faults{ResetAfter: 1})
	for range nonStreams {
		send(false)
	}
	a2, b2 := s.PoolA.Usage(), s.PoolB.Usage()

	// What the pools did: every token of phase 1 answered a request (a 503
	// costs nothing); in phase 2 pool-a only spent prefills on attempts that
	// failed, and pool-b answered.
	answered := a1.PromptTokens + a1.CompletionTokens + b2.PromptTokens + b2.CompletionTokens
	answeredOutput := a1.CompletionTokens + b2.CompletionTokens
	failedPrefill := a2.PromptTokens - a1.PromptTokens
	if a2.CompletionTokens != a1.CompletionTokens || failedPrefill == 0 || b1 == b2 {
		t.Fatalf("pool ledgers: pool-a %+v then %+v, pool-b %+v then %+v: the faults did not play out", a1, a2, b1, b2)
	}

	// One stamp per request, charged for the attempt that answered.
	var retried int
	var stamped int64
	for i, id := range ids {
		st := s.Gateway.stamp(t, id)
		stamped += int64(st.PromptTokens + st.CompletionTokens)
		if st.TokenSource != "usage" || !st.Complete || st.CompletionTokens != maxTokens {
			t.Errorf("stamp %d: %+v", i, st)
		}
		switch {
		case st.Attempts == 1 && slices.Equal(st.PoolsTried, []string{"pool-a"}) && st.Pool == "pool-a" && i < streamed:
		case st.Attempts == 2 && slices.Equal(st.PoolsTried, []string{"pool-a", "pool-b"}) && st.Pool == "pool-b":
			retried++
		default:
			t.Errorf("stamp %d: attempts %d, pools tried %v, pool %q", i, st.Attempts, st.PoolsTried, st.Pool)
		}
	}
	if want := streamed/4 + nonStreams; retried != want {
		t.Errorf("%d requests retried on pool-b, want %d", retried, want)
	}
	if n := len(s.Gateway.stamps()); n != len(ids) {
		t.Errorf("%d stamps for %d requests: the meter saw attempts, not requests", n, len(ids))
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == float64(len(ids))
	}, "every reservation to be settled")
	if got := metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`); got != float64(len(ids)) {
		t.Errorf("%v settlements for %d requests", got, len(ids))
	}

	// The shared counters hold the answering attempts' usage, nothing else.
	counter := func(pattern string) int64 {
		t.Helper()
		keys, err := rdb.Keys(context.Background(), pattern).Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("counters %q: %v %v", pattern, keys, err)
		}
		v, err := rdb.Get(context.Background(), keys[0]).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	total := counter("*{tenant=loadtest}:total_tokens*")
	output := counter("*{tenant=loadtest/model=llama}:output_tokens*")
	requests := counter("*{tenant=loadtest/principal=load-client}:requests*")
	t.Logf("%d requests, %d retried: total_tokens counter %d, output_tokens %d, requests %d; "+
		"pools' ledger: answering attempts %d tokens (stamps %d), failed attempts' prefill %d (not charged)",
		len(ids), retried, total, output, requests, answered, stamped, failedPrefill)
	if total != answered || stamped != answered {
		t.Errorf("total_tokens counter %d, stamps %d; the answering attempts used %d", total, stamped, answered)
	}
	if output != answeredOutput {
		t.Errorf("output_tokens counter %d; the answering attempts wrote %d", output, answeredOutput)
	}
	if requests != int64(len(ids)) {
		t.Errorf("requests counter %d for %d requests", requests, len(ids))
	}

	// A following request sees the same figure in its headers: what is
	// left is the budget less the charges and its own reservation.
	s.PoolA.SetFaults(mock.Faults{})
	body := chatBody("llama", maxTokens, true, "")
	r := stream(t, url, body, hdr)
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	remaining, _ := strconv.ParseInt(r.Header.Get("x-ratelimit-remaining-tokens"), 10, 64)
	if want := budget - answered - int64(req.PromptTokens+maxTokens); remaining != want {
		t.Errorf("x-ratelimit-remaining-tokens %d, want %d (budget %d - charged %d - reserved %d)",
			remaining, want, budget, answered, req.PromptTokens+maxTokens)
	}
}
