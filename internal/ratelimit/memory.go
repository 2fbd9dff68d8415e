package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Memory is a Limiter that keeps its counters in this process: for a
// single replica, for tests, and as the local limiter of WithFallback.
//
// Counters are created at a window's first admission (or by a charge
// carried over from an ended window, see Settle) and dropped once the
// window has ended (checked on every Reserve, in time proportional to the
// number of ended counters), so memory is bounded by the counters of the
// current windows. It is safe for concurrent use; one mutex guards all
// counters, held for a few map lookups per call.
//
// Counter ids have the same form as in Redis, with DefaultCounterPrefix.
type Memory struct {
	clock Clock

	mu     sync.Mutex
	byKey  map[counterKey]*memCounter
	byID   map[string]*memCounter
	expiry expiryHeap // every counter, earliest end first
}

// counterKey identifies a counter without building its id.
type counterKey struct {
	key    string
	unit   Unit
	window time.Duration
	start  int64 // Unix ms
}

type memCounter struct {
	key  counterKey
	id   string
	used int64
	end  int64 // window end, Unix ms
}

// NewMemory returns an empty in-memory limiter; a nil clock means time.Now.
func NewMemory(clock Clock) *Memory {
	if clock == nil {
		clock = time.Now
	}
	return &Memory{
		clock: clock,
		byKey: make(map[counterKey]*memCounter),
		byID:  make(map[string]*memCounter),
	}
}

// maxStackLimits is how many limits a call handles without heap scratch space.
const maxStackLimits = 8

// Reserve implements Limiter; see the package documentation for the
// semantics. It fails only for invalid limits or costs (ErrInvalid).
func (m *Memory) Reserve(_ context.Context, limits []Limit, cost Cost) (Result, error) {
	if err := validate(limits, cost); err != nil {
		return Result{}, err
	}
	n := len(limits)
	if n == 0 {
		return Result{Allowed: true}, nil
	}
	var (
		keysBuf [maxStackLimits]counterKey
		endsBuf [maxStackLimits]int64
		usedBuf [maxStackLimits]int64
		ctrBuf  [maxStackLimits]*memCounter
	)
	keys, ends, used, ctrs := keysBuf[:0], endsBuf[:0], usedBuf[:0], ctrBuf[:0]
	if n > maxStackLimits {
		keys, ends, used, ctrs = make([]counterKey, n), make([]int64, n), make([]int64, n), make([]*memCounter, n)
	} else {
		keys, ends, used, ctrs = keys[:n], ends[:n], used[:n], ctrs[:n]
	}
	now := m.clock()
	nowMs := now.UnixMilli()
	for i := range limits {
		l := &limits[i]
		start, end := window(nowMs, l.Window)
		keys[i] = counterKey{key: l.Key, unit: l.Unit, window: l.Window, start: start}
		ends[i] = end
	}

	m.mu.Lock()
	m.expire(nowMs)
	exceeded := -1
	for i := range limits {
		c := m.byKey[keys[i]]
		ctrs[i] = c
		if c != nil {
			used[i] = c.used
		}
		if exceeded < 0 && !admits(used[i], cost.Of(limits[i].Unit), limits[i].Amount) {
			exceeded = i
		}
	}
	if exceeded >= 0 {
		m.mu.Unlock()
		st, _ := newResult(n, false)
		fillStates(st, limits, used, ends, now)
		return Result{States: st, Exceeded: &st[exceeded].Limit, RetryAfter: st[exceeded].Reset}, nil
	}
	for i := range limits {
		c := ctrs[i]
		if c == nil {
			// Absent before this call, but an earlier limit on the same
			// counter may have created it just now.
			if c = m.byKey[keys[i]]; c == nil {
				c = &memCounter{
					key: keys[i],
					id:  counterID(DefaultCounterPrefix, "", &limits[i], keys[i].start),
					end: ends[i],
				}
				m.byKey[c.key] = c
				m.byID[c.id] = c
				m.expiry.push(c)
			}
			ctrs[i] = c
		}
		if !sameCounterBefore(ctrs, i) {
			c.used += cost.Of(limits[i].Unit) // <= Amount - used: admits checked it
		}
	}
	for i := range limits {
		used[i] = ctrs[i].used
	}
	m.mu.Unlock()

	st, entries := newResult(n, true)
	fillStates(st, limits, used, ends, now)
	for i := range limits {
		entries[i] = Entry{Counter: ctrs[i].id, Unit: limits[i].Unit, Reserved: cost.Of(limits[i].Unit), ExpiresAt: ends[i], Limit: limits[i].Amount}
	}
	return Result{Allowed: true, Reservation: Reservation{Entries: dedupEntries(entries)}, States: st}, nil
}

// Settle implements Limiter: each token entry's counter gets actual minus
// reserved added, not below zero nor past math.MaxInt64, while its window is in force; an entry
// whose window has ended has any excess charged to its limit's counter in
// the window in force (created if need be) and nothing refunded (see
// settlePlan). Request entries are final. Call it once per admitted
// reservation; a second call would apply the difference twice.
func (m *Memory) Settle(_ context.Context, r Reservation, actual Cost) error {
	if err := checkActual(actual); err != nil {
		return err
	}
	nowMs := m.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	adj, err := settlePlan(r.Entries, actual, nowMs, buf[:0])
	return errors.Join(err, m.apply(adj, nowMs))
}

// Release implements Limiter: every counter of r whose window is in force
// gives back what r reserved on it, requests included, not below zero.
func (m *Memory) Release(_ context.Context, r Reservation) error {
	nowMs := m.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	return m.apply(releasePlan(r.Entries, nowMs, buf[:0]), nowMs)
}

// apply makes the changes of a Settle or Release: counters of windows in
// force that still exist are adjusted, not below zero; carried charges
// create their counter if needed. Counters saturate at math.MaxInt64.
func (m *Memory) apply(adj []adjustment, nowMs int64) error {
	if len(adj) == 0 {
		return nil
	}
	var errs []error
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range adj {
		a := &adj[i]
		c := m.byID[a.counter]
		if c == nil && a.carried {
			var err error
			if c, err = m.create(a, a.counter, a.start, a.end); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		// An ended window's counter, while still held, takes refunds only.
		if c != nil && (c.end > nowMs || a.delta < 0) {
			over := overLimit(c.used, a.delta, a.limit)
			c.used = addSat(c.used, a.delta) - over
			errs = append(errs, m.carryDebt(a, over))
		}
	}
	return errors.Join(errs...)
}

// carryDebt moves debt, what a's charge took past its limit, into the
// counters of the windows after a's (see settlePlan).
func (m *Memory) carryDebt(a *adjustment, debt int64) error {
	for k := 1; debt > 0 && k <= MaxDebtWindows; k++ {
		id, start, end := a.debtWindow(k)
		c := m.byID[id]
		part := debtPart(debt, 0, a.limit, k)
		if c != nil {
			part = debtPart(debt, c.used, a.limit, k)
		}
		if part == 0 {
			continue
		}
		if c == nil {
			var err error
			if c, err = m.create(a, id, start, end); err != nil {
				return err
			}
		}
		c.used = addSat(c.used, part)
		debt -= part
	}
	return nil
}

// create adds the counter id of a's limit for the window [start, end).
// m.mu must be held.
func (m *Memory) create(a *adjustment, id string, start, end int64) (*memCounter, error) {
	key, ok1 := strings.CutPrefix(a.head, DefaultCounterPrefix+"{")
	key, ok2 := strings.CutSuffix(key, "}")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: counter %q is not a counter of this limiter", ErrInvalid, id)
	}
	c := &memCounter{
		key: counterKey{key: key, unit: a.unit, window: a.window, start: start},
		id:  id,
		end: end,
	}
	m.byKey[c.key] = c
	m.byID[c.id] = c
	m.expiry.push(c)
	return c, nil
}

// Len returns how many counters are held (current windows, plus ended
// ones not dropped yet).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byID)
}

// expire drops the counters whose window ended at or before nowMs.
// m.mu must be held.
func (m *Memory) expire(nowMs int64) {
	for len(m.expiry) > 0 && m.expiry[0].end <= nowMs {
		c := m.expiry.pop()
		delete(m.byKey, c.key)
		delete(m.byID, c.id)
	}
	// Give back memory after a burst of keys has expired (Go maps do not
	// shrink on delete).
	if c := cap(m.expiry); c > 1024 && len(m.expiry) < c/4 {
		m.expiry = append(make(expiryHeap, 0, 2*len(m.expiry)), m.expiry...)
		byKey := make(map[counterKey]*memCounter, len(m.expiry))
		byID := make(map[string]*memCounter, len(m.expiry))
		for _, c := range m.expiry {
			byKey[c.key] = c
			byID[c.id] = c
		}
		m.byKey, m.byID = byKey, byID
	}
}

// sameCounterBefore reports whether a limit before i uses counter ctrs[i]
// (two limits on one key, unit and window share the counter, which is
// charged once).
func sameCounterBefore(ctrs []*memCounter, i int) bool {
	for j := 0; j < i; j++ {
		if ctrs[j] == ctrs[i] {
			return true
		}
	}
	return false
}

// dedupEntries drops entries whose counter appears earlier, so that
// settling charges a shared counter once, keeping the smallest limit of
// those sharing it (the one that admits). It reuses es.
func dedupEntries(es []Entry) []Entry {
	out := es[:0]
	for i := range es {
		dup := false
		for j := range out {
			if out[j].Counter == es[i].Counter {
				out[j].Limit = min(out[j].Limit, es[i].Limit)
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, es[i])
		}
	}
	return out
}

// expiryHeap is a binary min-heap of counters on their window end.
type expiryHeap []*memCounter

func (h *expiryHeap) push(c *memCounter) {
	*h = append(*h, c)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p].end <= s[i].end {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *expiryHeap) pop() *memCounter {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = nil
	s = s[:last]
	i := 0
	for {
		l, r, small := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].end < s[small].end {
			small = l
		}
		if r < len(s) && s[r].end < s[small].end {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
