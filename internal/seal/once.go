package seal

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// Once records the seals already used: Claim reports true the first time
// a seal's id is claimed before it expires, false after (a replay). It
// fails closed: a claim it cannot record (a store unreachable, full) is
// refused with an error, and what the seal was for is not done (a
// reservation stays charged: over-, never under-charged).
type Once interface {
	Claim(ctx context.Context, p Purpose, id string, expires time.Time) (bool, error)
}

// ErrFull: a MemoryOnce holds as many live claims as it may.
var ErrFull = errors.New("settle-once records are full")

// MemoryOnce is a Once of one process, holding at most Max live claims
// (each until its seal expires).
type MemoryOnce struct {
	Max int
	Now func() time.Time

	mu    sync.Mutex
	seen  map[string]struct{}
	order expiries
}

// Claim implements Once.
func (m *MemoryOnce) Claim(_ context.Context, p Purpose, id string, expires time.Time) (bool, error) {
	now := m.Now()
	if !now.Before(expires) {
		return false, ErrExpired
	}
	key := string(p) + ":" + id
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]struct{}{}
	}
	for len(m.order) > 0 && !now.Before(m.order[0].at) {
		delete(m.seen, heap.Pop(&m.order).(expiry).key)
	}
	if _, ok := m.seen[key]; ok {
		return false, nil
	}
	if len(m.seen) >= m.Max {
		return false, ErrFull
	}
	m.seen[key] = struct{}{}
	heap.Push(&m.order, expiry{at: expires, key: key})
	return true, nil
}

type expiry struct {
	at  time.Time
	key string
}

// expiries is a min-heap of claims by expiry.
type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
