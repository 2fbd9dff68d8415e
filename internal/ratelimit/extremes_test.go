package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// testTooLarge: a cost that no window of a limit could admit (above its
// Amount, or saturated at math.MaxInt64) fails with a *TooLargeError
// naming that limit before any counter is read or charged, even when an
// earlier limit is merely exhausted for now (a 429 that could never
// succeed on retry).
func testTooLarge(t *testing.T, b backend) {
	ctx := context.Background()
	clock := newFakeClock(t0)
	l := b.newStore(t, clock.Now)()
	rpmOne := rpm("rpm", "tenant=a", 1)
	tokens := tpm("tpm", "tenant=a", 100)
	sat := Limit{Name: "money", Key: "tenant=a", Unit: Money, Amount: math.MaxInt64, Window: Month}
	if res, err := l.Reserve(ctx, []Limit{rpmOne}, req(0, 0)); err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	for _, tc := range []struct {
		name   string
		limits []Limit
		cost   Cost
		want   string
		of     int64
	}{
		{"above the amount", []Limit{tokens}, req(60, 41), "tpm", 101},
		{"a zero amount", []Limit{tpm("none", "tenant=a", 0)}, req(0, 1), "none", 1},
		{"behind an exhausted limit", []Limit{rpmOne, tokens}, req(0, 101), "tpm", 101},
		{"saturated money", []Limit{sat}, Cost{Requests: 1, Money: math.MaxInt64}, "money", math.MaxInt64},
		{"total tokens past int64", []Limit{tpm("all", "tenant=a", math.MaxInt64)}, req(1<<62, 1<<62), "all", math.MaxInt64},
	} {
		_, err := l.Reserve(ctx, tc.limits, tc.cost)
		var tl *TooLargeError
		if !errors.As(err, &tl) || !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: Reserve = %v, want a *TooLargeError", tc.name, err)
		}
		if tl.Limit.Name != tc.want || tl.Cost != tc.of || tl.Saturated() != (tc.of == math.MaxInt64) {
			t.Errorf("%s: %+v, want limit %q, cost %d", tc.name, tl, tc.want, tc.of)
		}
	}
	// Nothing was charged, and the saturated money counter was not made.
	if got := remaining(t, l, []Limit{tokens, sat}); got[0] != 100 || got[1] != math.MaxInt64 {
		t.Errorf("remaining = %v, want [100 %d]", got, int64(math.MaxInt64))
	}
}

// extremes are the values testExtremes draws amounts and costs near.
var extremes = []int64{0, 1, 2, 1<<53 - 1, 1 << 53, 1<<53 + 1, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64}

// drawExtreme is a value for an amount or a cost part: small, an extreme,
// just under one, or anywhere in int64's range.
func drawExtreme(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return r.Int64N(1000)
	case 1:
		return extremes[r.IntN(len(extremes))]
	case 2:
		return max(0, extremes[r.IntN(len(extremes))]-r.Int64N(1000))
	}
	return r.Int64()
}

func drawCost(r *rand.Rand) Cost {
	return Cost{Requests: 1, InputTokens: drawExtreme(r), OutputTokens: drawExtreme(r), Money: drawExtreme(r)}
}

// modelCounter is a counter as testExtremes expects it, in exact
// arithmetic: charged is what its outstanding reservations reserved plus
// what its settlements charged; the backend's counter must equal it until
// it reaches math.MaxInt64, and stay there (saturated) after.
type modelCounter struct {
	charged   *big.Int
	saturated bool
}

func (c *modelCounter) add(d int64) {
	c.charged.Add(c.charged, big.NewInt(d))
	if c.charged.Sign() < 0 {
		panic("model: charged below zero") // a bug of the test
	}
	c.saturated = c.saturated || !c.charged.IsInt64() || c.charged.Int64() == math.MaxInt64
}

// settle adds a settlement's d to the counter of a limit of amount limit:
// the part of a charge above both the limit and where the counter stood
// is debt, carried into the windows that follow (not this one), so the
// counter keeps max(before, limit); a saturated counter stays so.
func (c *modelCounter) settle(d, limit int64) {
	before := c.used()
	if d <= 0 || limit <= 0 || before == math.MaxInt64 {
		c.add(d)
		return
	}
	after := new(big.Int).Add(big.NewInt(before), big.NewInt(d))
	if keep := max(before, limit); after.Cmp(big.NewInt(keep)) > 0 {
		c.charged, c.saturated = big.NewInt(keep), keep == math.MaxInt64
		return
	}
	c.add(d)
}

func (c *modelCounter) used() int64 {
	if c.saturated {
		return math.MaxInt64
	}
	return c.charged.Int64()
}

// testExtremes is the property test of the arithmetic, on a seeded
// random sequence (the same on every backend, every run): limits with
// amounts and costs at and around 0, 1, 2⁵³±1, math.MaxInt64-1 and
// math.MaxInt64, on every unit, some sharing a counter; reservations,
// settlements with extreme actual costs, and releases. After every call,
// every counter (read through a limit of the same key, unit and window
// with amount math.MaxInt64, whose Remaining is math.MaxInt64 - used) is
// what exact arithmetic says: never negative, never wrapped, never below
// what its outstanding reservations and settlements charged (saturated at
// math.MaxInt64 at most); an admission leaves every counter it charged
// within its limit; a cost above a limit or saturated is a TooLargeError,
// and a denial names the first limit exact arithmetic says is exceeded.
func testExtremes(t *testing.T, b backend) {
	ctx := context.Background()
	units := []Unit{Requests, InputTokens, OutputTokens, TotalTokens, Money}
	for round := range 40 {
		r := rand.New(rand.NewPCG(32, uint64(round)))
		clock := newFakeClock(t0)
		l := b.newStore(t, clock.Now)()

		// Two to four limits; one in three shares the counter of another
		// (same key, unit, window) with an amount of its own.
		var limits []Limit
		for i := range 2 + r.IntN(3) {
			lim := Limit{Name: fmt.Sprintf("l%d", i), Key: fmt.Sprintf("k%d", r.IntN(2)), Unit: units[r.IntN(len(units))],
				Amount: drawExtreme(r), Window: time.Hour}
			if i > 0 && r.IntN(3) == 0 {
				prev := limits[r.IntN(i)]
				lim.Key, lim.Unit = prev.Key, prev.Unit
			}
			limits = append(limits, lim)
		}
		type ctrID struct {
			key  string
			unit Unit
		}
		model := map[ctrID]*modelCounter{}
		var observe []Limit
		for _, lim := range limits {
			id := ctrID{lim.Key, lim.Unit}
			if model[id] == nil {
				model[id] = &modelCounter{charged: new(big.Int)}
				observe = append(observe, Limit{Name: "observe", Key: lim.Key, Unit: lim.Unit, Amount: math.MaxInt64, Window: time.Hour})
			}
		}
		type held struct {
			res  Reservation
			cost Cost
		}
		var outstanding []held

		check := func(step int, op string) {
			t.Helper()
			res, err := l.Reserve(ctx, observe, Cost{})
			if err != nil || !res.Allowed {
				t.Fatalf("round %d step %d (%s): observing: %+v, %v", round, step, op, res, err)
			}
			for i, o := range observe {
				got := math.MaxInt64 - res.States[i].Remaining
				want := model[ctrID{o.Key, o.Unit}].used()
				if got != want || got < 0 {
					t.Fatalf("round %d step %d (%s): counter %s/%s = %d, want %d (limits %+v)", round, step, op, o.Key, o.Unit, got, want, limits)
				}
			}
		}

		for step := range 40 {
			switch op := r.IntN(4); {
			case op <= 1 || len(outstanding) == 0:
				// Which call is drawn decides the expectation, exactly.
				cost := drawCost(r)
				if r.IntN(2) == 0 { // often a small cost, to be admitted
					cost = Cost{Requests: 1, InputTokens: r.Int64N(100), OutputTokens: r.Int64N(100), Money: r.Int64N(1000)}
				}
				var tooLarge, exceeded string
				for _, lim := range limits {
					c := exactOf(cost, lim.Unit)
					if tooLarge == "" && (c.Cmp(big.NewInt(lim.Amount)) > 0 || c.Cmp(big.NewInt(math.MaxInt64)) == 0) {
						tooLarge = lim.Name
					}
				}
				for _, lim := range limits {
					after := new(big.Int).Add(big.NewInt(model[ctrID{lim.Key, lim.Unit}].used()), exactOf(cost, lim.Unit))
					if exceeded == "" && after.Cmp(big.NewInt(lim.Amount)) > 0 {
						exceeded = lim.Name
					}
				}
				res, err := l.Reserve(ctx, limits, cost)
				var tl *TooLargeError
				switch {
				case tooLarge != "":
					if !errors.As(err, &tl) || tl.Limit.Name != tooLarge {
						t.Fatalf("round %d step %d: Reserve(%+v) under %+v = %+v, %v; want TooLarge %s", round, step, cost, limits, res, err, tooLarge)
					}
				case err != nil:
					t.Fatalf("round %d step %d: Reserve(%+v) under %+v: %v", round, step, cost, limits, err)
				case exceeded != "":
					if res.Allowed || res.Exceeded == nil || res.Exceeded.Name != exceeded {
						t.Fatalf("round %d step %d: Reserve(%+v) under %+v = %+v; want denied by %s", round, step, cost, limits, res, exceeded)
					}
				default:
					if !res.Allowed {
						t.Fatalf("round %d step %d: Reserve(%+v) under %+v = %+v; want admitted", round, step, cost, limits, res)
					}
					charged := map[ctrID]bool{}
					for _, lim := range limits {
						id := ctrID{lim.Key, lim.Unit}
						if !charged[id] {
							charged[id] = true
							model[id].add(cost.Of(lim.Unit))
						}
					}
					// Admitted: every counter it charged is within every limit on it.
					for _, lim := range limits {
						if u := model[ctrID{lim.Key, lim.Unit}].used(); u > lim.Amount {
							t.Fatalf("round %d step %d: admitted past %s: %d > %d", round, step, lim.Name, u, lim.Amount)
						}
					}
					outstanding = append(outstanding, held{res.Reservation, cost})
				}
				check(step, "reserve")
			case op == 2:
				i := r.IntN(len(outstanding))
				h := outstanding[i]
				outstanding = append(outstanding[:i], outstanding[i+1:]...)
				actual := drawCost(r)
				if r.IntN(2) == 0 { // a refund, often
					actual = Cost{InputTokens: r.Int64N(10), OutputTokens: r.Int64N(10), Money: r.Int64N(10)}
				}
				if err := l.Settle(ctx, h.res, actual); err != nil {
					t.Fatalf("round %d step %d: Settle: %v", round, step, err)
				}
				for _, e := range h.res.Entries {
					if e.Unit != Requests {
						id := ctrID{counterLimitKey(t, e.Counter, observe), e.Unit}
						model[id].settle(actual.Of(e.Unit)-h.cost.Of(e.Unit), e.Limit)
					}
				}
				check(step, "settle")
			default:
				i := r.IntN(len(outstanding))
				h := outstanding[i]
				outstanding = append(outstanding[:i], outstanding[i+1:]...)
				if err := l.Release(ctx, h.res); err != nil {
					t.Fatalf("round %d step %d: Release: %v", round, step, err)
				}
				for _, e := range h.res.Entries {
					model[ctrID{counterLimitKey(t, e.Counter, observe), e.Unit}].add(-h.cost.Of(e.Unit))
				}
				check(step, "release")
			}
		}
	}
}

// exactOf is c.Of(u) without saturation.
func exactOf(c Cost, u Unit) *big.Int {
	if u == TotalTokens {
		return new(big.Int).Add(big.NewInt(c.InputTokens), big.NewInt(c.OutputTokens))
	}
	return big.NewInt(c.Of(u))
}

// counterLimitKey is the limit key, among observe's, whose counter id is
// id (ids hold the key between braces, or after the hash tag).
func counterLimitKey(t *testing.T, id string, observe []Limit) string {
	t.Helper()
	head, unit, _, _, ok := parseCounterID(id)
	if !ok {
		t.Fatalf("counter id %q does not parse", id)
	}
	for _, o := range observe {
		if o.Unit == unit && (strings.HasSuffix(head, "{"+o.Key+"}") || strings.HasSuffix(head, "}:"+o.Key)) {
			return o.Key
		}
	}
	t.Fatalf("counter id %q is none of %+v", id, observe)
	return ""
}
