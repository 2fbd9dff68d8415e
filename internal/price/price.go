// Package price is what a request costs: prices per million tokens as
// exact decimal amounts, and the integer arithmetic that turns a request's
// tokens into money without rounding.
//
// A price is in micro-units of its currency per million tokens (the
// decimal "0.15", $0.15 per million tokens, is 150000). A token at that
// price costs 150000 pico-units (10⁻¹² of the currency): tokens × price is
// the cost in pico-units, exactly.
package price

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Max is the highest price accepted: 1000 units of the currency per
// million tokens, in micro-units.
const Max = 1_000 * 1_000_000

// Price is one model's (or one model on one pool's) price, in micro-units
// of the currency per million tokens.
type Price struct {
	Input       int64 // input not read from or written to a prompt cache
	CachedInput int64 // input read from the prompt cache
	CacheWrite  int64 // input written to the prompt cache (Anthropic's cache_creation_input_tokens)
	Output      int64
	// InputOnly: no output price was given (an embeddings model); Output
	// is 0 and cannot bound what generated output costs.
	InputOnly bool
}

// Tokens are the counts a cost is computed from. Cached and CacheWrite are
// parts of Prompt (the APIs' usage counts them in its input).
type Tokens struct {
	Prompt, Cached, CacheWrite, Completion int
}

// Cost is what t costs at p, in pico-units of the currency. Negative
// counts count as 0, the cached parts at most the prompt; the sum of
// products saturates at math.MaxInt64 rather than overflowing (a cost no
// money budget admits), whatever it is given: a count is never clamped
// below what was used, so a cost is never understated.
func (p Price) Cost(t Tokens) int64 {
	prompt := max(int64(t.Prompt), 0)
	cached := min(max(int64(t.Cached), 0), prompt)
	written := min(max(int64(t.CacheWrite), 0), prompt-cached)
	in := satAdd(satAdd(satMul(prompt-cached-written, p.Input), satMul(cached, p.CachedInput)), satMul(written, p.CacheWrite))
	return satAdd(in, satMul(max(int64(t.Completion), 0), p.Output))
}

// Worst is the most input and output tokens can cost at p, whatever part
// of the input a pool reads from or writes to its cache: input at the
// dearest of its three prices. The products saturate at math.MaxInt64
// (a cost no money budget admits) instead of overflowing.
func (p Price) Worst(input, output int64) int64 {
	in := max(p.Input, p.CachedInput, p.CacheWrite)
	return satAdd(satMul(max(input, 0), in), satMul(max(output, 0), p.Output))
}

// satMul is a × b, saturating at math.MaxInt64; a, b >= 0 (a negative
// price counts as 0).
func satMul(a, b int64) int64 {
	b = max(b, 0)
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// satAdd is a + b, saturating at math.MaxInt64; a, b >= 0.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Source says which price a request was charged at.
type Source string

const (
	SourceModel Source = "model" // the model's price
	SourcePool  Source = "pool"  // the model's price on the pool that served it
)

// Table is the prices of the models, by model name, each possibly
// overridden per pool. The zero Table prices nothing. It is not changed
// once built: share it freely.
type Table struct {
	// Currency is the ISO 4217 code every price is in.
	Currency string
	models   map[string]modelPrice
}

type modelPrice struct {
	Price
	pools map[string]Price
}

// Add sets model's price, and its prices on pools (by pool name).
func (t *Table) Add(model string, p Price, pools map[string]Price) {
	if t.models == nil {
		t.models = map[string]modelPrice{}
	}
	t.models[model] = modelPrice{p, pools}
}

// Lookup is model's price on pool, and where it came from; ok is false
// when model has none.
func (t *Table) Lookup(model, pool string) (p Price, src Source, ok bool) {
	if t == nil {
		return Price{}, "", false
	}
	m, ok := t.models[model]
	if !ok {
		return Price{}, "", false
	}
	if pp, ok := m.pools[pool]; ok {
		return pp, SourcePool, true
	}
	return m.Price, SourceModel, true
}

// Worst is the dearest of model's prices, field by field, over the model's
// own and its pools': what the gate reserves at before a pool is chosen,
// so that no pool's price can exceed a reservation. ok is false when
// model has none.
func (t *Table) Worst(model string) (p Price, ok bool) {
	if t == nil {
		return Price{}, false
	}
	m, ok := t.models[model]
	if !ok {
		return Price{}, false
	}
	p = m.Price
	for _, pp := range m.pools {
		p = Price{Input: max(p.Input, pp.Input), CachedInput: max(p.CachedInput, pp.CachedInput),
			CacheWrite: max(p.CacheWrite, pp.CacheWrite), Output: max(p.Output, pp.Output),
			InputOnly: p.InputOnly || pp.InputOnly} // a pool without an output price leaves output unbounded
	}
	return p, true
}

// Len is the number of models priced.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.models)
}

// ErrDecimal is a price that is not a plain decimal in range.
var ErrDecimal = errors.New("not a decimal amount")

// Parse reads a price written as a plain decimal ("0.15", "3", "0.075"):
// digits, at most one point, at most 6 decimal places, at most Max. It
// returns micro-units. No sign, exponent or separator: money is read
// exactly or refused.
func Parse(s string) (int64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || !digits(whole) || !digits(frac) || len(frac) > 6 || len(whole) > 4 {
		return 0, fmt.Errorf("%q: %w (digits, a point, at most 6 decimal places)", s, ErrDecimal)
	}
	var n int64
	for _, c := range whole + frac + strings.Repeat("0", 6-len(frac)) {
		n = n*10 + int64(c-'0')
	}
	if n > Max {
		return 0, fmt.Errorf("%q: %w: above %s per million tokens", s, ErrDecimal, Format(Max, 6))
	}
	return n, nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Format writes n units of 10^-places as a decimal, trailing zeros
// dropped: Format(150000, 12) is "0.00000015".
func Format(n int64, places int) string {
	neg := n < 0
	if neg {
		n = -n // never MinInt64: costs are bounded far below
	}
	s := strconv.FormatInt(n, 10)
	if len(s) <= places {
		s = strings.Repeat("0", places-len(s)+1) + s
	}
	whole, frac := s[:len(s)-places], strings.TrimRight(s[len(s)-places:], "0")
	if frac != "" {
		whole += "." + frac
	}
	if neg {
		whole = "-" + whole
	}
	return whole
}

// MaxAmount is the largest amount of money ParseAmount reads: an amount
// is counted in pico-units in an int64 (ratelimit's Money unit), which
// holds 9.2 million units of the currency.
const MaxAmount = 9_000_000

// ParseAmount reads an amount of money written as a plain decimal ("500",
// "12.50"): digits, at most one point, at most 6 decimal places, at most
// MaxAmount. It returns pico-units.
func ParseAmount(s string) (int64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || !digits(whole) || !digits(frac) || len(frac) > 6 || len(strings.TrimLeft(whole, "0")) > 7 {
		return 0, fmt.Errorf("%q: %w (digits, a point, at most 6 decimal places)", s, ErrDecimal)
	}
	var n int64
	for _, c := range whole + frac + strings.Repeat("0", 6-len(frac)) {
		n = n*10 + int64(c-'0')
	}
	if n > MaxAmount*1_000_000 {
		return 0, fmt.Errorf("%q: %w: above %d", s, ErrDecimal, MaxAmount)
	}
	return n * 1_000_000, nil
}

// FormatCost writes a cost in pico-units as a decimal of the currency.
func FormatCost(pico int64) string { return Format(pico, 12) }
