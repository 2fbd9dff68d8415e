package admission

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// fixedPolicy answers every request with d; safe for concurrent use.
type fixedPolicy struct{ d policy.Decision }

func (f fixedPolicy) Decide(context.Context, *policy.Input) (policy.Decision, error) { return f.d, nil }

// limiterStores are the backends the arithmetic must hold on: each
// function returns a limiter on an empty store (Redis: one real server, a
// prefix per store, behind the fallback as internal/cli wires it).
func limiterStores(t *testing.T, clock ratelimit.Clock) map[string]func() ratelimit.Limiter {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var n atomic.Int64
	return map[string]func() ratelimit.Limiter{
		"memory": func() ratelimit.Limiter { return ratelimit.NewMemory(clock) },
		"redis": func() ratelimit.Limiter {
			prefix := fmt.Sprintf("store%d:", n.Add(1))
			return ratelimit.WithFallback(ratelimit.NewRedis(rdb, clock, ratelimit.RedisOptions{Prefix: prefix}), ratelimit.FailClosed, nil, nil)
		},
	}
}

// left is what remains of limit, charging nothing.
func left(t *testing.T, l ratelimit.Limiter, limit ratelimit.Limit) int64 {
	t.Helper()
	res, err := l.Reserve(context.Background(), []ratelimit.Limit{limit}, ratelimit.Cost{})
	if err != nil {
		t.Fatal(err)
	}
	return res.States[0].Remaining
}

// The scenario, on every backend: a $5/day money budget and no
// token limit beside it. A /v1/completions request whose worst case
// saturates (a thousand prompts × n=128 × max_tokens 2³¹-1, at $60/M
// output) is refused at once with a 400 naming the budget, reserving
// nothing (it used to be admitted and wrap the counter negative); then,
// of 40 concurrent 16k-token requests, only those whose worst cases fit
// in $5 are admitted; and a settlement refunding part of a reservation
// leaves the day's spend counted.
func TestOverflowingRequestUnderMoneyBudget(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for name, store := range limiterStores(t, func() time.Time { return now }) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			prices := &price.Table{Currency: "USD"}
			prices.Add("gpt", price.Price{Input: 30_000_000, CachedInput: 15_000_000, CacheWrite: 30_000_000, Output: 60_000_000}, nil)
			day := ratelimit.Limit{Name: "tenant-money-per-day", Key: "t=acme", Unit: ratelimit.Money, Amount: 5_000_000_000_000, Window: 24 * time.Hour}
			c := newController(t)
			c.Limiter, c.Prices = store(), prices
			c.Policy = fixedPolicy{policy.Decision{Allow: true, Limits: []ratelimit.Limit{day}}}
			hdr := map[string]string{"x-api-key": secretKey}

			body := `{"model":"gpt","n":128,"max_tokens":2147483647,"prompt":["x"` + strings.Repeat(`,"x"`, 999) + `]}`
			r, err := openai.Parse(openai.APICompletions, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			huge := &request.Admission{RequestID: "huge", Method: "POST", Path: "/v1/completions", Headers: hdr, Completion: true,
				API: openai.APICompletions, Request: r, PromptTokens: r.PromptTokens, Body: []byte(body)}
			v := c.Decide(ctx, huge)
			if v.Deny == nil || v.Deny.Status != 400 || v.Deny.Type != openai.TypeInvalidRequest || v.Deny.Code != "request_exceeds_budget" ||
				v.Reason != "request_exceeds_budget:tenant-money-per-day" || v.Reservation != "" || v.Headers["retry-after"] != "" {
				t.Fatalf("overflowing request: %+v, %q; want a 400 request_exceeds_budget", v.Deny, v.Reason)
			}
			for _, want := range []string{"at least 9223372.036854775807 USD", "tenant-money-per-day", "(5 USD per day)"} {
				if !strings.Contains(v.Deny.Message, want) {
					t.Errorf("message %q does not say %q", v.Deny.Message, want)
				}
			}
			if got := left(t, c.Limiter, day); got != day.Amount {
				t.Fatalf("the refused request reserved: %d left of %d", got, day.Amount)
			}

			// 1,000 prompt tokens at $30/M + 15,000 output at $60/M: $0.93.
			const worst = 1_000*30_000_000 + 15_000*60_000_000
			verdicts := make([]request.Verdict, 40)
			var wg sync.WaitGroup
			for i := range verdicts {
				wg.Go(func() {
					a := &request.Admission{RequestID: fmt.Sprint("r", i), Method: "POST", Path: "/v1/chat/completions", Headers: hdr,
						Completion: true, API: openai.APIChat, Request: openai.Request{Model: "gpt", MaxTokens: 15_000}, PromptTokens: 1_000}
					verdicts[i] = c.Decide(ctx, a)
				})
			}
			wg.Wait()
			var admitted []request.Verdict
			for _, v := range verdicts {
				switch {
				case v.Deny == nil:
					admitted = append(admitted, v)
				case v.Deny.Status != 429:
					t.Fatalf("denied with %+v, want 429", v.Deny)
				}
			}
			if int64(len(admitted)) != day.Amount/worst {
				t.Fatalf("%d admitted ($%s), want %d: every worst case that fits in $5 and no more", len(admitted),
					price.FormatCost(int64(len(admitted))*worst), day.Amount/worst)
			}
			if got, want := left(t, c.Limiter, day), day.Amount-int64(len(admitted))*worst; got != want {
				t.Fatalf("left %d, want %d", got, want)
			}

			// The first settlement refunds most of its reservation: the
			// others' reservations and its own usage stay counted.
			c.Settle(ctx, &request.Settlement{Reservation: admitted[0].Reservation, Model: "gpt", UsageRead: true, End: request.EndComplete,
				Origin: request.OriginPool, Status: 200, PromptTokens: 1_000, CompletionTokens: 500})
			used := int64(1_000*30_000_000+500*60_000_000) + int64(len(admitted)-1)*worst
			if got := left(t, c.Limiter, day); got != day.Amount-used {
				t.Fatalf("after a refunding settlement: left %d, want %d", got, day.Amount-used)
			}
			// The others end without proof: their reservations stay whole.
			for _, v := range admitted[1:] {
				c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, Model: "gpt", End: request.EndLost})
			}
			if got := left(t, c.Limiter, day); got != day.Amount-used {
				t.Fatalf("after unproven settlements: left %d, want %d", got, day.Amount-used)
			}
		})
	}
}

// The worst case a request reserves, from its prices, n, caps and batch
// size (completions' prompts, embeddings' inputs), is exact or refused,
// on every backend: a seeded property test against big-integer
// arithmetic, with prices, counts and budgets at and around their
// extremes. A worst case above a budget, or past int64, is a 400
// request_exceeds_budget naming the first such limit, reserving nothing;
// any other is admitted on a fresh budget, charging exactly its worst
// case (never a wrapped or clamped figure).
func TestWorstCaseIsExactOrRefused(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for name, store := range limiterStores(t, func() time.Time { return now }) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			r := rand.New(rand.NewPCG(32, 6))
			pick := func(vals ...int64) int64 { return vals[r.IntN(len(vals))] }
			drawPrice := func() int64 { return pick(0, 1, 60_000_000, price.Max, r.Int64N(price.Max+1)) }
			drawAmount := func() int64 {
				return pick(0, 1, 1<<53-1, 1<<53, 1<<53+1, math.MaxInt64-1, math.MaxInt64, price.MaxAmount*1_000_000_000_000, r.Int64())
			}
			c := newController(t)
			c.Limiter = store()
			hdr := map[string]string{"x-api-key": secretKey}
			var admittedN, refusedN int
			for i := range 300 {
				p := price.Price{Input: drawPrice(), CachedInput: drawPrice(), CacheWrite: drawPrice(), Output: drawPrice()}
				c.Prices = &price.Table{Currency: "USD"}
				c.Prices.Add("m", p, nil)
				api := []openai.API{openai.APIChat, openai.APICompletions, openai.APIEmbeddings}[r.IntN(3)]
				n := pick(1, 2, 128, 1+r.Int64N(128))
				batch := pick(1, 2, 1<<20, 1+r.Int64N(1<<24)) // prompts or inputs
				maxTokens := pick(1, 16_384, math.MaxInt32, 1+r.Int64N(math.MaxInt32))
				prompt := pick(0, 1, 1<<31-1, r.Int64N(1<<40))
				a := &request.Admission{RequestID: fmt.Sprint("r", i), Method: "POST", Path: "/v1/" + string(api), Headers: hdr,
					Completion: true, API: api, Request: openai.Request{Model: "m", MaxTokens: int(maxTokens), Choices: int(n * batch)},
					PromptTokens: int(prompt)}
				out := new(big.Int).Mul(big.NewInt(n*batch), big.NewInt(maxTokens))
				if api == openai.APIEmbeddings {
					a.Request.Choices, out = 1, new(big.Int)
				}
				in := big.NewInt(prompt)
				money := new(big.Int).Add(new(big.Int).Mul(in, big.NewInt(max(p.Input, p.CachedInput, p.CacheWrite))), new(big.Int).Mul(out, big.NewInt(p.Output)))
				key := fmt.Sprint("t=acme/i=", i)
				limits := []ratelimit.Limit{
					{Name: "money", Key: key, Unit: ratelimit.Money, Amount: drawAmount(), Window: 24 * time.Hour},
					{Name: "tokens", Key: key, Unit: ratelimit.TotalTokens, Amount: drawAmount(), Window: time.Minute},
					{Name: "output", Key: key, Unit: ratelimit.OutputTokens, Amount: drawAmount(), Window: time.Minute},
				}
				r.Shuffle(len(limits), func(i, j int) { limits[i], limits[j] = limits[j], limits[i] })
				costs := map[string]*big.Int{"money": money, "tokens": new(big.Int).Add(in, out), "output": out}
				tooLarge := ""
				for _, l := range limits {
					if c := costs[l.Name]; tooLarge == "" && (c.Cmp(big.NewInt(l.Amount)) > 0 || c.Cmp(big.NewInt(math.MaxInt64)) >= 0) {
						tooLarge = l.Name
					}
				}
				c.Policy = fixedPolicy{policy.Decision{Allow: true, Limits: limits}}
				v := c.Decide(ctx, a)
				what := fmt.Sprintf("request %d (%s, n×batch %d, cap %d, prompt %d, %+v, limits %+v)", i, api, n*batch, maxTokens, prompt, p, limits)
				if tooLarge != "" {
					if v.Deny == nil || v.Deny.Status != 400 || v.Reason != "request_exceeds_budget:"+tooLarge {
						t.Fatalf("%s: %+v, %q; want refused as exceeding %s", what, v.Deny, v.Reason, tooLarge)
					}
					for _, l := range limits {
						if got := left(t, c.Limiter, l); got != l.Amount {
							t.Fatalf("%s: refused, yet %s has %d left of %d", what, l.Name, got, l.Amount)
						}
					}
					refusedN++
					continue
				}
				if v.Deny != nil {
					t.Fatalf("%s: denied %+v, want admitted", what, v.Deny)
				}
				for _, l := range limits {
					if got, want := left(t, c.Limiter, l), new(big.Int).Sub(big.NewInt(l.Amount), costs[l.Name]); got != want.Int64() {
						t.Fatalf("%s: %s has %d left, want %s", what, l.Name, got, want)
					}
				}
				admittedN++
			}
			// Both sides of the edge are exercised.
			if admittedN < 30 || refusedN < 30 {
				t.Fatalf("%d admitted, %d refused of 300: the draw misses a side", admittedN, refusedN)
			}
			t.Logf("%d admitted, %d refused", admittedN, refusedN)
		})
	}
}
