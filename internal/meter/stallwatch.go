package meter

import (
	"context"
	"sync"
	"time"
)

// StallTick is how often the stall watch wakes: a stall shorter than this
// may go unseen, and delays a read by no more than it.
const StallTick = 5 * time.Millisecond

// Stall is a time infergate itself did not run (its CPU starved, the
// process stopped): from when the watch was due to wake to when it woke.
type Stall struct{ From, To time.Time }

// StallWatch notes when infergate stops running. No Envoy message carries
// the time Envoy sent it, so a meter read after such a stall may have sat
// in the queue for all of it: the meter asks the watch (stampClock).
type StallWatch struct {
	tick time.Duration
	mu   sync.Mutex
	last time.Time // the last beat
	ring [64]Stall // the latest stalls
	n    int       // stalls seen
}

// NewStallWatch is a watch that wakes every StallTick.
func NewStallWatch() *StallWatch { return &StallWatch{tick: StallTick} }

// Run beats every tick until ctx is done. now is the watch's clock.
func (w *StallWatch) Run(ctx context.Context, now func() time.Time) {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	w.Beat(now())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Beat(now())
		}
	}
}

// Beat is the watch waking at `at`: later than MaxHandoff after it was
// due, infergate did not run in between.
func (w *StallWatch) Beat(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() {
		if due := w.last.Add(w.tick); at.Sub(due) > MaxHandoff {
			w.ring[w.n%len(w.ring)] = Stall{due, at}
			w.n++
		}
	}
	w.last = at
}

// Recent returns the stalls the watch remembers, and one under way (or
// not yet seen by the watch) at `now` when its beat is overdue. A nil
// watch (none running) knows none.
func (w *StallWatch) Recent(now time.Time) []Stall {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Stall, 0, min(w.n, len(w.ring))+1)
	out = append(out, w.ring[:min(w.n, len(w.ring))]...)
	if !w.last.IsZero() {
		if due := w.last.Add(w.tick); now.Sub(due) > MaxHandoff {
			out = append(out, Stall{due, now})
		}
	}
	return out
}
