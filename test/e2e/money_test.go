package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// moneyPrices price the demo's two models apart, dear enough that a
// budget of one dollar admits a few dozen requests; pool-b's output is
// cheaper on the pool-b pool, so the gate reserves at the model's (the
// dearest) and settles at the pool's.
const moneyPrices = `
prices:
  currency: USD
  models:
    pool-a: {input: 100, cachedInput: 10, output: 400}
    pool-b:
      input: 300
      cachedInput: 30
      output: 1000
      pools:
        pool-b: {output: 800}
`

// moneyData: tenants with budgets in money only (their token budgets are
// far out of reach), one dollar a day each; moneyc's keys carry a monthly
// budget of their own.
const moneyData = `infergate:
  tiers:
    money:
      rank: 0
      models: ["*"]
      max_tokens: 64
      requests_per_minute: 100000
      tokens_per_minute: 100000000
      output_tokens_per_hour: 100000000
      checks: []
  tenants:
    moneya: {tier: money, budgets: {tenant: {day: 1}}}
    moneyb: {tier: money, budgets: {tenant: {day: 1}}}
    moneyc: {tier: money}
`

// moneyKeys are the keys of the money tenants: sk-<tenant>; moneyc's with
// a monthly budget of one dollar.
func moneyKeys(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("keys:\n")
	for _, tenant := range []string{"moneya", "moneyb", "moneyc"} {
		sum := sha256.Sum256([]byte("sk-" + tenant))
		fmt.Fprintf(&b, "- id: %s-key\n  sha256: %s\n  tenant: %s\n", tenant, hex.EncodeToString(sum[:]), tenant)
		if tenant == "moneyc" {
			b.WriteString("  budgetMonth: \"1\"\n")
		}
	}
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func moneyPolicies(t *testing.T) string {
	t.Helper()
	dir := copyPolicies(t)
	if err := os.WriteFile(filepath.Join(dir, "money.yaml"), []byte(moneyData), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// moneyModel is one model's prices as the test reckons them, in
// micro-dollars per million tokens (= pico-dollars per token).
type moneyModel struct {
	in, cached, out   int64 // the answering pool's
	worstIn, worstOut int64 // the dearest over the model's pools: what the gate reserves at
}

var moneyModels = map[string]moneyModel{
	"pool-a": {in: 100e6, cached: 10e6, out: 400e6, worstIn: 100e6, worstOut: 400e6},
	"pool-b": {in: 300e6, cached: 30e6, out: 800e6, worstIn: 300e6, worstOut: 1000e6},
}

// Two tenants with a money budget per day, each on its own model, 200
// concurrent streams: the reservations (worst-case cost: the estimated
// prompt at the dearest input price, max_tokens at the dearest output
// price) admit exactly what each budget allows, in memory and in Redis
// shared by two replicas; once the streams end, each tenant's counter
// holds the pools' reported usage × the answering pool's price, the cached
// prompt tokens at the cached price (and the whole reservation of any
// request no meter saw). The x-ratelimit-*-money headers say so.
func TestMoneyBudgetUnderConcurrency(t *testing.T) {
	const (
		budget    = int64(1e12) // one dollar a day, in pico-dollars
		maxTokens = 32
		clients   = 200
		// "tell me a story about envoy" is estimated 17 prompt tokens with
		// the chat template (see TestTokenBudgetUnderConcurrency).
		estimated = 17
		cached    = 3
	)
	tenantModel := map[string]string{"moneya": "pool-a", "moneyb": "pool-b"}
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			extra, replicas := "", 1
			var rdb *redis.Client
			if backend == "redis" {
				srv := redisserver.Start(t)
				extra = "ratelimit: {backend: redis, redis: {address: " + srv.Addr() + "}}\n"
				replicas = 2
				rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
				defer rdb.Close()
			}
			inOneWindow(t)
			s := startStackWith(t, policyConfig(moneyKeys(t), moneyPolicies(t), extra+moneyPrices), replicas)
			beforeA, beforeB := s.PoolA.Usage(), s.PoolB.Usage()
			// Every stream stays open until all are decided: no settlement
			// refunds budget mid-load, the count is exact.
			var wg sync.WaitGroup
			statuses := make([]int, clients)
			headers := make([]http.Header, clients)
			for i := range clients {
				tenant := []string{"moneya", "moneyb"}[i%2]
				hdr := map[string]string{"authorization": "Bearer sk-" + tenant, "x-mock-ttft-ms": "1500", "x-mock-itl-ms": "1",
					"x-mock-cached-tokens": strconv.Itoa(cached)}
				wg.Go(func() {
					r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody(tenantModel[tenant], maxTokens, true, ""), hdr)
					statuses[i], headers[i] = r.Status, r.Header
				})
			}
			wg.Wait()
			served := map[string]int{}
			for i, tenant := range []string{"moneya", "moneyb"} {
				m := moneyModels[tenantModel[tenant]]
				worst := estimated*m.worstIn + maxTokens*m.worstOut
				admitted := int(budget / worst)
				ok, limited, timedOut := 0, 0, 0
				for j := i; j < clients; j += 2 {
					switch statuses[j] {
					case 200:
						ok++
					case 429:
						limited++
						h := headers[j]
						if h.Get("x-ratelimit-limit-money") != "1" || h.Get("x-ratelimit-remaining-money") == "" ||
							h.Get("x-ratelimit-reset-money") == "" || h.Get("retry-after") == "" {
							t.Errorf("%s: a 429 without the money headers: %v", tenant, h)
						}
					case 504:
						timedOut++
					default:
						t.Errorf("%s: unexpected status %d", tenant, statuses[j])
					}
				}
				t.Logf("%s %s: %d admitted, %d limited, %d past the gate's message timeout (a $1 budget, %s reserved each)",
					backend, tenant, ok, limited, timedOut, price.FormatCost(worst))
				if ok > admitted || ok+timedOut < admitted {
					t.Errorf("%s: admitted %d streams (%d timed out), want exactly %d (= $1 / $%s)", tenant, ok, timedOut, admitted, price.FormatCost(worst))
				}
				served[tenant] = ok
			}
			if int(s.served()) != served["moneya"]+served["moneyb"] {
				t.Errorf("pools served %d, admitted %v", s.served(), served)
			}

			// Settled: the pools' usage × the answering pool's price.
			afterA, afterB := s.PoolA.Usage(), s.PoolB.Usage()
			settled := map[string]int64{}
			for tenant, u := range map[string][2]int64{
				"moneya": {afterA.PromptTokens - beforeA.PromptTokens, afterA.CompletionTokens - beforeA.CompletionTokens},
				"moneyb": {afterB.PromptTokens - beforeB.PromptTokens, afterB.CompletionTokens - beforeB.CompletionTokens},
			} {
				m, n := moneyModels[tenantModel[tenant]], int64(served[tenant])
				settled[tenant] = (u[0]-cached*n)*m.in + cached*n*m.cached + u[1]*m.out
			}
			for _, tenant := range []string{"moneya", "moneyb"} {
				m := moneyModels[tenantModel[tenant]]
				worst := estimated*m.worstIn + maxTokens*m.worstOut
				unseen := int64(int(budget/worst)-served[tenant]) * worst // reservations of requests Envoy timed out
				want := settled[tenant] + unseen
				if rdb != nil {
					testutil.Eventually(t, 30*time.Second, func() bool {
						keys, err := rdb.Keys(context.Background(), "*tenant="+tenant+"}:money:*").Result()
						if err != nil || len(keys) != 1 {
							return false
						}
						v, _ := rdb.Get(context.Background(), keys[0]).Int64()
						return v == want
					}, fmt.Sprintf("%s's money counter in Redis to hold its usage × price, %d pico-dollars", tenant, want))
				}
			}
			// Every reservation that reached a pool settled (on whichever
			// replica metered it); then one more request per tenant: its
			// headers say what the budget has left, its own reservation
			// taken when admitted.
			testutil.Eventually(t, 30*time.Second, func() bool {
				var settledN float64
				for _, g := range s.Replicas {
					settledN += metricSum(t, g.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`)
				}
				return settledN == float64(served["moneya"]+served["moneyb"])
			}, "every served reservation to settle")
			for _, tenant := range []string{"moneya", "moneyb"} {
				m := moneyModels[tenantModel[tenant]]
				worst := estimated*m.worstIn + maxTokens*m.worstOut
				left := budget - settled[tenant] - int64(int(budget/worst)-served[tenant])*worst
				hdr := map[string]string{"authorization": "Bearer sk-" + tenant, "x-mock-ttft-ms": "0", "x-mock-itl-ms": "0"}
				r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody(tenantModel[tenant], maxTokens, false, ""), hdr)
				want := left
				if r.Status == 200 {
					want -= worst
				}
				if (r.Status == 200) != (left >= worst) || r.Header.Get("x-ratelimit-remaining-money") != price.FormatCost(want) {
					t.Errorf("%s's next request: %d, x-ratelimit-remaining-money %q; want $%s left (%s before its reservation of %s)",
						tenant, r.Status, r.Header.Get("x-ratelimit-remaining-money"), price.FormatCost(want), price.FormatCost(left), price.FormatCost(worst))
				}
			}
		})
	}
}

// A key's monthly budget lives in Redis, where a calendar month's counter
// is kept past the month's end: it survives a restart of infergate (a
// new process reads the month's spend so far) and, with persistence on
// (appendonly, as docs/reliability.md asks), a crash of Redis. Each
// request's x-ratelimit-remaining-money is the budget less what the month
// has settled, less its own reservation.
func TestMoneyMonthSurvivesRestarts(t *testing.T) {
	const (
		budget  = int64(1e12) // the key's budgetMonth: one dollar
		worst   = 17*100e6 + 32*400e6
		cached  = 3
		counter = "*principal=moneyc-key}:money:month:*"
	)
	srv := redisserver.StartDurable(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	inOneWindow(t)
	config := policyConfig(moneyKeys(t), moneyPolicies(t), "ratelimit: {backend: redis, redis: {address: "+srv.Addr()+"}}\n"+moneyPrices)
	hdr := map[string]string{"authorization": "Bearer sk-moneyc", "x-mock-ttft-ms": "0", "x-mock-itl-ms": "0",
		"x-mock-cached-tokens": strconv.Itoa(cached)}
	var spent int64 // settled so far this month, in pico-dollars
	spend := func(s *stack, when string) {
		t.Helper()
		before := s.PoolA.Usage()
		var r streamResult
		testutil.Eventually(t, 30*time.Second, func() bool { // Redis may still be coming back
			r = stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 32, false, ""), hdr)
			return r.Status != 503
		}, when+": a request past the rate limiter")
		if r.Status != 200 {
			t.Fatalf("%s: status %d: %s", when, r.Status, r.Body)
		}
		if got, want := r.Header.Get("x-ratelimit-remaining-money"), price.FormatCost(budget-spent-worst); got != want {
			t.Errorf("%s: x-ratelimit-remaining-money %q, want %s ($1 less $%s settled this month, less $%s reserved)",
				when, got, want, price.FormatCost(spent), price.FormatCost(worst))
		}
		after := s.PoolA.Usage()
		spent += (after.PromptTokens-before.PromptTokens-cached)*100e6 + cached*10e6 + (after.CompletionTokens-before.CompletionTokens)*400e6
		var last string
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s: last read of the month's counter: %s", when, last)
			}
		})
		testutil.Eventually(t, 30*time.Second, func() bool {
			keys, err := rdb.Keys(ctx, counter).Result()
			if err != nil || len(keys) != 1 {
				last = fmt.Sprint(keys, err)
				return false
			}
			v, err := rdb.Get(ctx, keys[0]).Int64()
			last = fmt.Sprint(keys, v, err)
			return v == spent
		}, fmt.Sprintf("%s: the month's counter to hold %d pico-dollars", when, spent))
	}

	s := startStackWith(t, config, 1)
	spend(s, "first process")
	keys, err := rdb.Keys(ctx, counter).Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("month counters %v, %v", keys, err)
	}
	if ttl, err := rdb.PTTL(ctx, keys[0]).Result(); err != nil || ttl < 28*24*time.Hour {
		t.Errorf("the month's counter expires in %v (%v): want at least the month's length", ttl, err)
	}
	spend(s, "first process, again")

	s.Gateway.Stop(t)
	s = startStackWith(t, config, 1)
	spend(s, "after an infergate restart")

	srv.Restart() // SIGKILL, then the append-only file
	spend(s, "after a Redis restart")
}
