package mock

import (
	"container/heap"
	"sync"
	"time"
)

// Why a pacer: the Go runtime checks its timers whenever it schedules, so
// they are precise while its threads are busy; but an idle process waits
// for its next timer in epoll_wait, whose timeout is in whole milliseconds
// (a timer due in 0.3 ms fires after 1 ms, one due in 1.5 ms after 2 ms).
// On runtime timers alone the mock emitted 0.5 ms late at the median and
// 1.5 ms at p99 (its emit-lateness histogram, 256 streams at 20 ms ITL on
// two cores), most of what a client-side benchmark then measured as its own
// TTFT error.
//
// The pacer keeps one kernel high-resolution timer (a Linux timerfd, read
// through the runtime's network poller) armed for the earliest deadline a
// sleeper announced. When it expires the poller returns, and the runtime,
// awake, runs the sleepers' own timers on time. The sleepers still sleep on
// runtime timers, which stay the authority (never early, cancellable): the
// pacer only ends the runtime's oversleeping. It costs one timerfd arm per
// new earliest deadline and one wake-up per expiry.
type pacer struct {
	mu    sync.Mutex
	q     deadlineHeap
	armed time.Time // the deadline the kernel timer is set for; zero: none
	arm   func(d time.Duration)
}

var (
	pacerOnce sync.Once
	thePacer  *pacer
	// preciseTimers is off in this package's tests: they run servers in
	// synctest bubbles, where the pacer's reader goroutine, blocked on a
	// file, would never let a bubble settle. (A test elsewhere that runs the
	// mock inside a bubble would meet the same problem.)
	preciseTimers = true
)

// precise returns the process's pacer, or nil when there is none (not
// Linux, or turned off).
func precise() *pacer {
	if !preciseTimers {
		return nil
	}
	pacerOnce.Do(func() { thePacer = newPacer() })
	return thePacer
}

// expect announces a deadline a sleeper's runtime timer is set for.
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
