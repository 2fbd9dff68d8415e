package pacer

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// wakeLateness runs n sleepers on runtime timers (announced to the pacer
// unless it is off) to deadlines spread over 40 ms, started in random order
// (so later ones often move the kernel timer earlier), and returns how late
// each woke, sorted.
func wakeLateness(t testing.TB, n int) []time.Duration {
	t.Helper()
	base := time.Now().Add(2 * time.Millisecond)
	late := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i, k := range rand.Perm(n) {
		deadline := base.Add(time.Duration(k) * 40 * time.Millisecond / time.Duration(n))
		wg.Go(func() {
			Expect(deadline)
			<-time.After(time.Until(deadline))
			late[i] = time.Since(deadline)
		})
	}
	wg.Wait()
	slices.Sort(late)
	return late
}

// No sleeper wakes early, with the pacer or without. How late they wake is
// the machine's to say: BenchmarkWakeLateness measures it.
func TestWakesSleepersOnTime(t *testing.T) {
	SetEnabled(false)
	runtime := wakeLateness(t, 200)
	SetEnabled(true)
	paced := wakeLateness(t, 200)
	for _, c := range []struct {
		name string
		late []time.Duration
	}{{"runtime timers", runtime}, {"with the pacer", paced}} {
		t.Logf("%s: 200 sleepers late by p50 %v, p99 %v, max %v", c.name, c.late[len(c.late)/2], c.late[len(c.late)*99/100], c.late[len(c.late)-1])
		if c.late[0] < 0 {
			t.Errorf("%s: a sleeper woke %v early", c.name, -c.late[0])
		}
	}
}

// BenchmarkWakeLateness reports how late 200 sleepers wake, with the pacer
// and on the runtime's timers alone (p50-ns and p99-ns per run).
func BenchmarkWakeLateness(b *testing.B) {
	defer SetEnabled(SetEnabled(true))
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "runtime", true: "pacer"}[on]
		b.Run(name, func(b *testing.B) {
			SetEnabled(on)
			var p50, p99 time.Duration
			for b.Loop() {
				late := wakeLateness(b, 200)
				p50, p99 = p50+late[len(late)/2], p99+late[len(late)*99/100]
			}
			b.ReportMetric(float64(p50)/float64(b.N), "p50-ns")
			b.ReportMetric(float64(p99)/float64(b.N), "p99-ns")
		})
	}
}

// The kernel timer follows the earliest deadline announced.
func TestArmsForEarliestDeadline(t *testing.T) {
	var armed []time.Duration
	p := &pacer{arm: func(d time.Duration) { armed = append(armed, d) }}
	now := time.Now()
	p.expect(now.Add(time.Hour))
	p.expect(now.Add(time.Minute)) // earlier: re-armed
	p.expect(now.Add(2 * time.Hour))
	if len(armed) != 2 || armed[1] > time.Minute || armed[1] < 59*time.Second {
		t.Fatalf("armed %v, want an hour then a minute", armed)
	}
	p.expect(now.Add(-time.Second)) // already due: the shortest arm
	if got := armed[len(armed)-1]; got != time.Microsecond {
		t.Errorf("armed %v for a past deadline, want 1µs", got)
	}
	p.fire() // forgets the past deadline, re-arms for the minute
	if len(p.q) != 3 || !p.armed.Equal(now.Add(time.Minute)) {
		t.Errorf("after fire: %d deadlines, armed for %v", len(p.q), p.armed.Sub(now))
	}
}

func TestSetEnabled(t *testing.T) {
	defer SetEnabled(true)
	if !SetEnabled(false) || SetEnabled(false) {
		t.Error("SetEnabled does not report the previous state")
	}
	Expect(time.Now().Add(time.Hour)) // off: no effect, no panic
}
