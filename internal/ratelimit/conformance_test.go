package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// backend makes limiters for the conformance suite. newStore starts an
// empty store whose limiters all use clock; each call of the returned
// function gives a limiter on that store, a separate instance (replica)
// where the backend allows it.
type backend struct {
	name     string
	newStore func(t *testing.T, clock Clock) func() Limiter
}

func memoryBackend() backend {
	return backend{
		name: "memory",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			m := NewMemory(clock)
			return func() Limiter { return m }
		},
	}
}

// embeddedBackend gives every store a file of its own; each limiter is a
// separate instance on the store's open file.
func embeddedBackend() backend {
	return backend{
		name: "embedded",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			db := openLedger(t, filepath.Join(t.TempDir(), "ledger.db"))
			return func() Limiter {
				e, err := NewEmbedded(db, clock, EmbeddedOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
		},
	}
}

// redisBackend runs every store on one server, each under its own prefix,
// each limiter with its own client.
func redisBackend(t *testing.T) backend {
	srv := startRedis(t)
	var stores atomic.Int64
	return backend{
		name: "redis",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			prefix := fmt.Sprintf("test%d:", stores.Add(1))
			return func() Limiter {
				return NewRedis(newRedisClient(t, srv.Addr(), false), clock, RedisOptions{Prefix: prefix})
			}
		},
	}
}

// redisClusterBackend runs every store on one Redis Cluster (three
// primaries), each under its own prefix and, one store in two, its own
// hash tag (so that stores land on different primaries), each limiter
// with its own cluster client.
func redisClusterBackend(t *testing.T) backend {
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{NoReplicas: true})
	var stores atomic.Int64
	return backend{
		name: "redis-cluster",
		newStore: func(t *testing.T, clock Clock) func() Limiter {
			n := stores.Add(1)
			opts := RedisOptions{Prefix: fmt.Sprintf("test%d:", n)}
			if n%2 == 0 {
				opts.HashTag = fmt.Sprintf("tag%d", n)
			}
			return func() Limiter { return NewRedis(c.NewClient(t), clock, opts) }
		},
	}
}

func TestMemoryConformance(t *testing.T) { runConformance(t, memoryBackend()) }

func TestEmbeddedConformance(t *testing.T) { runConformance(t, embeddedBackend()) }

func TestRedisConformance(t *testing.T) { runConformance(t, redisBackend(t)) }

func TestRedisClusterConformance(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	runConformance(t, redisClusterBackend(t))
}

// runConformance is the behaviour every Limiter backend must have.
func runConformance(t *testing.T, b backend) {
	t.Run("Reserve", func(t *testing.T) { testReserve(t, b) })
	t.Run("Settle", func(t *testing.T) { testSettle(t, b) })
	t.Run("SettleAfterWindow", func(t *testing.T) { testSettleAfterWindow(t, b) })
	t.Run("Release", func(t *testing.T) { testRelease(t, b) })
	t.Run("SettleElsewhere", func(t *testing.T) { testSettleElsewhere(t, b) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, b) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, b) })
	t.Run("ConcurrentAfterWindow", func(t *testing.T) { testConcurrentAfterWindow(t, b) })
	t.Run("TooLarge", func(t *testing.T) { testTooLarge(t, b) })
	t.Run("Extremes", func(t *testing.T) { testExtremes(t, b) })
	t.Run("Debt", func(t *testing.T) { testDebt(t, b) })
}

// step is one Reserve call and what it must answer.
type step struct {
	at         time.Duration // clock, from t0
	cost       Cost
	allowed    bool
	exceeded   string          // name of the first exceeded limit, when denied
	remaining  []int64         // States[i].Remaining
	reset      []time.Duration // States[i].Reset, if given
	retryAfter time.Duration   // when denied
}

func rpm(name, key string, n int64) Limit {
	return Limit{Name: name, Key: key, Unit: Requests, Amount: n, Window: time.Minute}
}

func tpm(name, key string, n int64) Limit {
	return Limit{Name: name, Key: key, Unit: TotalTokens, Amount: n, Window: time.Minute}
}

func req(in, out int64) Cost { return Cost{Requests: 1, InputTokens: in, OutputTokens: out} }

func testReserve(t *testing.T, b backend) {
	hourly := Limit{Name: "rph", Key: "k", Unit: Requests, Amount: 3, Window: time.Hour}
	tests := []struct {
		name   string
		limits []Limit
		steps  []step
	}{
		{
			name:   "admit up to the limit then deny",
			limits: []Limit{rpm("rpm", "tenant=a", 3)},
			steps: []step{
				{at: 10 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{2}, reset: []time.Duration{50 * time.Second}},
				{at: 10 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{1}},
				{at: 20 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{0}, reset: []time.Duration{40 * time.Second}},
				{at: 30 * time.Second, cost: req(0, 0), exceeded: "rpm", remaining: []int64{0}, reset: []time.Duration{30 * time.Second}, retryAfter: 30 * time.Second},
				{at: 59*time.Second + 999*time.Millisecond, cost: req(0, 0), exceeded: "rpm", remaining: []int64{0}, retryAfter: time.Millisecond},
			},
		},
		{
			name:   "window rollover",
			limits: []Limit{rpm("rpm", "tenant=a", 2)},
			steps: []step{
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{1}, reset: []time.Duration{time.Minute}},
				{at: 30 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{0}},
				{at: 59 * time.Second, cost: req(0, 0), exceeded: "rpm", remaining: []int64{0}, retryAfter: time.Second},
				{at: 60 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{1}, reset: []time.Duration{time.Minute}},
				{at: 61 * time.Second, cost: req(0, 0), allowed: true, remaining: []int64{0}},
				{at: 61 * time.Second, cost: req(0, 0), exceeded: "rpm", remaining: []int64{0}, retryAfter: 59 * time.Second},
				{at: 10 * time.Minute, cost: req(0, 0), allowed: true, remaining: []int64{1}},
			},
		},
		{
			name:   "windows are aligned to the epoch, not to the first request",
			limits: []Limit{hourly},
			steps: []step{
				{at: 45 * time.Minute, cost: req(0, 0), allowed: true, remaining: []int64{2}, reset: []time.Duration{15 * time.Minute}},
				{at: 61 * time.Minute, cost: req(0, 0), allowed: true, remaining: []int64{2}, reset: []time.Duration{59 * time.Minute}},
			},
		},
		{
			name:   "a cost up to the amount is admitted on an unused counter",
			limits: []Limit{tpm("tpm", "tenant=a", 100)},
			steps: []step{
				{at: 0, cost: req(60, 40), allowed: true, remaining: []int64{0}},
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{0}},
				{at: 0, cost: req(1, 0), exceeded: "tpm", remaining: []int64{0}, retryAfter: time.Minute},
			},
		},
		{
			name:   "multiple limits are charged atomically",
			limits: []Limit{rpm("rpm", "tenant=a", 10), tpm("tpm", "tenant=a", 100)},
			steps: []step{
				{at: 0, cost: req(50, 10), allowed: true, remaining: []int64{9, 40}},
				// Denied by tpm: rpm is not charged either.
				{at: time.Second, cost: req(30, 20), exceeded: "tpm", remaining: []int64{9, 40}, retryAfter: 59 * time.Second},
				{at: time.Second, cost: req(30, 10), allowed: true, remaining: []int64{8, 0}},
			},
		},
		{
			name: "the first exceeded limit is named",
			limits: []Limit{
				rpm("tenant", "tenant=a", 1),
				{Name: "model", Key: "model=m", Unit: Requests, Amount: 1, Window: time.Hour},
			},
			steps: []step{
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{0, 0}, reset: []time.Duration{time.Minute, time.Hour}},
				{at: 10 * time.Second, cost: req(0, 0), exceeded: "tenant", remaining: []int64{0, 0}, retryAfter: 50 * time.Second},
				{at: 70 * time.Second, cost: req(0, 0), exceeded: "model", remaining: []int64{1, 0}, reset: []time.Duration{50 * time.Second, 58*time.Minute + 50*time.Second}, retryAfter: 58*time.Minute + 50*time.Second},
			},
		},
		{
			name:   "same key and unit with different windows are separate counters",
			limits: []Limit{rpm("rpm", "k", 2), hourly},
			steps: []step{
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{1, 2}},
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{0, 1}},
				{at: 0, cost: req(0, 0), exceeded: "rpm", remaining: []int64{0, 1}, retryAfter: time.Minute},
				{at: time.Minute, cost: req(0, 0), allowed: true, remaining: []int64{1, 0}},
				{at: 2 * time.Minute, cost: req(0, 0), exceeded: "rph", remaining: []int64{2, 0}, retryAfter: 58 * time.Minute},
			},
		},
		{
			name:   "two limits on one counter charge it once",
			limits: []Limit{tpm("loose", "k", 10), tpm("strict", "k", 5)},
			steps: []step{
				{at: 0, cost: req(1, 1), allowed: true, remaining: []int64{8, 3}},
				{at: 0, cost: req(2, 2), exceeded: "strict", remaining: []int64{8, 3}, retryAfter: time.Minute},
				{at: 0, cost: req(2, 1), allowed: true, remaining: []int64{5, 0}},
			},
		},
		{
			name: "each unit counts its part of the cost",
			limits: []Limit{
				rpm("req", "k", 10),
				{Name: "in", Key: "k", Unit: InputTokens, Amount: 100, Window: time.Minute},
				{Name: "out", Key: "k", Unit: OutputTokens, Amount: 100, Window: time.Minute},
				tpm("total", "k", 100),
			},
			steps: []step{
				{at: 0, cost: req(30, 20), allowed: true, remaining: []int64{9, 70, 80, 50}},
				{at: 0, cost: Cost{InputTokens: 5}, allowed: true, remaining: []int64{9, 65, 80, 45}},
				{at: 0, cost: req(10, 41), exceeded: "total", remaining: []int64{9, 65, 80, 45}, retryAfter: time.Minute},
			},
		},
		{
			name:   "a zero amount admits only zero costs",
			limits: []Limit{tpm("none", "k", 0)},
			steps: []step{
				{at: 0, cost: req(0, 0), allowed: true, remaining: []int64{0}},
				// req(0, 1) is ErrTooLarge: testTooLarge
			},
		},
		{
			name:   "no limits",
			limits: nil,
			steps:  []step{{at: 0, cost: req(5, 5), allowed: true}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			l := b.newStore(t, clock.Now)()
			for i, s := range tc.steps {
				clock.SetOffset(s.at)
				res, err := l.Reserve(context.Background(), tc.limits, s.cost)
				if err != nil {
					t.Fatalf("step %d: Reserve: %v", i, err)
				}
				checkResult(t, fmt.Sprintf("step %d", i), tc.limits, s, res)
			}
		})
	}
}

func checkResult(t *testing.T, what string, limits []Limit, s step, res Result) {
	t.Helper()
	if res.Allowed != s.allowed {
		t.Fatalf("%s: Allowed = %v, want %v (result %+v)", what, res.Allowed, s.allowed, res)
	}
	if len(res.States) != len(limits) {
		t.Fatalf("%s: %d states for %d limits", what, len(res.States), len(limits))
	}
	var remaining []int64
	for i, st := range res.States {
		if !reflect.DeepEqual(st.Limit, limits[i]) {
			t.Errorf("%s: States[%d].Limit = %+v, want %+v", what, i, st.Limit, limits[i])
		}
		remaining = append(remaining, st.Remaining)
		if s.reset != nil && st.Reset != s.reset[i] {
			t.Errorf("%s: States[%d].Reset = %s, want %s", what, i, st.Reset, s.reset[i])
		}
	}
	if s.remaining != nil && !reflect.DeepEqual(remaining, s.remaining) {
		t.Errorf("%s: remaining = %v, want %v", what, remaining, s.remaining)
	}
	if s.allowed {
		if res.Exceeded != nil || res.RetryAfter != 0 {
			t.Errorf("%s: admitted with Exceeded %+v, RetryAfter %s", what, res.Exceeded, res.RetryAfter)
		}
		if len(limits) > 0 && len(res.Reservation.Entries) == 0 {
			t.Errorf("%s: admitted with an empty reservation", what)
		}
		return
	}
	if res.Exceeded == nil || res.Exceeded.Name != s.exceeded {
		t.Errorf("%s: Exceeded = %+v, want limit %q", what, res.Exceeded, s.exceeded)
	}
	if res.RetryAfter != s.retryAfter {
		t.Errorf("%s: RetryAfter = %s, want %s", what, res.RetryAfter, s.retryAfter)
	}
	if len(res.Reservation.Entries) != 0 {
		t.Errorf("%s: denied with reservation %+v", what, res.Reservation)
	}
}

// remaining reserves nothing and returns each limit's Remaining.
func remaining(t *testing.T, l Limiter, limits []Limit) []int64 {
	t.Helper()
	res, err := l.Reserve(context.Background(), limits, Cost{})
	if err != nil {
		t.Fatalf("Reserve(zero cost): %v", err)
	}
	var out []int64
	for _, s := range res.States {
		out = append(out, s.Remaining)
	}
	return out
}

func testSettle(t *testing.T, b backend) {
	limits := []Limit{
		rpm("rpm", "k", 10),
		{Name: "in", Key: "k", Unit: InputTokens, Amount: 1000, Window: time.Minute},
		{Name: "out", Key: "k", Unit: OutputTokens, Amount: 1000, Window: time.Minute},
		tpm("total", "k", 1000),
	}
	tests := []struct {
		name     string
		reserve  Cost
		edit     func(*Reservation) // tampers with the reservation before settling
		actual   Cost
		want     []int64 // remaining after settling
		thenDeny Cost    // if set, must be denied afterwards
	}{
		{name: "exact: nothing changes", reserve: req(100, 500), actual: req(100, 500), want: []int64{9, 900, 500, 400}},
		{name: "refund unused output", reserve: req(100, 500), actual: req(100, 120), want: []int64{9, 900, 880, 780}},
		{name: "charge more input than estimated", reserve: req(100, 500), actual: req(180, 500), want: []int64{9, 820, 500, 320}},
		{name: "charge output reserved as zero", reserve: req(100, 0), actual: req(100, 300), want: []int64{9, 900, 700, 600}},
		{
			name: "charge past the limit", reserve: req(100, 500), actual: req(100, 1200),
			// The counters stop at their limits (the rest is debt on the
			// next window, see testDebt): a request of one token is denied.
			want: []int64{9, 900, 0, 0}, thenDeny: req(0, 1),
		},
		{name: "request count is final", reserve: req(100, 500), actual: Cost{InputTokens: 100, OutputTokens: 500}, want: []int64{9, 900, 500, 400}},
		{
			name: "never below zero", reserve: req(100, 500),
			edit: func(r *Reservation) {
				for i := range r.Entries {
					r.Entries[i].Reserved += 5000
				}
			},
			actual: req(100, 500), want: []int64{9, 1000, 1000, 1000},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(5 * time.Second))
			l := b.newStore(t, clock.Now)()
			res, err := l.Reserve(context.Background(), limits, tc.reserve)
			if err != nil || !res.Allowed {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
			if tc.edit != nil {
				tc.edit(&res.Reservation)
			}
			clock.Advance(30 * time.Second)
			if err := l.Settle(context.Background(), res.Reservation, tc.actual); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			if got := remaining(t, l, limits); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("remaining after settling = %v, want %v", got, tc.want)
			}
			if tc.thenDeny != (Cost{}) {
				res, err := l.Reserve(context.Background(), limits, tc.thenDeny)
				if err != nil || res.Allowed {
					t.Errorf("Reserve(%+v) after overcharge = %+v, %v; want denied", tc.thenDeny, res, err)
				}
			}
		})
	}
}

// testSettleAfterWindow settles reservations whose window has ended by
// the time the settlement lands (a stream longer than the rest of its
// window): the excess is charged to the window in force, a shortfall is
// refunded to the ended window (never to the one in force).
func testSettleAfterWindow(t *testing.T, b backend) {
	tpmK := tpm("tpm", "k", 1000)
	tphK := Limit{Name: "tph", Key: "k", Unit: TotalTokens, Amount: 10000, Window: time.Hour}
	units := []Limit{
		rpm("rpm", "k", 10),
		{Name: "in", Key: "k", Unit: InputTokens, Amount: 1000, Window: time.Minute},
		{Name: "out", Key: "k", Unit: OutputTokens, Amount: 1000, Window: time.Minute},
		tpm("total", "k", 1000),
	}
	tests := []struct {
		name     string
		limits   []Limit
		reserve  Cost          // at 50 s, in the first window
		before   Cost          // if set, reserved in the window in force before settling
		settleAt time.Duration // from t0
		actual   Cost
		want     []int64 // remaining in the window in force after settling
	}{
		{
			name: "excess charged to the window in force", limits: []Limit{tpmK},
			reserve: req(100, 100), before: req(100, 0), settleAt: 70 * time.Second, actual: req(100, 700),
			want: []int64{300}, // 100 reserved in this window + 600 carried over
		},
		{
			name: "shortfall not refunded to the window in force", limits: []Limit{tpmK},
			reserve: req(100, 100), before: req(100, 0), settleAt: 70 * time.Second, actual: req(10, 10),
			want: []int64{900},
		},
		{
			name: "exact: nothing changes", limits: []Limit{tpmK},
			reserve: req(100, 100), before: req(100, 0), settleAt: 70 * time.Second, actual: req(100, 100),
			want: []int64{900},
		},
		{
			name: "the window in force has no counter yet", limits: []Limit{tpmK},
			reserve: req(100, 100), settleAt: 61 * time.Second, actual: req(100, 700),
			want: []int64{400},
		},
		{
			name: "several windows later", limits: []Limit{tpmK},
			reserve: req(100, 100), settleAt: 3*time.Minute + 30*time.Second, actual: req(100, 700),
			want: []int64{400},
		},
		{
			name: "exactly at the window's end counts as ended", limits: []Limit{tpmK},
			reserve: req(100, 100), settleAt: time.Minute, actual: req(100, 700),
			want: []int64{400},
		},
		{
			name: "each unit carries its own excess", limits: units,
			reserve: req(100, 500), settleAt: 70 * time.Second, actual: req(40, 800),
			// input: 60 less, refunded to the ended window; output: 300 more; total: 240 more;
			// requests: final.
			want: []int64{10, 1000, 700, 760},
		},
		{
			name: "a window in force and an ended one: excess", limits: []Limit{tpmK, tphK},
			reserve: req(100, 100), settleAt: 70 * time.Second, actual: req(100, 700),
			want: []int64{400, 9200}, // the hour's own counter gets +600, the new minute 600
		},
		{
			name: "a window in force and an ended one: shortfall", limits: []Limit{tpmK, tphK},
			reserve: req(100, 100), settleAt: 70 * time.Second, actual: req(10, 10),
			want: []int64{1000, 9980}, // the hour is refunded 180, the ended minute too
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(50 * time.Second))
			l := b.newStore(t, clock.Now)()
			ctx := context.Background()
			old, err := l.Reserve(ctx, tc.limits, tc.reserve)
			if err != nil || !old.Allowed {
				t.Fatalf("Reserve = %+v, %v", old, err)
			}
			clock.SetOffset(tc.settleAt)
			if tc.before != (Cost{}) {
				if res, err := l.Reserve(ctx, tc.limits, tc.before); err != nil || !res.Allowed {
					t.Fatalf("Reserve in the window in force = %+v, %v", res, err)
				}
			}
			if err := l.Settle(ctx, old.Reservation, tc.actual); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			if got := remaining(t, l, tc.limits); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("remaining after settling = %v, want %v", got, tc.want)
			}
		})
	}

	// A shortfall settled at the window's end is refunded to the ended
	// window's counter: it then records what its requests really used.
	t.Run("refund to the ended window", func(t *testing.T) {
		clock := newFakeClock(t0.Add(50 * time.Second))
		l := b.newStore(t, clock.Now)()
		limits := []Limit{tpmK}
		res, err := l.Reserve(context.Background(), limits, req(100, 100))
		if err != nil || !res.Allowed {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		clock.SetOffset(time.Minute)
		if err := l.Settle(context.Background(), res.Reservation, req(0, 0)); err != nil {
			t.Fatal(err)
		}
		clock.SetOffset(time.Minute - time.Millisecond)
		if got := remaining(t, l, limits); got[0] != 1000 {
			t.Errorf("settling at the window end: remaining = %d, want 1000 (the reservation refunded)", got[0])
		}
	})
}

// testRelease gives reservations back whole: requests and tokens.
func testRelease(t *testing.T, b backend) {
	limits := []Limit{
		rpm("rpm", "k", 10),
		{Name: "in", Key: "k", Unit: InputTokens, Amount: 1000, Window: time.Minute},
		{Name: "out", Key: "k", Unit: OutputTokens, Amount: 1000, Window: time.Minute},
		tpm("total", "k", 1000),
	}
	setup := func(t *testing.T) (*fakeClock, func() Limiter, Result) {
		t.Helper()
		clock := newFakeClock(t0.Add(50 * time.Second))
		store := b.newStore(t, clock.Now)
		l := store()
		if res, err := l.Reserve(context.Background(), limits, req(50, 50)); err != nil || !res.Allowed {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		res, err := l.Reserve(context.Background(), limits, req(100, 500))
		if err != nil || !res.Allowed {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		return clock, store, res
	}
	afterFirst := []int64{9, 950, 950, 900}

	t.Run("everything given back, on another replica", func(t *testing.T) {
		clock, store, res := setup(t)
		clock.Advance(5 * time.Second)
		if err := store().Release(context.Background(), res.Reservation); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := remaining(t, store(), limits); !reflect.DeepEqual(got, afterFirst) {
			t.Errorf("remaining after release = %v, want %v", got, afterFirst)
		}
	})
	t.Run("never below zero", func(t *testing.T) {
		_, store, res := setup(t)
		for i := range res.Reservation.Entries {
			res.Reservation.Entries[i].Reserved += 5000
		}
		if err := store().Release(context.Background(), res.Reservation); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got, want := remaining(t, store(), limits), []int64{10, 1000, 1000, 1000}; !reflect.DeepEqual(got, want) {
			t.Errorf("remaining after release = %v, want %v", got, want)
		}
	})
	t.Run("an ended window is left alone", func(t *testing.T) {
		clock, store, res := setup(t)
		clock.SetOffset(time.Minute)
		if err := store().Release(context.Background(), res.Reservation); err != nil {
			t.Fatalf("Release: %v", err)
		}
		clock.SetOffset(time.Minute - time.Millisecond)
		if got, want := remaining(t, store(), limits), []int64{8, 850, 450, 300}; !reflect.DeepEqual(got, want) {
			t.Errorf("ended window after release = %v, want %v", got, want)
		}
		clock.SetOffset(time.Minute)
		if got, want := remaining(t, store(), limits), []int64{10, 1000, 1000, 1000}; !reflect.DeepEqual(got, want) {
			t.Errorf("window in force after release = %v, want %v", got, want)
		}
	})
}

// testSettleElsewhere settles, through another replica, a reservation that
// travelled as JSON.
func testSettleElsewhere(t *testing.T, b backend) {
	limits := []Limit{rpm("rpm", "tenant=a/model=m", 10), tpm("tpm", "tenant=a", 1000)}
	clock := newFakeClock(t0)
	store := b.newStore(t, clock.Now)
	a, other := store(), store()
	res, err := a.Reserve(context.Background(), limits, req(100, 400))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	data, err := json.Marshal(res.Reservation)
	if err != nil {
		t.Fatal(err)
	}
	var r Reservation
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, res.Reservation) {
		t.Fatalf("JSON round trip: %+v, want %+v", r, res.Reservation)
	}
	if err := other.Settle(context.Background(), r, req(100, 50)); err != nil {
		t.Fatal(err)
	}
	if got, want := remaining(t, a, limits), []int64{9, 850}; !reflect.DeepEqual(got, want) {
		t.Errorf("remaining = %v, want %v", got, want)
	}
}

func testInvalid(t *testing.T, b backend) {
	ok := rpm("ok", "k", 1)
	tests := []struct {
		name   string
		limits []Limit
		cost   Cost
	}{
		{"zero window", []Limit{ok, {Name: "w", Key: "k", Unit: Requests, Amount: 1}}, req(0, 0)},
		{"sub-millisecond window", []Limit{{Name: "w", Key: "k", Unit: Requests, Amount: 1, Window: time.Second + time.Microsecond}}, req(0, 0)},
		{"negative amount", []Limit{{Name: "a", Key: "k", Unit: Requests, Amount: -1, Window: time.Second}}, req(0, 0)},
		{"unknown unit", []Limit{{Name: "u", Key: "k", Unit: "bytes", Amount: 1, Window: time.Second}}, req(0, 0)},
		{"negative cost", []Limit{ok}, Cost{Requests: 1, OutputTokens: -1}},
	}
	clock := newFakeClock(t0)
	l := b.newStore(t, clock.Now)()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Reserve(context.Background(), tc.limits, tc.cost)
			if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnavailable) {
				t.Fatalf("Reserve: %v, want ErrInvalid", err)
			}
		})
	}
	// Nothing was charged by the failed calls.
	if got := remaining(t, l, []Limit{ok}); got[0] != 1 {
		t.Errorf("remaining = %d, want 1", got[0])
	}
	if err := l.Settle(context.Background(), Reservation{}, Cost{InputTokens: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Settle(negative actual) = %v, want ErrInvalid", err)
	}
	// An actual whose total tokens pass int64 saturates (testExtremes).
	if err := l.Settle(context.Background(), Reservation{}, Cost{InputTokens: 1 << 62, OutputTokens: 1 << 62}); err != nil {
		t.Errorf("Settle(saturating actual) = %v, want nil", err)
	}
	// An ended entry whose counter cannot be carried over is reported; the
	// other entries are settled all the same.
	tokens := []Limit{tpm("tpm", "k", 100)}
	res, err := l.Reserve(context.Background(), tokens, req(10, 10))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	ended := t0.UnixMilli() // == now: ended
	id := res.Reservation.Entries[0].Counter
	for _, bad := range []Entry{
		{Counter: "garbage", Unit: TotalTokens, ExpiresAt: ended},
		{Counter: id, Unit: InputTokens, ExpiresAt: ended},                                         // unit is not the id's
		{Counter: id, Unit: TotalTokens, ExpiresAt: ended - 1},                                     // end is not the id's
		{Counter: id[:strings.LastIndexByte(id, ':')] + ":x", Unit: TotalTokens, ExpiresAt: ended}, // bad start
	} {
		r := Reservation{Entries: []Entry{bad, res.Reservation.Entries[0]}}
		if err := l.Settle(context.Background(), r, req(10, 0)); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnavailable) {
			t.Errorf("Settle(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	// Four refunds of 10 on the good entry, floored at zero.
	if got := remaining(t, l, tokens); got[0] != 100 {
		t.Errorf("remaining = %d, want 100", got[0])
	}
}

// testConcurrentAfterWindow settles 100 reservations of an ended window
// concurrently through two replicas, all with more than they reserved:
// the window in force, which has no counter yet, ends up holding exactly
// the sum of the excesses.
func testConcurrentAfterWindow(t *testing.T, b backend) {
	const n = 100
	limits := []Limit{tpm("tpm", "tenant=a", 100_000)}
	clock := newFakeClock(t0.Add(50 * time.Second))
	store := b.newStore(t, clock.Now)
	replicas := []Limiter{store(), store()}
	var reserved []Reservation
	for range n {
		res, err := replicas[0].Reserve(context.Background(), limits, req(3, 4))
		if err != nil || !res.Allowed {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		reserved = append(reserved, res.Reservation)
	}
	clock.SetOffset(70 * time.Second)
	var (
		wg     sync.WaitGroup
		excess int64
		start  = make(chan struct{})
		errs   = make(chan error, n)
	)
	for i, r := range reserved {
		excess += int64(i % 7)
		wg.Go(func() {
			<-start
			if err := replicas[i%2].Settle(context.Background(), r, req(3, 4+int64(i%7))); err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := remaining(t, replicas[1], limits); got[0] != 100_000-excess {
		t.Errorf("remaining in the window in force = %d, want %d (drift)", got[0], 100_000-excess)
	}
}

// testConcurrent races 200 reservations through two limiters (replicas):
// exactly floor(limit/cost) are admitted, and after every admitted one is
// settled the counter holds the sum of the actual costs.
func testConcurrent(t *testing.T, b backend) {
	const (
		goroutines = 200
		tokens     = 1000
	)
	cost := req(3, 4) // 7 tokens: 1000/7 = 142 admitted
	limits := []Limit{rpm("rpm", "tenant=a", 1000), tpm("tpm", "tenant=a", tokens)}
	clock := newFakeClock(t0.Add(10 * time.Second))
	store := b.newStore(t, clock.Now)
	replicas := []Limiter{store(), store()}

	var (
		denied   atomic.Int64
		wg       sync.WaitGroup
		start    = make(chan struct{})
		errs     = make(chan error, 2*goroutines)
		reserved = make([]*Reservation, goroutines)
	)
	for i := range goroutines {
		wg.Go(func() {
			<-start
			res, err := replicas[i%len(replicas)].Reserve(context.Background(), limits, cost)
			switch {
			case err != nil:
				errs <- err
			case res.Allowed:
				reserved[i] = &res.Reservation
			default:
				denied.Add(1)
				if res.Exceeded == nil || res.Exceeded.Name != "tpm" {
					errs <- fmt.Errorf("denied by %+v, want tpm", res.Exceeded)
				}
			}
		})
	}
	close(start)
	wg.Wait()

	// Settle every admitted request, concurrently, on the other replica.
	var admitted, actualSum int64
	for i, r := range reserved {
		if r == nil {
			continue
		}
		admitted++
		actual := req(3, int64(i%5)) // 3..7 tokens
		actualSum += actual.Of(TotalTokens)
		wg.Go(func() {
			if err := replicas[(i+1)%len(replicas)].Settle(context.Background(), *r, actual); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := int64(tokens / cost.Of(TotalTokens))
	if admitted != want || denied.Load() != goroutines-want {
		t.Fatalf("admitted %d, denied %d; want %d and %d", admitted, denied.Load(), want, goroutines-want)
	}
	got := remaining(t, replicas[0], limits)
	if wantRem := []int64{1000 - want, tokens - actualSum}; !reflect.DeepEqual(got, wantRem) {
		t.Errorf("remaining after settling = %v, want %v (drift)", got, wantRem)
	}
}

// testDebt settles usage far above what was reserved: the part past the
// limit is carried into the windows that follow, each filled up to the
// limit, the last of MaxDebtWindows taking the rest, so a budget exceeded
// many times over is paid back, not forgotten when its window ends.
func testDebt(t *testing.T, b backend) {
	ctx := context.Background()
	tpmK := tpm("tpm", "k", 1000)
	type settle struct {
		at     time.Duration // from t0
		i      int           // which reservation
		actual Cost
	}
	tests := []struct {
		name     string
		limits   []Limit
		reserves []Cost // at 5 s, in the first window
		edit     func(i int, r *Reservation)
		settles  []settle
		// remaining of limits[0] in window w (0: the first), once
		// everything settled; windows not named must be untouched.
		want map[int]int64
	}{
		{
			name: "twelve times the limit, paid back over eleven windows", limits: []Limit{tpmK},
			reserves: []Cost{req(100, 100)}, settles: []settle{{30 * time.Second, 0, req(100, 11900)}},
			want: map[int]int64{0: 0, 1: 0, 2: 0, 5: 0, 11: 0, 12: 1000},
		},
		{
			name: "debt fills each window up to the limit", limits: []Limit{tpmK},
			reserves: []Cost{req(0, 100), req(0, 100), req(0, 100)},
			settles: []settle{
				{30 * time.Second, 0, req(0, 900)},  // 1100: 100 to the next window
				{31 * time.Second, 1, req(0, 1100)}, // 2000 again: 900 fill the next, 100 the one after
				{32 * time.Second, 2, req(0, 50)},   // a refund stays in its window
			},
			want: map[int]int64{0: 50, 1: 0, 2: 900, 3: 1000},
		},
		{
			name: "the last window takes the rest", limits: []Limit{tpmK},
			reserves: []Cost{req(0, 100)}, settles: []settle{{30 * time.Second, 0, req(0, 40_000)}},
			want: map[int]int64{0: 0, MaxDebtWindows - 1: 0, MaxDebtWindows: 0, MaxDebtWindows + 1: 1000},
		},
		{
			name: "a charge carried from an ended window carries its debt", limits: []Limit{tpmK},
			reserves: []Cost{req(0, 100)}, settles: []settle{{70 * time.Second, 0, req(0, 2600)}},
			want: map[int]int64{0: 900, 1: 0, 2: 0, 3: 500, 4: 1000},
		},
		{
			name: "what was over before is not this charge's debt", limits: []Limit{tpmK},
			reserves: []Cost{req(0, 600), req(0, 400)},
			// The second as if reserved under a limit lowered to 500: the
			// counter stood 500 over it before its charge of 100.
			edit: func(i int, r *Reservation) {
				if i == 1 {
					r.Entries[0].Limit = 500
				}
			},
			settles: []settle{{31 * time.Second, 1, req(0, 500)}},
			want:    map[int]int64{0: 0, 1: 900, 2: 1000},
		},
		{
			name: "an entry without a limit carries none", limits: []Limit{tpmK},
			reserves: []Cost{req(100, 100)}, edit: func(_ int, r *Reservation) { r.Entries[0].Limit = 0 },
			settles: []settle{{30 * time.Second, 0, req(100, 11900)}},
			want:    map[int]int64{0: 0, 1: 1000},
		},
		{
			name: "limits sharing a counter: debt past the smallest",
			limits: []Limit{
				{Name: "a", Key: "k", Unit: OutputTokens, Amount: 1000, Window: time.Minute},
				{Name: "b", Key: "k", Unit: OutputTokens, Amount: 500, Window: time.Minute},
			},
			reserves: []Cost{req(0, 100)}, settles: []settle{{30 * time.Second, 0, req(0, 1200)}},
			want: map[int]int64{0: 500, 1: 500, 2: 800, 3: 1000}, // 1200: 500 kept, 500 and 200 carried
		},
		{
			name: "money past 2^53, exact", limits: []Limit{{Name: "m", Key: "k", Unit: Money, Amount: 3_000_000_000_000_000_007, Window: time.Minute}},
			reserves: []Cost{money(1_000_000_000_000_000_000)},
			settles:  []settle{{30 * time.Second, 0, money(7_000_000_000_000_000_123)}},
			// 4e18+116 over: the next window takes the limit, the one after 1e18+109
			want: map[int]int64{0: 0, 1: 0, 2: 1_999_999_999_999_999_898, 3: 3_000_000_000_000_000_007},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(5 * time.Second))
			l := b.newStore(t, clock.Now)()
			var rs []Reservation
			for i, c := range tc.reserves {
				res, err := l.Reserve(ctx, tc.limits, c)
				if err != nil || !res.Allowed {
					t.Fatalf("Reserve(%+v) = %+v, %v", c, res, err)
				}
				if tc.edit != nil {
					tc.edit(i, &res.Reservation)
				}
				rs = append(rs, res.Reservation)
			}
			for _, s := range tc.settles {
				clock.SetOffset(s.at)
				if err := l.Settle(ctx, rs[s.i], s.actual); err != nil {
					t.Fatalf("Settle: %v", err)
				}
			}
			for _, w := range slices.Sorted(maps.Keys(tc.want)) { // a window passed is gone
				want := tc.want[w]
				clock.SetOffset(time.Duration(w)*time.Minute + 59*time.Second)
				if got := remaining(t, l, tc.limits)[0]; got != want {
					t.Errorf("window %d: remaining = %d, want %d", w, got, want)
				}
			}
		})
	}
}
