package meter

import (
	"context"
	"sync"
	"time"
)

// stallTick is how often the stall watch wakes: a stall shorter than this
// may go unseen, and delays a read by no more than it.
const stallTick = 5 * time.Millisecond

// stall is a time infergate itself did not run (its CPU starved, the
// process stopped): from when the watch was due to wake to when it woke.
type stall struct{ from, to time.Time }

// stallWatch notes when infergate stops running. No Envoy message carries
// the time Envoy sent it, so a meter read after such a stall may have sat
// in the queue for all of it: the meter asks the watch (stampClock).
type stallWatch struct {
	tick time.Duration
	mu   sync.Mutex
	last time.Time // the last beat
	ring [64]stall // the latest stalls
	n    int       // stalls seen
}

// Run beats every tick until ctx is done. now is the watch's clock.
func (w *stallWatch) Run(ctx context.Context, now func() time.Time) {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	w.beat(now())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.beat(now())
		}
	}
}

// beat is the watch waking at `at`: later than maxHandoff after it was
// due, infergate did not run in between.
func (w *stallWatch) beat(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() {
		if due := w.last.Add(w.tick); at.Sub(due) > maxHandoff {
			w.ring[w.n%len(w.ring)] = stall{due, at}
			w.n++
		}
	}
	w.last = at
}

// recent returns the stalls the watch remembers, and one under way (or
// not yet seen by the watch) at `now` when its beat is overdue. A nil
// watch (none running) knows none.
func (w *stallWatch) recent(now time.Time) []stall {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]stall, 0, min(w.n, len(w.ring))+1)
	out = append(out, w.ring[:min(w.n, len(w.ring))]...)
	if !w.last.IsZero() {
		if due := w.last.Add(w.tick); now.Sub(due) > maxHandoff {
			out = append(out, stall{due, now})
		}
	}
	return out
}
