package mock

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// blockTokens is the prefix cache's block size, vLLM's default.
const blockTokens = 16

// errQueueFull refuses a request when the waiting queue is at MaxQueue.
var errQueueFull = errors.New("mock: waiting queue is full")

// engine models the GPU side of an inference server: a running batch of at
// most maxBatch requests, a FIFO waiting queue, the KV tokens held by running
// requests and a prefix cache. Every request goes through it, so the vLLM
// gauges are measured even when no limit is set.
type engine struct {
	mu       sync.Mutex
	maxBatch int       // 0: unbounded
	maxQueue int       // 0: unbounded; negative: no waiting room
	waiting  []*ticket // FIFO; guarded by mu

	// Written under mu, read without it: the stream loop reads the batch
	// size once per event, and scrapes must not contend with admissions.
	running  atomic.Int64
	queued   atomic.Int64
	kvTokens atomic.Int64
	cache    atomic.Pointer[prefixCache] // nil: disabled
}

// ticket is one request's place in the engine.
type ticket struct {
	e        *engine
	ready    chan struct{} // closed on admission into the batch
	admitted time.Time     // set under e.mu before ready closes
	released bool          // guarded by e.mu
	kv       int64         // KV tokens held; touched only by the request's goroutine
}

// configure applies new limits; raising maxBatch admits waiting requests at
// once. Requests already running keep their slot when it is lowered.
func (e *engine) configure(maxBatch, maxQueue, cacheTokens int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.maxBatch, e.maxQueue = maxBatch, maxQueue
	blocks := cacheTokens / blockTokens
	if c := e.cache.Load(); c == nil && blocks > 0 || c != nil && c.capacity != blocks {
		// A resize starts cold: simpler than evicting to fit, and rare.
		e.cache.Store(newPrefixCache(blocks))
	}
	e.promoteLocked(time.Now())
}

// admit enters a request that arrived at now: into the batch at once when
// there is room and nobody is waiting, else at the back of the queue.
func (e *engine) admit(now time.Time) (*ticket, error) {
	t := &ticket{e: e, ready: make(chan struct{})}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.waiting) == 0 && e.hasRoomLocked() {
		e.startLocked(t, now)
		return t, nil
	}
	if e.maxQueue < 0 || e.maxQueue > 0 && len(e.waiting) >= e.maxQueue {
		return nil, errQueueFull
	}
	e.waiting = append(e.waiting, t)
	e.queued.Store(int64(len(e.waiting)))
	return t, nil
}

func (e *engine) hasRoomLocked() bool {
	return e.maxBatch <= 0 || e.running.Load() < int64(e.maxBatch)
}

func (e *engine) startLocked(t *ticket, at time.Time) {
	e.running.Add(1)
	t.admitted = at
	close(t.ready)
}

// promoteLocked moves waiting requests into the batch while it has room.
func (e *engine) promoteLocked(now time.Time) {
	n := 0
	for n < len(e.waiting) && e.hasRoomLocked() {
		e.startLocked(e.waiting[n], now)
		n++
	}
	e.waiting = slices.Delete(e.waiting, 0, n)
	e.queued.Store(int64(len(e.waiting)))
}

// wait blocks until t is admitted or ctx ends. Either way the caller must
// still call release, which also takes a departed request off the queue.
func (t *ticket) wait(ctx context.Context) error {
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hold adds n tokens to the KV cache usage until release.
func (t *ticket) hold(n int) {
	t.kv += int64(n)
	t.e.kvTokens.Add(int64(n))
}

// release frees t's batch slot and KV tokens, or its place in the queue.
func (t *ticket) release() {
	e := t.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	if i := slices.Index(e.waiting, t); i >= 0 {
		e.waiting = slices.Delete(e.waiting, i, i+1)
		e.queued.Store(int64(len(e.waiting)))
		return
	}
	e.running.Add(-1)
	e.kvTokens.Add(-t.kv)
	e.promoteLocked(time.Now())
}

// matchPrefix looks blocks up in the prefix cache and then caches them. It
// reports how many leading blocks were already cached, and false when the
// cache is off.
func (e *engine) matchPrefix(blocks []uint64) (int, bool) {
	c := e.cache.Load()
	if c == nil {
		return 0, false
	}
	return c.match(blocks), true
}

// blockHashes keys each full 16-token block of a prompt by a hash of the
// whole prefix up to and including it, as vLLM does, so a block only matches
// when everything before it matches too.
func blockHashes(model string, words []string) []uint64 {
	blocks := make([]uint64, len(words)/blockTokens)
	h := fnv.New64a()
	h.Write([]byte(model))
	prev := h.Sum64()
	for i := range blocks {
		h.Reset()
		h.Write(binary.BigEndian.AppendUint64(nil, prev))
		for _, w := range words[i*blockTokens : (i+1)*blockTokens] {
			h.Write([]byte(w))
			h.Write([]byte{0})
		}
		prev = h.Sum64()
		blocks[i] = prev
	}
	return blocks
}

// prefixCache is an LRU set of block hashes.
type prefixCache struct {
	mu       sync.Mutex
	capacity int        // blocks
	lru      *list.List // of uint64, most recently used first
	index    map[uint64]*list.Element
}

func newPrefixCache(blocks int) *prefixCache {
	if blocks <= 0 {
		return nil
	}
	return &prefixCache{capacity: blocks, lru: list.New(), index: make(map[uint64]*list.Element)}
}

func (c *prefixCache) match(blocks []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	hits := 0
	for hits < len(blocks) && c.index[blocks[hits]] != nil {
		hits++
	}
	// Touch the deepest block first so that the head of the chain ends up
	// most recent: eviction then trims prefixes from their tail, and a
	// prompt longer than the cache still keeps its first blocks.
	for _, b := range slices.Backward(blocks) {
		if el := c.index[b]; el != nil {
			c.lru.MoveToFront(el)
			continue
		}
		c.index[b] = c.lru.PushFront(b)
		if c.lru.Len() > c.capacity {
			delete(c.index, c.lru.Remove(c.lru.Back()).(uint64))
		}
	}
	return hits
}
