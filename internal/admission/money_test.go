package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// moneyPrices prices llama at $3 input, $0.30 cached, $3.75 cache write,
// $15 output per million tokens, and its output at $20 on pool hosted.
func moneyPrices() *price.Table {
	t := &price.Table{Currency: "USD"}
	t.Add("llama", price.Price{Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 15_000_000},
		map[string]price.Price{"hosted": {Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 20_000_000}})
	return t
}

// Budgets in money: the gate reserves the worst case (the dearest input
// price for every prompt token, the dearest pool's output price), the
// meter's proof settles usage × the answering pool's price, cached input
// at the cached price; no proof keeps the reservation.
func TestMoneyReserveAndSettle(t *testing.T) {
	c := newController(t)
	now := time.Unix(1_700_000_000, 0)
	mem := ratelimit.NewMemory(func() time.Time { return now })
	c.Limiter, c.Prices = mem, moneyPrices()
	day := ratelimit.Limit{Name: "tenant-money-per-day", Key: "t=acme", Unit: ratelimit.Money, Amount: 5_000_000_000, Window: 24 * time.Hour}
	fp := &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{day}}}
	c.Policy = fp
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}

	// 20 prompt tokens at $3.75/M + 100 output tokens at $20/M.
	const worst = 20*3_750_000 + 100*20_000_000
	v1 := c.Decide(ctx, chat(hdr))
	if v1.Deny != nil {
		t.Fatalf("first request: %+v", v1.Deny)
	}
	wantIn := policy.Cost{Currency: "USD", Priced: true,
		Price:       policy.Price{Input: 3_000_000, CachedInput: 300_000, CacheWriteInput: 3_750_000, Output: 20_000_000},
		Reservation: policy.Reservation{InputTokens: 20, OutputTokens: 100, Cost: worst}}
	if fp.last.Cost != wantIn {
		t.Errorf("input.cost = %+v, want %+v", fp.last.Cost, wantIn)
	}
	if got := v1.Metadata["x-ratelimit-remaining-money"]; got != price.FormatCost(5_000_000_000-worst) {
		t.Errorf("x-ratelimit-remaining-money = %v, want %s", got, price.FormatCost(5_000_000_000-worst))
	}
	if got := v1.Metadata["x-ratelimit-limit-money"]; got != "0.005" {
		t.Errorf("x-ratelimit-limit-money = %v, want 0.005", got)
	}
	v2 := c.Decide(ctx, chat(hdr))
	lost := c.Decide(ctx, chat(hdr))
	if v2.Deny != nil || lost.Deny == nil || lost.Deny.Status != 429 {
		t.Fatalf("second %+v, third %+v: want the third denied (3 × %d > 5e9)", v2.Deny, lost.Deny, worst)
	}

	// Proof: 20 prompt tokens of which 8 cached, 10 output, on the model's
	// price and on hosted's.
	usage := func(reservation, pool string) *request.Settlement {
		return &request.Settlement{Reservation: reservation, Model: "llama", Pool: pool, UsageRead: true, End: request.EndComplete,
			Origin: request.OriginPool, Status: 200, PromptTokens: 20, CachedTokens: 8, CompletionTokens: 10}
	}
	c.Settle(ctx, usage(v1.Reservation, "own"))
	c.Settle(ctx, usage(v2.Reservation, "hosted"))
	settled := int64(12*3_000_000+8*300_000+10*15_000_000) + 12*3_000_000 + 8*300_000 + 10*20_000_000
	v3 := c.Decide(ctx, chat(hdr))
	if v3.Deny != nil {
		t.Fatalf("after settling: %+v", v3.Deny)
	}
	if got, want := v3.Metadata["x-ratelimit-remaining-money"], price.FormatCost(5_000_000_000-settled-worst); got != want {
		t.Errorf("remaining after settling = %v, want %s", got, want)
	}
	// No proof (the meter's stream broke): the reservation stays whole.
	c.Settle(ctx, &request.Settlement{Reservation: v3.Reservation, Model: "llama", End: request.EndLost})
	res, err := mem.Reserve(ctx, []ratelimit.Limit{day}, ratelimit.Cost{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.States[0].Remaining, 5_000_000_000-settled-worst; got != want {
		t.Errorf("remaining after an unproven settlement = %d, want %d", got, want)
	}
}

// A money limit on a model without a price is refused, not admitted for
// free, and reserves nothing.
func TestMoneyLimitOnUnpricedModelDenies(t *testing.T) {
	c := newController(t)
	mem := ratelimit.NewMemory(nil)
	c.Limiter, c.Prices = mem, moneyPrices()
	rpm := ratelimit.Limit{Name: "rpm", Key: "t=acme", Unit: ratelimit.Requests, Amount: 10, Window: time.Minute}
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{rpm,
		{Name: "money", Key: "t=acme", Unit: ratelimit.Money, Amount: 1 << 50, Window: ratelimit.Month}}}}
	a := chat(map[string]string{"x-api-key": secretKey})
	a.Request.Model = "unpriced"
	v := c.Decide(context.Background(), a)
	if v.Deny == nil || v.Deny.Status != 403 || v.Reason != "model_not_priced" {
		t.Fatalf("verdict = %+v, %s; want a 403 model_not_priced", v.Deny, v.Reason)
	}
	if res, _ := mem.Reserve(context.Background(), []ratelimit.Limit{rpm}, ratelimit.Cost{}); res.States[0].Remaining != 10 {
		t.Errorf("a refused request reserved: remaining %d of 10", res.States[0].Remaining)
	}
}

// An embeddings model priced for input only: a money budget admits it on
// the embeddings API, reserving and settling its input at the input price,
// and refuses it (reserving nothing) on an API that generates output, whose
// cost no price bounds.
func TestMoneyLimitOnInputOnlyModel(t *testing.T) {
	c := newController(t)
	mem := ratelimit.NewMemory(nil)
	prices := &price.Table{Currency: "USD"}
	prices.Add("embed", price.Price{Input: 20_000, CachedInput: 20_000, CacheWrite: 20_000, InputOnly: true}, nil)
	c.Limiter, c.Prices = mem, prices
	money := ratelimit.Limit{Name: "money", Key: "t=acme", Unit: ratelimit.Money, Amount: 1_000_000_000, Window: ratelimit.Month}
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{money}}}
	ctx := context.Background()
	remaining := func() int64 {
		res, err := mem.Reserve(ctx, []ratelimit.Limit{money}, ratelimit.Cost{})
		if err != nil {
			t.Fatal(err)
		}
		return res.States[0].Remaining
	}

	emb := chat(map[string]string{"x-api-key": secretKey})
	emb.Path, emb.API, emb.Request.Model, emb.Request.Stream, emb.Request.MaxTokens = "/v1/embeddings", openai.APIEmbeddings, "embed", false, 0
	v := c.Decide(ctx, emb)
	if v.Deny != nil {
		t.Fatalf("embeddings denied: %+v", v.Deny)
	}
	if got, want := remaining(), int64(1_000_000_000-20*20_000); got != want {
		t.Errorf("remaining after reserving 20 input tokens = %d, want %d", got, want)
	}
	c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, Model: "embed", UsageRead: true, End: request.EndComplete,
		Origin: request.OriginPool, Status: 200, PromptTokens: 12})
	if got, want := remaining(), int64(1_000_000_000-12*20_000); got != want {
		t.Errorf("remaining after settling 12 input tokens = %d, want %d", got, want)
	}

	before := remaining()
	for _, api := range []openai.API{"", openai.APIChat, openai.APIResponses} {
		a := chat(map[string]string{"x-api-key": secretKey})
		a.API, a.Request.Model = api, "embed"
		v := c.Decide(ctx, a)
		if v.Deny == nil || v.Deny.Status != 403 || v.Reason != "model_output_not_priced" {
			t.Errorf("%q: verdict = %+v, %s; want a 403 model_output_not_priced", api, v.Deny, v.Reason)
		}
	}
	if got := remaining(); got != before {
		t.Errorf("refused requests reserved: remaining %d, was %d", got, before)
	}
}

// A key's budgetMonth reaches the policy as input.principal.budget_month,
// in pico-units.
func TestKeyBudgetMonthInPolicyInput(t *testing.T) {
	c := newController(t)
	sum := sha256.Sum256([]byte("sk-budgeted"))
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte("keys:\n- id: k\n  sha256: "+hex.EncodeToString(sum[:])+"\n  tenant: acme\n  budgetMonth: \"500.25\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	c.Keys.Store(keys)
	fp := &fakePolicy{d: policy.Decision{Allow: true}}
	c.Policy = fp
	if v := c.Decide(context.Background(), chat(map[string]string{"x-api-key": "sk-budgeted"})); v.Deny != nil {
		t.Fatal(v.Deny)
	}
	if got := fp.last.Principal.BudgetMonth; got != 500_250_000_000_000 {
		t.Errorf("budget_month = %d, want 500250000000000", got)
	}
}

// A spent budget says so as OpenAI does (a money budget's quota is gone:
// insufficient_quota; the others: rate_limit_exceeded), with its window
// and the wait in words a person reads.
func TestExceededInWords(t *testing.T) {
	now := time.Date(2026, 12, 4, 20, 3, 49, 0, time.UTC)
	c := &Controller{Now: func() time.Time { return now }}
	for _, tc := range []struct {
		l                 ratelimit.Limit
		retry             time.Duration
		typ, code, inText string
	}{
		{ratelimit.Limit{Name: "tenant-money-month", Unit: ratelimit.Money, Amount: 10_000_000_000, Window: ratelimit.Month},
			time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).Sub(now), "insufficient_quota", "insufficient_quota",
			"per month). It resets 2027-01-01 00:00 UTC (in 27d4h)."},
		{ratelimit.Limit{Name: "key-rpm", Unit: ratelimit.Requests, Amount: 20, Window: time.Minute},
			12345 * time.Millisecond, "rate_limit_error", "rate_limit_exceeded", "(20 requests per minute). Please try again in 12.3s."},
		{ratelimit.Limit{Name: "tenant-tokens", Unit: ratelimit.TotalTokens, Amount: 1000, Window: 6 * time.Hour},
			4*time.Hour + 10*time.Minute + 20*time.Second, "rate_limit_error", "rate_limit_exceeded", "per 6h). Please try again in 4h10m."},
		{ratelimit.Limit{Name: "t", Unit: ratelimit.Requests, Amount: 1, Window: 90 * time.Minute},
			250 * time.Second, "rate_limit_error", "rate_limit_exceeded", "per 1h30m). Please try again in 4m10s."},
	} {
		e := c.exceeded(&tc.l, tc.retry)
		if e.Status != 429 || e.Type != tc.typ || e.Code != tc.code || !strings.Contains(e.Message, tc.inText) {
			t.Errorf("%s: %d %s %s %q, want %s %s and %q", tc.l.Name, e.Status, e.Type, e.Code, e.Message, tc.typ, tc.code, tc.inText)
		}
	}
}
