package price

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0.15", want: 150_000},
		{in: "0.075", want: 75_000},
		{in: "3", want: 3_000_000},
		{in: "2.5", want: 2_500_000},
		{in: "0.000001", want: 1},
		{in: ".5", want: 500_000},
		{in: "0", want: 0},
		{in: "1000", want: Max},
		{in: "1000.000001", bad: true},
		{in: "0.0000001", bad: true}, // 7 places: not exact in micro-units
		{in: "-1", bad: true},
		{in: "1e-3", bad: true},
		{in: "", bad: true},
		{in: ".", bad: true},
		{in: "1.2.3", bad: true},
		{in: "+1", bad: true},
		{in: "1,5", bad: true},
		{in: "99999999999999999999", bad: true},
	} {
		got, err := Parse(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrDecimal) {
				t.Errorf("Parse(%q) = %d, %v; want ErrDecimal", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestCost(t *testing.T) {
	mini := Price{Input: 150_000, CachedInput: 75_000, CacheWrite: 150_000, Output: 600_000} // $0.15/$0.075/$0.60 per M
	for _, tc := range []struct {
		name string
		p    Price
		t    Tokens
		want string // in the currency, exactly
	}{
		{"one input token at $0.15/M", mini, Tokens{Prompt: 1}, "0.00000015"},
		{"one output token at $0.60/M", mini, Tokens{Completion: 1}, "0.0000006"},
		{"a million of each", mini, Tokens{Prompt: 1_000_000, Completion: 1_000_000}, "0.75"},
		{"cached input at the cached price", mini, Tokens{Prompt: 1000, Cached: 400, Completion: 10}, "0.000126"}, // 600×0.15+400×0.075+10×0.6 µ
		{"cache writes at their own price", Price{Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 15_000_000},
			Tokens{Prompt: 100, Cached: 50, CacheWrite: 30, Completion: 7}, "0.0002925"}, // 20×3 + 50×0.3 + 30×3.75 + 7×15 µ
		{"sixth decimal place", Price{Input: 1}, Tokens{Prompt: 3}, "0.000000000003"},
		{"cached beyond the prompt is clamped", mini, Tokens{Prompt: 10, Cached: 50}, "0.00000075"},
		{"negative counts are zero", mini, Tokens{Prompt: -5, Completion: -1}, "0"},
		{"nothing", mini, Tokens{}, "0"},
	} {
		if got := FormatCost(tc.p.Cost(tc.t)); got != tc.want {
			t.Errorf("%s: cost %s, want %s", tc.name, got, tc.want)
		}
	}
	// No overflow at the bounds, whatever the counts: saturated.
	top := Price{Input: Max, CachedInput: Max, CacheWrite: Max, Output: Max}
	if c := top.Cost(Tokens{Prompt: math.MaxInt, Cached: math.MaxInt, CacheWrite: math.MaxInt, Completion: math.MaxInt}); c != math.MaxInt64 {
		t.Errorf("cost at the bounds %d, want %d", c, int64(math.MaxInt64))
	}
}

// Cost and Worst are exact, or saturated at math.MaxInt64, never wrapped
// nor clamped below the true figure: a seeded property test against
// big-integer arithmetic, with counts and prices at and around 0, 1,
// 2⁵³±1, math.MaxInt64-1 and math.MaxInt64.
func TestCostSaturatesExactly(t *testing.T) {
	extremes := []int64{0, 1, 2, 1<<53 - 1, 1 << 53, 1<<53 + 1, 1 << 30, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64}
	r := rand.New(rand.NewPCG(32, 2))
	draw := func(hi int64) int64 {
		switch r.IntN(3) {
		case 0:
			return r.Int64N(min(hi, 1<<20) + 1)
		case 1:
			return min(extremes[r.IntN(len(extremes))], hi)
		}
		return r.Int64N(hi) + 1
	}
	exact := func(terms ...[2]int64) int64 {
		sum := new(big.Int)
		for _, tm := range terms {
			sum.Add(sum, new(big.Int).Mul(big.NewInt(tm[0]), big.NewInt(tm[1])))
		}
		if !sum.IsInt64() {
			return math.MaxInt64
		}
		return sum.Int64()
	}
	for range 20_000 {
		p := Price{Input: draw(Max), CachedInput: draw(Max), CacheWrite: draw(Max), Output: draw(Max)}
		prompt, completion := draw(math.MaxInt64), draw(math.MaxInt64)
		cached := min(draw(math.MaxInt64), prompt)
		written := min(draw(math.MaxInt64), prompt-cached)
		got := p.Cost(Tokens{Prompt: int(prompt), Cached: int(cached), CacheWrite: int(written), Completion: int(completion)})
		want := exact([2]int64{prompt - cached - written, p.Input}, [2]int64{cached, p.CachedInput}, [2]int64{written, p.CacheWrite}, [2]int64{completion, p.Output})
		if got != want {
			t.Fatalf("%+v.Cost(%d, %d cached, %d written, %d out) = %d, want %d", p, prompt, cached, written, completion, got, want)
		}
		worst := max(p.Input, p.CachedInput, p.CacheWrite)
		if got, want := p.Worst(prompt, completion), exact([2]int64{prompt, worst}, [2]int64{completion, p.Output}); got != want {
			t.Fatalf("%+v.Worst(%d, %d) = %d, want %d", p, prompt, completion, got, want)
		}
		// The worst case is never below the cost, whatever was cached.
		if p.Worst(prompt, completion) < got {
			t.Fatalf("%+v: Worst below Cost", p)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		n      int64
		places int
		want   string
	}{{150_000, 12, "0.00000015"}, {1_000_000_000_000, 12, "1"}, {1_500_000, 6, "1.5"}, {0, 12, "0"}, {-25, 2, "-0.25"}, {Max, 6, "1000"}} {
		if got := Format(tc.n, tc.places); got != tc.want {
			t.Errorf("Format(%d, %d) = %q, want %q", tc.n, tc.places, got, tc.want)
		}
	}
}

func TestLookup(t *testing.T) {
	var tab Table
	tab.Add("m", Price{Input: 1}, map[string]Price{"premium": {Input: 2}})
	for _, tc := range []struct {
		model, pool string
		want        int64
		src         Source
		ok          bool
	}{{"m", "standard", 1, SourceModel, true}, {"m", "premium", 2, SourcePool, true}, {"other", "premium", 0, "", false}} {
		p, src, ok := tab.Lookup(tc.model, tc.pool)
		if p.Input != tc.want || src != tc.src || ok != tc.ok {
			t.Errorf("Lookup(%q, %q) = %v, %q, %v", tc.model, tc.pool, p, src, ok)
		}
	}
	if _, _, ok := (*Table)(nil).Lookup("m", ""); ok {
		t.Error("a nil table priced a model")
	}
}

func TestWorst(t *testing.T) {
	var tb Table
	tb.Add("m", Price{Input: 3, CachedInput: 1, CacheWrite: 4, Output: 10}, map[string]Price{
		"a": {Input: 5, CachedInput: 1, CacheWrite: 2, Output: 9},
		"b": {Input: 1, CachedInput: 2, CacheWrite: 1, Output: 12},
	})
	p, ok := tb.Worst("m")
	if want := (Price{Input: 5, CachedInput: 2, CacheWrite: 4, Output: 12}); !ok || p != want {
		t.Errorf("Worst = %+v, %v; want %+v", p, ok, want)
	}
	if _, ok := tb.Worst("other"); ok {
		t.Error("an unpriced model has a worst price")
	}
	if got := p.Worst(10, 3); got != 10*5+3*12 {
		t.Errorf("Worst(10, 3) = %d, want %d", got, 10*5+3*12)
	}
	if got := (Price{Input: Max, Output: Max}).Worst(1<<48, 1<<48); got != math.MaxInt64 {
		t.Errorf("an overflowing worst case = %d, want it saturated at MaxInt64", got)
	}
}

func TestParseAmount(t *testing.T) {
	for in, want := range map[string]int64{"500": 500e12, "12.50": 12_500_000_000_000, "0.000001": 1_000_000, ".5": 5e11, "9000000": 9e18} {
		if got, err := ParseAmount(in); err != nil || got != want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".", "-1", "1e3", "0.0000001", "9000000.000001", "10000000", "1,5"} {
		if got, err := ParseAmount(in); err == nil {
			t.Errorf("ParseAmount(%q) = %d, want an error", in, got)
		}
	}
}
