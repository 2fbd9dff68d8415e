package seal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Once lets each seal be used once: Claim reports true the first time a
// seal's id is claimed before it expires, false after (a replay). Issue
// records a seal just made for a tenant as outstanding: both stores keep
// the seals issued and not yet claimed, so what they hold is bounded by
// the requests in flight, not by the request rate, and they hold each
// tenant to its share of them (a tenant that leaks seals fills its own
// share, never another's). A seal whose Issue failed is never claimed.
//
// Claim is idempotent per claimant: a claim repeated by the claimant that
// made it (a retry after its reply was lost) reports true again, any
// other claimant's false. It fails closed: a claim it cannot record (the
// store unreachable) is an error, ErrUncertain once the store's retries
// are spent, and what the seal was for is not done (a reservation stays
// charged: over-, never under-charged).
//
// The tenant a Claim names is the one sealed with the seal (read from a
// seal that verified), the one its Issue named.
type Once interface {
	Issue(ctx context.Context, p Purpose, tenant, id string, expires time.Time) error
	Claim(ctx context.Context, p Purpose, tenant, id, claimant string, expires time.Time) (bool, error)
}

var (
	// ErrTenantFull: the tenant holds as many outstanding seals as its
	// share allows; its new requests are refused until some settle or
	// expire. No other tenant is touched.
	ErrTenantFull = errors.New("the tenant's share of settle-once records is full")
	// ErrFull: a MemoryOnce holds as many outstanding seals as it may in
	// all (the last-resort bound on its memory).
	ErrFull = errors.New("settle-once records are full")
	// ErrUncertain: the store did not answer within the retries' bounds;
	// whether the write landed is unknown.
	ErrUncertain = errors.New("settle-once store did not answer")
)

// Bounds by default: DefaultMaxOutstanding seals in all in one process's
// memory (about 100 MiB at most), and each tenant DefaultTenantShare of
// them, a sixteenth (two seals per request: 32,768 requests in flight or
// lost on the way within a seal's life).
const (
	DefaultMaxOutstanding = 1 << 20
	DefaultTenantShare    = DefaultMaxOutstanding / 16
)

// NewClaimant returns a fresh claimant token: one per claim, reused by its
// retries.
func NewClaimant() string { return newID() }

// MemoryOnce is a Once of one process (the seals it verifies are its own):
// it keeps the seals issued and not yet claimed, each until it expires, at
// most PerTenant of one tenant and Max in all, so what it holds is bounded
// by the requests in flight (and those lost on the way), not by the
// request rate. A claim of a seal it did not issue, or claimed before, is
// refused. Its claims cannot be lost on the way back (no I/O), so it keeps
// no claimant: a claim it answered is never retried.
type MemoryOnce struct {
	Max       int // 0: DefaultMaxOutstanding
	PerTenant int // 0: DefaultTenantShare
	Now       func() time.Time

	mu       sync.Mutex
	n        int
	tenants  map[string]int              // outstanding seals per tenant
	byMinute map[int64]map[string]string // by the minute the seal expires in: key → tenant
	oldest   int64                       // no bucket before this minute
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// Issue implements Once.
func (m *MemoryOnce) Issue(_ context.Context, p Purpose, tenant, id string, expires time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge(m.Now())
	b := minuteOf(expires)
	key := string(p) + ":" + id
	if _, ok := m.byMinute[b][key]; ok {
		return nil
	}
	switch {
	case m.tenants[tenant] >= cmpOr(m.PerTenant, DefaultTenantShare):
		return ErrTenantFull
	case m.n >= cmpOr(m.Max, DefaultMaxOutstanding):
		return ErrFull
	}
	if m.byMinute == nil {
		m.byMinute, m.tenants = map[int64]map[string]string{}, map[string]int{}
		m.oldest = b
	}
	set := m.byMinute[b]
	if set == nil {
		set = map[string]string{}
		m.byMinute[b] = set
	}
	set[key] = tenant
	m.n++
	m.tenants[tenant]++
	m.oldest = min(m.oldest, b)
	return nil
}

func cmpOr(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// Claim implements Once.
func (m *MemoryOnce) Claim(_ context.Context, p Purpose, _, id, _ string, expires time.Time) (bool, error) {
	now := m.Now()
	if !now.Before(expires) {
		return false, ErrExpired
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge(now)
	set := m.byMinute[minuteOf(expires)]
	key := string(p) + ":" + id
	tenant, ok := set[key]
	if !ok {
		return false, nil
	}
	delete(set, key)
	m.n--
	m.drop(tenant, 1)
	return true, nil
}

// Outstanding is how many seals tenant holds.
func (m *MemoryOnce) Outstanding(tenant string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge(m.Now())
	return m.tenants[tenant]
}

// drop forgets k of tenant's seals (m.mu held).
func (m *MemoryOnce) drop(tenant string, k int) {
	if m.tenants[tenant] -= k; m.tenants[tenant] <= 0 {
		delete(m.tenants, tenant)
	}
}

// purge drops the seals of the minutes that have ended (m.mu held).
func (m *MemoryOnce) purge(now time.Time) {
	cur := minuteOf(now)
	for ; m.oldest < cur && m.n > 0; m.oldest++ {
		for _, tenant := range m.byMinute[m.oldest] {
			m.drop(tenant, 1)
		}
		m.n -= len(m.byMinute[m.oldest])
		delete(m.byMinute, m.oldest)
	}
	if m.n == 0 {
		clear(m.byMinute)
		clear(m.tenants)
		m.oldest = cur
	}
}

// Retry bounds the attempts of a write to a store whose reply may be lost
// (a read timeout): Attempts tries, each within PerAttempt, all within
// Total (and the caller's deadline). Only idempotent writes are retried:
// an Issue (the same seal recorded again is one seal) and a Claim under
// one claimant (its own claim reads true again).
type Retry struct {
	Attempts   int
	PerAttempt time.Duration
	Total      time.Duration
}

// DefaultRetry: three tries of at most a second each, within 1.5 s (the
// meter gives a claim 2 s). The client's own read timeout
// (ratelimit.redis.timeout, 250 ms by default) usually ends a try first.
var DefaultRetry = Retry{Attempts: 3, PerAttempt: time.Second, Total: 1500 * time.Millisecond}

// do runs try until it answers, at most r.Attempts times within the
// bounds; the error of the last try, wrapped in ErrUncertain, if none did.
// An answer of the store (redisAnswer) is not retried.
func (r Retry) do(ctx context.Context, try func(ctx context.Context) error) error {
	if r.Attempts <= 0 {
		r = DefaultRetry
	}
	ctx, cancel := context.WithTimeout(ctx, r.Total)
	defer cancel()
	var err error
	for range r.Attempts {
		actx, acancel := context.WithTimeout(ctx, r.PerAttempt)
		err = try(actx)
		acancel()
		if err == nil || isAnswer(err) {
			return err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w: %w", ErrUncertain, err)
}
