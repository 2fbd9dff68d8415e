package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Money budgets and calendar-month windows, on every backend: memory,
// Redis, a Redis Cluster, and WithFallback both through its primary and
// limiting locally while the primary is down.

func fallbackBackend(t *testing.T) backend {
	r := redisBackend(t)
	return backend{
		name: "fallback",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			primary := r.newStore(t, clock)
			f := NewFallback(primary(), FallbackOptions{Mode: FailLocal, Clock: clock})
			return func() Limiter { return f }
		},
	}
}

func fallbackLocalBackend() backend {
	return backend{
		name: "fallback-local",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			down := newFlaky(clock)
			down.fail(errDown)
			f := NewFallback(down, FallbackOptions{Mode: FailLocal, Clock: clock})
			return func() Limiter { return f }
		},
	}
}

func TestMonthAndMoney(t *testing.T) {
	backends := []backend{memoryBackend(), redisBackend(t), redisClusterBackend(t), fallbackBackend(t), fallbackLocalBackend()}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Run("MonthEdges", func(t *testing.T) { testMonthEdges(t, b) })
			t.Run("MoneyExact", func(t *testing.T) { testMoneyExact(t, b) })
			t.Run("SettleAcrossMonths", func(t *testing.T) { testSettleAcrossMonths(t, b) })
		})
	}
}

// usd is n units of the currency in pico-units.
func usd(n int64) int64 { return n * 1_000_000_000_000 }

func monthly(name string, amount int64) Limit {
	return Limit{Name: name, Key: "tenant=acme", Unit: Money, Amount: amount, Window: Month}
}

func money(pico int64) Cost { return Cost{Requests: 1, Money: pico} }

func utc(y int, m time.Month, d, h, min, s, ms int) time.Time {
	return time.Date(y, m, d, h, min, s, ms*int(time.Millisecond), time.UTC)
}

// testMonthEdges spends a monthly budget to the last millisecond of a
// month and checks that the next month, whatever its length, starts
// afresh at 00:00 UTC on the 1st (never a fixed 30 days later).
func testMonthEdges(t *testing.T, b backend) {
	for _, tc := range []struct {
		name      string
		last      time.Time     // the month's last millisecond
		nextReset time.Duration // Reset at the next month's first instant: its length
	}{
		{"Dec→Jan", utc(2026, time.December, 31, 23, 59, 59, 999), 31 * 24 * time.Hour},
		{"Jan→Feb", utc(2027, time.January, 31, 23, 59, 59, 999), 28 * 24 * time.Hour},
		{"Feb→Mar", utc(2027, time.February, 28, 23, 59, 59, 999), 31 * 24 * time.Hour},
		{"leap Feb→Mar", utc(2028, time.February, 29, 23, 59, 59, 999), 31 * 24 * time.Hour},
		{"Apr→May", utc(2027, time.April, 30, 23, 59, 59, 999), 31 * 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := time.Date(tc.last.Year(), tc.last.Month(), 1, 0, 0, 0, 0, time.UTC)
			clock := newFakeClock(first)
			l := b.newStore(t, clock.Now)()
			limits := []Limit{monthly("month", usd(500))}
			ctx := context.Background()
			monthLen := tc.last.Sub(first) + time.Millisecond

			res, err := l.Reserve(ctx, limits, money(usd(300)))
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "first instant", limits, step{allowed: true, remaining: []int64{usd(200)}, reset: []time.Duration{monthLen}}, res)

			clock.Set(tc.last)
			res, err = l.Reserve(ctx, limits, money(usd(201)))
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "last millisecond, over", limits, step{exceeded: "month", remaining: []int64{usd(200)},
				reset: []time.Duration{time.Millisecond}, retryAfter: time.Millisecond}, res)
			res, err = l.Reserve(ctx, limits, money(usd(200)))
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "last millisecond, the rest", limits, step{allowed: true, remaining: []int64{0}}, res)

			clock.Set(tc.last.Add(time.Millisecond))
			res, err = l.Reserve(ctx, limits, money(usd(500)))
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "next month", limits, step{allowed: true, remaining: []int64{0}, reset: []time.Duration{tc.nextReset}}, res)
			if e := res.Reservation.Entries[0]; e.ExpiresAt != tc.last.Add(time.Millisecond+tc.nextReset).UnixMilli() {
				t.Errorf("next month's entry expires at %s, want %s", time.UnixMilli(e.ExpiresAt).UTC(), tc.last.Add(time.Millisecond+tc.nextReset))
			}
		})
	}
}

// testMoneyExact admits to the last pico-unit of a budget far past 2⁵³
// pico-units (where a double no longer tells n from n+1), with a token
// limit beside it that the money cost does not touch.
func testMoneyExact(t *testing.T, b backend) {
	clock := newFakeClock(utc(2027, time.March, 10, 12, 0, 0, 0))
	l := b.newStore(t, clock.Now)()
	ctx := context.Background()
	amount := usd(1_000_000) // 10¹⁸ pico-units
	limits := []Limit{
		{Name: "day", Key: "tenant=acme", Unit: Money, Amount: amount, Window: 24 * time.Hour},
		tpm("tokens", "tenant=acme", 100),
		monthly("month", amount),
	}
	for i, s := range []struct {
		cost      Cost
		allowed   bool
		remaining []int64
	}{
		{Cost{Requests: 1, InputTokens: 10, Money: amount - 2}, true, []int64{2, 90, 2}},
		{Cost{Requests: 1, Money: 1}, true, []int64{1, 90, 1}},
		{Cost{Requests: 1, Money: 2}, false, []int64{1, 90, 1}},
		{Cost{Requests: 1, Money: 1}, true, []int64{0, 90, 0}},
		{Cost{Requests: 1, Money: 1}, false, []int64{0, 90, 0}},
		{Cost{Requests: 1, InputTokens: 90}, true, []int64{0, 0, 0}},
	} {
		res, err := l.Reserve(ctx, limits, s.cost)
		if err != nil {
			t.Fatal(err)
		}
		want := step{allowed: s.allowed, remaining: s.remaining}
		if !s.allowed {
			want.exceeded, want.retryAfter = "day", 12*time.Hour
		}
		checkResult(t, fmt.Sprintf("step %d", i), limits, want, res)
	}
	// Settling refunds exactly, too.
	res, err := l.Reserve(ctx, limits[:1], Cost{})
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve(zero) = %+v, %v", res, err)
	}
	res.Reservation.Entries[0].Reserved = amount
	if err := l.Settle(ctx, res.Reservation, Cost{Requests: 1, Money: amount - 3}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, l, limits[:1]); got[0] != 3 {
		t.Errorf("remaining after a refund of 3 = %d, want 3", got[0])
	}
}

// testSettleAcrossMonths settles a reservation of a month's last second
// after the month ended: the excess falls on the new month, a shortfall
// is refunded to the ended month only.
func testSettleAcrossMonths(t *testing.T, b backend) {
	last := utc(2026, time.December, 31, 23, 59, 59, 0)
	limits := []Limit{monthly("month", usd(100))}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		actual int64
		want   int64 // January's remaining
	}{
		{"excess carried into January", usd(30), usd(90)},
		{"shortfall not refunded to January", usd(5), usd(100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(last)
			l := b.newStore(t, clock.Now)()
			res, err := l.Reserve(ctx, limits, money(usd(20)))
			if err != nil || !res.Allowed {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
			clock.Set(last.Add(2 * time.Second))
			if err := l.Settle(ctx, res.Reservation, money(tc.actual)); err != nil {
				t.Fatal(err)
			}
			if got := remaining(t, l, limits); got[0] != tc.want {
				t.Errorf("January's remaining = %d, want %d", got[0], tc.want)
			}
		})
	}
}

func TestMonthCounterIDs(t *testing.T) {
	l := monthly("m", 1)
	start, end := window(utc(2028, time.February, 29, 23, 0, 0, 0).UnixMilli(), Month)
	if want := utc(2028, time.February, 1, 0, 0, 0, 0).UnixMilli(); start != want {
		t.Errorf("start = %d, want %d", start, want)
	}
	if want := utc(2028, time.March, 1, 0, 0, 0, 0).UnixMilli(); end != want {
		t.Errorf("end = %d, want %d", end, want)
	}
	id := counterID(DefaultCounterPrefix, "", &l, start)
	if want := fmt.Sprintf("ig:rl:{tenant=acme}:money:month:%d", start); id != want {
		t.Errorf("id = %q, want %q", id, want)
	}
	head, unit, w, s, ok := parseCounterID(id)
	if !ok || head != "ig:rl:{tenant=acme}" || unit != Money || w != Month || s != start {
		t.Errorf("parseCounterID(%q) = %q, %q, %v, %d, %v", id, head, unit, w, s, ok)
	}
	if err := validate([]Limit{l}, Cost{Money: -1}); err == nil {
		t.Error("a negative money cost is valid")
	}
	if err := validate([]Limit{{Name: "x", Key: "k", Unit: Money, Amount: 1, Window: -2}}, Cost{}); err == nil {
		t.Error("a negative window other than Month is valid")
	}
}

// TestRedisMonthTTL: a month's counter outlives its month in Redis (by
// the month's length, the default grace), so that it survives the replicas
// and, with persistence, Redis itself, for the whole window.
func TestRedisMonthTTL(t *testing.T) {
	srv := startRedis(t)
	c := newRedisClient(t, srv.Addr(), false)
	now := utc(2027, time.January, 31, 12, 0, 0, 0)
	l := NewRedis(c, func() time.Time { return now }, RedisOptions{})
	res, err := l.Reserve(context.Background(), []Limit{monthly("month", usd(1))}, money(1))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	ttl, err := c.PTTL(context.Background(), res.Reservation.Entries[0].Counter).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Twelve hours of January left, then January's length again.
	if want := 12*time.Hour + 31*24*time.Hour; ttl < want-time.Minute || ttl > want {
		t.Errorf("TTL = %s, want %s", ttl, want)
	}
}
