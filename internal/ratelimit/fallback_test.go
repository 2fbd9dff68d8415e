package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// flaky is a primary that fails with err while set, else delegates to a
// Memory.
type flaky struct {
	inner                       *Memory
	err                         atomic.Pointer[error]
	reserves, settles, releases atomic.Int64
}

func newFlaky(clock Clock) *flaky { return &flaky{inner: NewMemory(clock)} }

func (f *flaky) fail(err error) {
	if err == nil {
		f.err.Store(nil)
		return
	}
	f.err.Store(&err)
}

func (f *flaky) Reserve(ctx context.Context, limits []Limit, cost Cost) (Result, error) {
	f.reserves.Add(1)
	if p := f.err.Load(); p != nil {
		return Result{}, *p
	}
	return f.inner.Reserve(ctx, limits, cost)
}

func (f *flaky) Settle(ctx context.Context, r Reservation, actual Cost) error {
	f.settles.Add(1)
	if p := f.err.Load(); p != nil {
		return *p
	}
	return f.inner.Settle(ctx, r, actual)
}

func (f *flaky) Release(ctx context.Context, r Reservation) error {
	f.releases.Add(1)
	if p := f.err.Load(); p != nil {
		return *p
	}
	return f.inner.Release(ctx, r)
}

var errDown = fmt.Errorf("%w: connection refused", ErrUnavailable)

func isLocal(r Reservation) bool {
	for _, e := range r.Entries {
		if !strings.HasPrefix(e.Counter, LocalCounterPrefix) {
			return false
		}
	}
	return len(r.Entries) > 0
}

func TestFallbackModes(t *testing.T) {
	errInvalid := fmt.Errorf("%w: bad window", ErrInvalid)
	tests := []struct {
		name        string
		mode        FailureMode
		primaryErr  error
		wantErr     error // nil: admitted
		wantLocal   bool
		wantOnError int
		wantHealthy bool
	}{
		{name: "healthy closed", mode: FailClosed, wantHealthy: true},
		{name: "healthy local", mode: FailLocal, wantHealthy: true},
		{name: "closed: down", mode: FailClosed, primaryErr: errDown, wantErr: ErrUnavailable, wantOnError: 1},
		{name: "local: down", mode: FailLocal, primaryErr: errDown, wantLocal: true, wantOnError: 1},
		{name: "closed: invalid is not a failure", mode: FailClosed, primaryErr: errInvalid, wantErr: ErrInvalid, wantHealthy: true},
		{name: "local: invalid is not a failure", mode: FailLocal, primaryErr: errInvalid, wantErr: ErrInvalid, wantHealthy: true},
		{name: "local: cancelled is not a failure", mode: FailLocal, primaryErr: context.Canceled, wantErr: context.Canceled, wantHealthy: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			p := newFlaky(clock.Now)
			p.fail(tc.primaryErr)
			var onError []error
			f := WithFallback(p, tc.mode, NewMemory(clock.Now), func(err error) { onError = append(onError, err) }).(*Fallback)
			f.clock = clock.Now
			res, err := f.Reserve(context.Background(), []Limit{rpm("rpm", "k", 5)}, req(0, 0))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Reserve error = %v, want %v", err, tc.wantErr)
				}
			} else if err != nil || !res.Allowed {
				t.Fatalf("Reserve = %+v, %v; want admitted", res, err)
			}
			if got := isLocal(res.Reservation); got != tc.wantLocal {
				t.Errorf("local reservation = %v, want %v (%+v)", got, tc.wantLocal, res.Reservation)
			}
			if len(onError) != tc.wantOnError {
				t.Errorf("onError called %d times (%v), want %d", len(onError), onError, tc.wantOnError)
			}
			if f.Healthy() != tc.wantHealthy {
				t.Errorf("Healthy = %v, want %v", f.Healthy(), tc.wantHealthy)
			}
		})
	}
}

// A failing primary is probed once per RetryEvery, by one caller, and used
// again as soon as a probe succeeds.
func TestFallbackRetryPacing(t *testing.T) {
	for _, mode := range []FailureMode{FailClosed, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := newFakeClock(t0)
			p := newFlaky(clock.Now)
			var onError atomic.Int64
			f := NewFallback(p, FallbackOptions{
				Mode:       mode,
				OnError:    func(error) { onError.Add(1) },
				Clock:      clock.Now,
				RetryEvery: 2 * time.Second,
			})
			limits := []Limit{rpm("rpm", "k", 1000)}
			reserve := func() (Result, error) { return f.Reserve(context.Background(), limits, req(0, 0)) }
			check := func(what string, wantCalls, wantOnError int64, wantPrimary bool) {
				t.Helper()
				res, err := reserve()
				if got := p.reserves.Load(); got != wantCalls {
					t.Errorf("%s: primary called %d times, want %d", what, got, wantCalls)
				}
				if got := onError.Load(); got != wantOnError {
					t.Errorf("%s: onError called %d times, want %d", what, got, wantOnError)
				}
				switch {
				case wantPrimary:
					if err != nil || isLocal(res.Reservation) {
						t.Errorf("%s: Reserve = %+v, %v; want the primary's answer", what, res, err)
					}
				case mode == FailClosed:
					if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errDown) {
						t.Errorf("%s: Reserve error = %v, want ErrUnavailable carrying the primary's error", what, err)
					}
				default:
					if err != nil || !isLocal(res.Reservation) {
						t.Errorf("%s: Reserve = %+v, %v; want a local reservation", what, res, err)
					}
				}
			}

			check("healthy", 1, 0, true)
			p.fail(errDown)
			check("first failure", 2, 1, false)
			check("within the backoff", 2, 1, false)
			clock.Advance(2*time.Second - time.Nanosecond)
			check("just before the retry", 2, 1, false)
			clock.Advance(time.Nanosecond)
			check("retry, still down", 3, 2, false)
			check("backoff again", 3, 2, false)

			// When the retry is due, exactly one of many concurrent calls
			// probes the primary.
			clock.Advance(2 * time.Second)
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() { _, _ = reserve() })
			}
			wg.Wait()
			if got := p.reserves.Load(); got != 4 {
				t.Errorf("concurrent calls probed the primary %d times, want 1", got-3)
			}

			p.fail(nil)
			check("recovered, backoff not over", 4, 3, false)
			clock.Advance(2 * time.Second)
			check("probe succeeds", 5, 3, true)
			if !f.Healthy() {
				t.Error("not healthy after a successful probe")
			}
			check("healthy again", 6, 3, true)
		})
	}
}

// Local reservations are settled locally, the others on the primary,
// which is skipped while it is backing off.
func TestFallbackSettleRouting(t *testing.T) {
	clock := newFakeClock(t0)
	p := newFlaky(clock.Now)
	local := NewMemory(clock.Now)
	var onError atomic.Int64
	f := NewFallback(p, FallbackOptions{Mode: FailLocal, Local: local, Clock: clock.Now, OnError: func(error) { onError.Add(1) }})
	ctx := context.Background()
	limits := []Limit{tpm("tpm", "k", 100)}

	prim, err := f.Reserve(ctx, limits, req(10, 10))
	if err != nil || isLocal(prim.Reservation) {
		t.Fatalf("Reserve = %+v, %v", prim, err)
	}
	p.fail(errDown)
	loc, err := f.Reserve(ctx, limits, req(10, 10))
	if err != nil || !isLocal(loc.Reservation) {
		t.Fatalf("Reserve = %+v, %v; want local", loc, err)
	}

	// The primary is backing off: its entries are not sent.
	if err := f.Settle(ctx, prim.Reservation, req(10, 0)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Settle on a failing primary = %v, want ErrUnavailable", err)
	}
	if p.settles.Load() != 0 {
		t.Errorf("primary Settle called %d times while backing off", p.settles.Load())
	}
	// Local entries settle on the local limiter, whatever the primary does.
	if err := f.Settle(ctx, loc.Reservation, req(10, 5)); err != nil {
		t.Errorf("Settle local: %v", err)
	}
	if got := remaining(t, local, limits); got[0] != 85 {
		t.Errorf("local remaining = %d, want 85", got[0])
	}

	p.fail(nil)
	clock.Advance(DefaultRetryEvery)
	if err := f.Settle(ctx, prim.Reservation, req(10, 0)); err != nil {
		t.Errorf("Settle after recovery: %v", err)
	}
	if !f.Healthy() {
		t.Error("a successful Settle did not mark the primary healthy")
	}
	if got := remaining(t, p.inner, limits); got[0] != 90 {
		t.Errorf("primary remaining = %d, want 90", got[0])
	}
	if onError.Load() != 1 {
		t.Errorf("onError called %d times, want 1", onError.Load())
	}
}

// Releases are routed as settlements are.
func TestFallbackReleaseRouting(t *testing.T) {
	clock := newFakeClock(t0)
	p := newFlaky(clock.Now)
	local := NewMemory(clock.Now)
	f := NewFallback(p, FallbackOptions{Mode: FailLocal, Local: local, Clock: clock.Now})
	ctx := context.Background()
	limits := []Limit{rpm("rpm", "k", 10), tpm("tpm", "k", 100)}

	prim, err := f.Reserve(ctx, limits, req(10, 10))
	if err != nil || isLocal(prim.Reservation) {
		t.Fatalf("Reserve = %+v, %v", prim, err)
	}
	p.fail(errDown)
	loc, err := f.Reserve(ctx, limits, req(10, 10))
	if err != nil || !isLocal(loc.Reservation) {
		t.Fatalf("Reserve = %+v, %v; want local", loc, err)
	}
	if err := f.Release(ctx, prim.Reservation); !errors.Is(err, ErrUnavailable) || p.releases.Load() != 0 {
		t.Errorf("Release on a primary backing off = %v after %d calls; want ErrUnavailable, none", err, p.releases.Load())
	}
	if err := f.Release(ctx, loc.Reservation); err != nil {
		t.Errorf("Release local: %v", err)
	}
	if got, want := remaining(t, local, limits), []int64{10, 100}; !reflect.DeepEqual(got, want) {
		t.Errorf("local remaining = %v, want %v", got, want)
	}
	p.fail(nil)
	clock.Advance(DefaultRetryEvery)
	if err := f.Release(ctx, prim.Reservation); err != nil || !f.Healthy() {
		t.Errorf("Release after recovery = %v (healthy %v)", err, f.Healthy())
	}
	if got, want := remaining(t, p.inner, limits), []int64{10, 100}; !reflect.DeepEqual(got, want) {
		t.Errorf("primary remaining = %v, want %v", got, want)
	}
}

// TestFallbackRedisOutage kills Redis under a Fallback and brings it back.
func TestFallbackRedisOutage(t *testing.T) {
	for _, mode := range []FailureMode{FailClosed, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			srv := startRedis(t)
			clock := newFakeClock(t0)
			rdb := newRedisClient(t, srv.Addr(), true)
			trips := roundTrips(rdb)
			primary := NewRedis(rdb, clock.Now, RedisOptions{})
			var mu sync.Mutex
			var failures []error
			f := NewFallback(primary, FallbackOptions{
				Mode:    mode,
				Clock:   clock.Now,
				OnError: func(err error) { mu.Lock(); failures = append(failures, err); mu.Unlock() },
			})
			ctx := context.Background()
			limits := []Limit{rpm("rpm", "tenant=a", 3), tpm("tpm", "tenant=a", 1000)}
			// With Redis down each Reserve asks it once at most: it fails
			// fast, never loops on a Redis that is down.
			down := false
			reserve := func() (Result, error) {
				before := trips.Load()
				res, err := f.Reserve(ctx, limits, req(10, 10))
				if n := trips.Load() - before; down && n > 1 {
					t.Errorf("Reserve with Redis down sent %d round trips", n)
				}
				return res, err
			}

			res, err := reserve()
			if err != nil || !res.Allowed || isLocal(res.Reservation) {
				t.Fatalf("Reserve with Redis up = %+v, %v", res, err)
			}
			beforeOutage := res.Reservation

			srv.Stop()
			down = true
			res, err = reserve()
			switch mode {
			case FailClosed:
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Reserve with Redis down = %+v, %v; want ErrUnavailable", res, err)
				}
				for range 3 {
					if _, err := reserve(); !errors.Is(err, ErrUnavailable) {
						t.Fatalf("Reserve with Redis down = %v; want ErrUnavailable", err)
					}
				}
			case FailLocal:
				// Local limits start from zero: three requests, then denied.
				var local []Reservation
				for i := range 4 {
					if i > 0 {
						res, err = reserve()
					}
					if err != nil {
						t.Fatalf("Reserve %d with Redis down: %v", i, err)
					}
					if want := i < 3; res.Allowed != want {
						t.Fatalf("Reserve %d with Redis down: Allowed = %v, want %v", i, res.Allowed, want)
					}
					if res.Allowed {
						if !isLocal(res.Reservation) {
							t.Fatalf("Reserve %d with Redis down: reservation %+v is not local", i, res.Reservation)
						}
						local = append(local, res.Reservation)
					}
				}
				for _, r := range local {
					if err := f.Settle(ctx, r, req(10, 0)); err != nil {
						t.Errorf("Settle local reservation: %v", err)
					}
				}
			}
			if err := f.Settle(ctx, beforeOutage, req(10, 0)); !errors.Is(err, ErrUnavailable) {
				t.Errorf("Settle on Redis down = %v, want ErrUnavailable", err)
			}
			mu.Lock()
			if len(failures) != 1 || !errors.Is(failures[0], ErrUnavailable) {
				t.Errorf("onError got %v, want one ErrUnavailable (the primary is not retried within a second)", failures)
			}
			mu.Unlock()

			srv.Restart()
			down = false
			clock.Advance(DefaultRetryEvery)
			res, err = reserve()
			if err != nil || !res.Allowed || isLocal(res.Reservation) {
				t.Fatalf("Reserve after restart = %+v, %v; want admitted by Redis", res, err)
			}
			// The restarted Redis is empty: this is its first request.
			if got := res.States[0].Remaining; got != 2 {
				t.Errorf("remaining after restart = %d, want 2", got)
			}
			if err := f.Settle(ctx, res.Reservation, req(10, 5)); err != nil {
				t.Errorf("Settle after restart: %v", err)
			}
			if got := remaining(t, primary, limits); got[1] != 985 {
				t.Errorf("tokens remaining in Redis = %d, want 985", got[1])
			}
		})
	}
}
