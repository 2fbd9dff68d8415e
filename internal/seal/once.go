package seal

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Once lets each seal be used once: Claim reports true the first time a
// seal's id is claimed before it expires, false after (a replay). It fails
// closed: a claim it cannot record (a store unreachable, full) is refused
// with an error, and what the seal was for is not done (a reservation
// stays charged: over-, never under-charged). Issue records a seal just
// made as outstanding: both stores keep the seals issued and not yet
// claimed, so what they hold is bounded by the requests in flight, not by
// the request rate. A seal whose Issue failed is never claimed.
type Once interface {
	Issue(ctx context.Context, p Purpose, id string, expires time.Time) error
	Claim(ctx context.Context, p Purpose, id string, expires time.Time) (bool, error)
}

// ErrFull: a MemoryOnce holds as many outstanding seals as it may.
var ErrFull = errors.New("settle-once records are full")

// MemoryOnce is a Once of one process (the seals it verifies are its own):
// it keeps the seals issued and not yet claimed, at most Max, each until
// it expires, so what it holds is bounded by the requests in flight (and
// those lost on the way), not by the request rate. A claim of a seal it
// did not issue, or claimed before, is refused; so is one issued while it
// was full (that reservation stays charged).
type MemoryOnce struct {
	Max int
	Now func() time.Time

	mu       sync.Mutex
	n        int
	byMinute map[int64]map[string]struct{} // by the minute the seal expires in
	oldest   int64                         // no bucket before this minute
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// Issue implements Once.
func (m *MemoryOnce) Issue(_ context.Context, p Purpose, id string, expires time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge(m.Now())
	if m.n >= m.Max {
		return ErrFull
	}
	b := minuteOf(expires)
	if m.byMinute == nil {
		m.byMinute = map[int64]map[string]struct{}{}
		m.oldest = b
	}
	set := m.byMinute[b]
	if set == nil {
		set = map[string]struct{}{}
		m.byMinute[b] = set
	}
	key := string(p) + ":" + id
	if _, ok := set[key]; !ok {
		set[key] = struct{}{}
		m.n++
	}
	m.oldest = min(m.oldest, b)
	return nil
}

// Claim implements Once.
func (m *MemoryOnce) Claim(_ context.Context, p Purpose, id string, expires time.Time) (bool, error) {
	now := m.Now()
	if !now.Before(expires) {
		return false, ErrExpired
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge(now)
	set := m.byMinute[minuteOf(expires)]
	key := string(p) + ":" + id
	if _, ok := set[key]; !ok {
		return false, nil
	}
	delete(set, key)
	m.n--
	return true, nil
}

// purge drops the seals of the minutes that have ended (m.mu held).
func (m *MemoryOnce) purge(now time.Time) {
	cur := minuteOf(now)
	for ; m.oldest < cur && m.n > 0; m.oldest++ {
		m.n -= len(m.byMinute[m.oldest])
		delete(m.byMinute, m.oldest)
	}
	if m.n == 0 {
		clear(m.byMinute)
		m.oldest = cur
	}
}
