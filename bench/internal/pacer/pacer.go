// Package pacer makes the Go runtime's timers wake on time in an idle
// process, for the mock's emit deadlines and the load generator's send
// times.
//
// The runtime checks its timers whenever it schedules, so they are precise
// while its threads are busy; but an idle process waits for its next timer
// in epoll_wait, whose timeout is in whole milliseconds: a timer due in
// 0.3 ms fires after 1 ms, one due in 1.5 ms after 2 ms. Measured on two
// cores, the mock emitted 0.5 ms late at the median and 1.5 ms at p99 (256
// streams at 20 ms ITL), and an open-loop run sent its requests 0.7–0.85 ms
// after their scheduled times at the median: most of what a client-side
// benchmark then measured as its own TTFT error.
//
// The pacer keeps one kernel high-resolution timer (a Linux timerfd, read
// through the runtime's network poller) armed for the earliest deadline
// announced with Expect. When it expires the poller returns, and the
// runtime, awake, runs the timers that are due. Callers still sleep on
// their own runtime timers, which stay the authority (never early,
// cancellable): the pacer only ends the runtime's oversleeping. It costs one
// timerfd arm per new earliest deadline and one wake-up per expiry. Where
// there is no timerfd, Expect does nothing.
package pacer

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"
)

type pacer struct {
	mu    sync.Mutex
	q     deadlineHeap
	armed time.Time // the deadline the kernel timer is set for; zero: none
	arm   func(d time.Duration)
}

var (
	once    sync.Once
	the     *pacer
	enabled atomic.Bool
)

func init() { enabled.Store(true) }

// SetEnabled turns the pacer on or off and reports whether it was on.
// Tests that run timers inside a synctest bubble turn it off: the pacer's
// goroutine, blocked reading a file, would never let the bubble settle if
// the bubble started it.
func SetEnabled(on bool) (was bool) { return enabled.Swap(on) }

// Expect announces that a runtime timer is set for deadline, so that the
// runtime is awake when it falls due.
func Expect(deadline time.Time) {
	if !enabled.Load() {
		return
	}
	once.Do(func() { the = newPacer() })
	if the != nil {
		the.expect(deadline)
	}
}

func (p *pacer) expect(deadline time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	heap.Push(&p.q, deadline)
	if p.armed.IsZero() || deadline.Before(p.armed) {
		p.setLocked(deadline)
	}
}

// fire is called when the kernel timer expires: it forgets the deadlines
// that are due and sets the timer for the next.
func (p *pacer) fire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for len(p.q) > 0 && !p.q[0].After(now) {
		heap.Pop(&p.q)
	}
	p.armed = time.Time{}
	if len(p.q) > 0 {
		p.setLocked(p.q[0])
	}
}

func (p *pacer) setLocked(deadline time.Time) {
	p.armed = deadline
	p.arm(max(time.Until(deadline), time.Microsecond)) // a zero timerfd is disarmed
}

// deadlineHeap is a min-heap of deadlines.
type deadlineHeap []time.Time

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
