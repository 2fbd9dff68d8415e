package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// FailureMode is what WithFallback does while the primary limiter fails.
type FailureMode int

const (
	// FailClosed returns the failure (wrapping ErrUnavailable) from
	// Reserve: the caller refuses the request (503).
	FailClosed FailureMode = iota
	// FailLocal enforces the same limits with the local in-memory limiter,
	// per replica, until the primary answers again.
	FailLocal
)

// String returns "fail_closed" or "fail_local".
func (m FailureMode) String() string {
	switch m {
	case FailClosed:
		return "fail_closed"
	case FailLocal:
		return "fail_local"
	}
	return "FailureMode(" + fmt.Sprint(int(m)) + ")"
}

// LocalCounterPrefix marks the entries of reservations the local limiter
// made, so that Fallback.Settle routes them back to it.
const LocalCounterPrefix = "local:"

// DefaultRetryEvery is how often a failing primary is retried by default.
const DefaultRetryEvery = time.Second

// FallbackOptions configures NewFallback.
type FallbackOptions struct {
	Mode FailureMode
	// Local is the limiter used in FailLocal mode; nil means a new
	// NewMemory(Clock).
	Local Limiter
	// OnError, if set, is called with every error of the primary that
	// wraps ErrUnavailable (for the caller's log and metrics). It must be
	// safe for concurrent use and must not block.
	OnError func(error)
	// Clock paces the retries; nil means time.Now.
	Clock Clock
	// RetryEvery is how long the primary is left alone after a failure
	// (default DefaultRetryEvery). After that one call probes it; the
	// others keep failing fast (FailClosed) or going local (FailLocal)
	// until the probe succeeds.
	RetryEvery time.Duration
}

// Fallback is a Limiter that uses a primary limiter (Redis) and, when it
// fails with ErrUnavailable, either fails closed or falls back to a local
// limiter. It is safe for concurrent use.
//
// While the primary is failing it is called at most once per RetryEvery
// (so a dead Redis is not hammered at the request rate); calls in between
// do not touch it: FailClosed returns an error wrapping ErrUnavailable at
// once, FailLocal uses the local limiter. The first successful call makes
// the primary the limiter again. Errors that do not wrap ErrUnavailable
// (ErrInvalid, a cancelled ctx) are returned as they are and do not count
// as primary failures.
//
// Reservations made locally have their counters prefixed with
// LocalCounterPrefix and are settled on the local limiter. As local
// counters live in one process, a local reservation must be settled by the
// replica that made it; settling it elsewhere is a no-op.
//
// Budgets during an outage: local counters start at zero, so in FailLocal
// each replica admits up to the full limits on its own, and usage charged
// during the outage is not carried back to the primary. Settlements of
// primary reservations that fail are lost (the error is returned and
// passed to OnError), and so are releases.
type Fallback struct {
	primary Limiter
	local   Limiter
	mode    FailureMode
	onError func(error)
	clock   Clock
	every   time.Duration

	// retryAt is 0 while the primary is healthy; otherwise the Unix ns
	// at which it may be tried again.
	retryAt atomic.Int64
	lastErr atomic.Pointer[error]
}

// WithFallback wraps primary with the failure mode: FailClosed or FailLocal
// with local (nil: a new in-memory limiter). onError (optional) receives
// every primary failure. The primary is retried at most every
// DefaultRetryEvery while it fails; use NewFallback to change that or the
// clock.
func WithFallback(primary Limiter, mode FailureMode, local Limiter, onError func(error)) Limiter {
	return NewFallback(primary, FallbackOptions{Mode: mode, Local: local, OnError: onError})
}

// NewFallback is WithFallback with all options.
func NewFallback(primary Limiter, opts FallbackOptions) *Fallback {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.RetryEvery <= 0 {
		opts.RetryEvery = DefaultRetryEvery
	}
	if opts.Mode == FailLocal && opts.Local == nil {
		opts.Local = NewMemory(opts.Clock)
	}
	return &Fallback{
		primary: primary,
		local:   opts.Local,
		mode:    opts.Mode,
		onError: opts.OnError,
		clock:   opts.Clock,
		every:   opts.RetryEvery,
	}
}

// Healthy reports whether the primary is in use (its last call succeeded
// or it has not failed yet).
func (f *Fallback) Healthy() bool { return f.retryAt.Load() == 0 }

// Reserve implements Limiter.
func (f *Fallback) Reserve(ctx context.Context, limits []Limit, cost Cost) (Result, error) {
	var err error
	if f.mayCallPrimary() {
		var res Result
		res, err = f.primary.Reserve(ctx, limits, cost)
		if !f.failed(err) {
			return res, err
		}
	} else {
		err = f.skippedErr()
	}
	if f.mode != FailLocal {
		return Result{}, err
	}
	res, lerr := f.local.Reserve(ctx, limits, cost)
	if lerr != nil {
		return Result{}, lerr
	}
	for i := range res.Reservation.Entries {
		res.Reservation.Entries[i].Counter = LocalCounterPrefix + res.Reservation.Entries[i].Counter
	}
	return res, nil
}

// Settle implements Limiter: local entries go to the local limiter, the
// others to the primary (unless it is failing and not due for a retry).
func (f *Fallback) Settle(ctx context.Context, r Reservation, actual Cost) error {
	return f.route(r, func(l Limiter, r Reservation) error { return l.Settle(ctx, r, actual) })
}

// Release implements Limiter, routing entries as Settle does.
func (f *Fallback) Release(ctx context.Context, r Reservation) error {
	return f.route(r, func(l Limiter, r Reservation) error { return l.Release(ctx, r) })
}

// route calls do with the local entries of r on the local limiter and with
// the others on the primary (unless it is failing and not due for a retry).
func (f *Fallback) route(r Reservation, do func(Limiter, Reservation) error) error {
	var prim, local []Entry
	for _, e := range r.Entries {
		if c, ok := strings.CutPrefix(e.Counter, LocalCounterPrefix); ok {
			e.Counter = c
			local = append(local, e)
		} else {
			prim = append(prim, e)
		}
	}
	var errs []error
	if len(local) > 0 && f.local != nil {
		errs = append(errs, do(f.local, Reservation{Entries: local}))
	}
	if len(prim) > 0 {
		if f.mayCallPrimary() {
			err := do(f.primary, Reservation{Entries: prim})
			f.failed(err)
			errs = append(errs, err)
		} else {
			errs = append(errs, f.skippedErr())
		}
	}
	return errors.Join(errs...)
}

// mayCallPrimary reports whether this call may use the primary: it is
// healthy, or it is failing and this call won the retry that is due.
func (f *Fallback) mayCallPrimary() bool {
	at := f.retryAt.Load()
	if at == 0 {
		return true
	}
	now := f.clock().UnixNano()
	return now >= at && f.retryAt.CompareAndSwap(at, now+int64(f.every))
}

// failed records the outcome of a primary call and reports whether it
// failed with ErrUnavailable.
func (f *Fallback) failed(err error) bool {
	if err == nil {
		f.retryAt.Store(0)
		return false
	}
	if !errors.Is(err, ErrUnavailable) {
		return false
	}
	f.lastErr.Store(&err)
	f.retryAt.Store(f.clock().UnixNano() + int64(f.every))
	if f.onError != nil {
		f.onError(err)
	}
	return true
}

// skippedErr is returned instead of calling a primary that is failing.
func (f *Fallback) skippedErr() error {
	if p := f.lastErr.Load(); p != nil {
		return fmt.Errorf("%w (primary not retried yet; last error: %w)", ErrUnavailable, *p)
	}
	return ErrUnavailable
}
