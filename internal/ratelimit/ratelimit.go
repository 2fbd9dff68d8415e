// Package ratelimit enforces request and token budgets per fixed window.
//
// Token limits are charged at admission, not after the response: the gate
// Reserves the tokens a request may use (estimated prompt + max_tokens) and
// the meter Settles the reservation with the real usage when the stream
// ends, refunding or charging the difference. Concurrent streams therefore
// cannot overshoot a limit by more than their own reservations.
//
// # Semantics (every backend)
//
// Windows are fixed and aligned to multiples of Limit.Window since the Unix
// epoch (a one-minute window starts at every whole minute, UTC), taken
// from the limiter's Clock; a Window of Month is the calendar month, UTC
// (from 00:00 on the 1st to 00:00 on the 1st of the next month), as a
// month is no fixed duration. Each limit has one counter per window,
// identified by the limit's Key, Unit and Window and the window's start:
// <prefix>{<key>}:<unit>:<windowMs>:<windowStartUnixMs>, e.g.
// ig:rl:{tenant=acme}:total_tokens:60000:1700006400000 ("month" in place
// of windowMs for a calendar month's counter; on a Redis
// Cluster, one hash tag for all: ig:rl:{infergate}:tenant=acme:...).
// Limits with the same Key, Unit and Window share a counter, which a
// request charges once.
//
// Reserve admits a request only if, for every limit,
// used + cost.Of(limit.Unit) <= limit.Amount (compared exactly, without
// overflow); it then increments every counter by its cost. Otherwise it
// increments nothing, Result.Exceeded is the first limit (in the order
// given) that would have been exceeded, and RetryAfter is the time until
// that limit's window ends. Result has one State per limit, in order:
// Remaining is max(0, Amount - used) after the charge (or as found, when
// denied) and Reset the time until the window ends. Limits that cannot be
// enforced (window not a positive whole number of milliseconds, negative
// amount or cost, unknown unit) fail with ErrInvalid and charge nothing.
//
// A cost that no window could admit, larger than a limit's Amount or
// saturated at math.MaxInt64 (see Cost.Of and the callers' saturating
// worst cases), fails with a *TooLargeError (ErrTooLarge) before any
// counter is read: retrying it can never succeed, so it is not a denial
// with a RetryAfter. Every backend shares this check (validate).
//
// # Arithmetic
//
// Every counter stays within [0, math.MaxInt64] and never wraps: an
// admission keeps used + cost <= Amount, a settlement that would pass
// math.MaxInt64 leaves the counter at math.MaxInt64, saturated: it then
// stays so until its window ends, refunds included, since what it lost
// past math.MaxInt64 is unknown (an over-charge, never a forgotten
// charge). A settlement or release that would go below zero leaves it at
// zero.
//
// Settle adds actual.Of(unit) - Reserved to each entry's counter,
// saturating as above, while the counter's window is in force (it ends
// at Entry.ExpiresAt, by the settling limiter's clock) and the counter
// still exists: settling a window in force never creates a counter. A
// settlement that lands after its entry's window has ended (a stream
// longer than the rest of its window) is not dropped: the excess, if
// actual.Of(unit) > Reserved, is charged to the counter of the same limit
// key, unit and window length in the window in force when it lands,
// created if need be; a shortfall is refunded nowhere, since the ended
// window no longer gates anything (see settlePlan for why). A charge
// that takes a counter past its limit (Entry.Limit: usage above the
// reservation) is not forgotten when the window ends: the part over the
// limit is moved into the counters of the same limit in the windows that
// follow, as debt, filling each up to the limit, over at most
// MaxDebtWindows windows (the last takes what is left). Requests
// entries are never changed: an admitted request counts as one whatever
// actual.Requests says. Settle must be called once per admitted
// reservation (there is no deduplication: settling twice applies the
// difference twice); denied results have nothing to settle. Any replica
// may settle any reservation of a shared backend (Redis); see Fallback for
// local reservations.
//
// Release is for a reservation whose request never reached a pool (it was
// denied after Reserve, e.g. by an external check): every counter whose
// window is in force gives back what the entry reserved, requests
// included, never below zero; ended windows are left alone. A reservation
// is either settled or released, once.
//
// # Backends
//
// Memory keeps counters in the process; Redis shares them between
// replicas through one atomic Lua script per call, on one server or on a
// Redis Cluster (where every counter carries one hash tag, so that no
// script ever spans two slots: see RedisOptions.HashTag); WithFallback
// chooses between failing closed and limiting locally while Redis is down
// (or, on a cluster, while the primary holding the counters fails over).
//
// # Metrics
//
// The backends emit no metrics and log nothing. Callers instrument around
// the Limiter interface, which has everything needed: the Cost passed to
// Reserve and the actual Cost passed to Settle (reserved and settled
// tokens), Result.Allowed and Result.Exceeded (denials per limit name),
// errors.Is(err, ErrUnavailable) (backend errors), and the onError
// callback of WithFallback (every primary failure, including those hidden
// by FailLocal; Fallback.Healthy tells whether Redis is in use).
package ratelimit

import (
	"context"
	"errors"
	"math"
	"time"
)

// Unit is what a limit counts.
type Unit string

// Units a limit can count.
const (
	Requests     Unit = "requests"
	InputTokens  Unit = "input_tokens"
	OutputTokens Unit = "output_tokens"
	TotalTokens  Unit = "total_tokens"
	// Money counts the cost of requests in pico-units (10⁻¹²) of the
	// prices' currency (internal/price): tokens × a price per million
	// tokens in micro-units is exact in pico-units, so reserving and
	// settling never round. An int64 counter holds 9.2 million units of
	// the currency per window.
	Money Unit = "money"
)

// Month, as a Limit's Window, is the calendar month, UTC. It is no
// duration (a month lasts 28 to 31 days): only the limiters read it.
const Month time.Duration = -1

// WindowName is w as a policy writes it: "month" for Month, else its
// duration ("1m0s").
func WindowName(w time.Duration) string {
	if w == Month {
		return "month"
	}
	return w.String()
}

// Limit is one budget that applies to a request, as a policy states it.
type Limit struct {
	// Name labels the limit in headers, metrics and errors, e.g. "tenant-tokens".
	Name string
	// Key identifies the budget: requests with the same Key and Unit share it
	// (e.g. "tenant=acme/model=llama-3"). Built by the policy.
	Key    string
	Unit   Unit
	Amount int64         // allowed per window
	Window time.Duration // fixed window, aligned to multiples of Window since the Unix epoch
}

// Cost is what one request is charged: up front (the reservation) or in
// the end (the real usage).
type Cost struct {
	Requests     int64
	InputTokens  int64
	OutputTokens int64
	Money        int64 // pico-units of the currency; see the Money unit
}

// Of returns the part of the cost a unit counts.
func (c Cost) Of(u Unit) int64 {
	switch u {
	case Requests:
		return c.Requests
	case InputTokens:
		return c.InputTokens
	case OutputTokens:
		return c.OutputTokens
	case TotalTokens:
		// Saturates rather than wraps: a total past int64 is a cost no
		// limit admits (ErrTooLarge), never a small or negative one.
		if c.InputTokens > 0 && c.OutputTokens > math.MaxInt64-c.InputTokens {
			return math.MaxInt64
		}
		return c.InputTokens + c.OutputTokens
	case Money:
		return c.Money
	}
	return 0
}

// Reservation records what was charged where, so that any replica can
// settle it later: it is plain data, serialisable to JSON.
type Reservation struct {
	Entries []Entry `json:"e"`
}

// Entry is one charged counter.
type Entry struct {
	Counter  string `json:"k"` // backend counter id: the limit's key, unit and window start
	Unit     Unit   `json:"u"`
	Reserved int64  `json:"r"`
	// ExpiresAt is when the counter's window ends (Unix ms); settling after
	// that charges any excess to the limit's counter in the window then in
	// force, and refunds nothing.
	ExpiresAt int64 `json:"x"`
	// Limit is the limit's Amount (the smallest, for limits sharing the
	// counter): a settlement that takes the counter past it carries the
	// part over into the following windows as debt (see settlePlan). 0
	// carries none.
	Limit int64 `json:"l,omitempty"`
}

// State is one limit's standing after a decision, for x-ratelimit-* headers.
type State struct {
	Limit     Limit
	Remaining int64         // never negative
	Reset     time.Duration // until the window ends
}

// Result is the outcome of Reserve.
type Result struct {
	Allowed     bool
	Reservation Reservation // empty when denied
	States      []State     // one per limit, in the order given
	// When denied: the first limit that would have been exceeded, and how
	// long until its window resets.
	Exceeded   *Limit
	RetryAfter time.Duration
}

// Limiter is the narrow interface both backends implement.
type Limiter interface {
	// Reserve charges cost against every limit atomically: either all
	// counters are incremented or none is (the request is denied).
	Reserve(ctx context.Context, limits []Limit, cost Cost) (Result, error)
	// Settle replaces a reservation's charges with the actual cost.
	Settle(ctx context.Context, r Reservation, actual Cost) error
	// Release gives a reservation back whole, requests included: for a
	// request denied after its reservation, which never reached a pool.
	Release(ctx context.Context, r Reservation) error
}

// ErrUnavailable wraps backend failures (e.g. Redis down).
var ErrUnavailable = errors.New("rate limit backend unavailable")

// Clock is injected so tests control windows.
type Clock func() time.Time
