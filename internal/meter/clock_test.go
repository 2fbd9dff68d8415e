package meter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/internal/request"
)

func TestStampClock(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	ok, late, lateStream := request.TimingOK, request.TimingLateRead, request.TimingLateStream
	for _, tc := range []struct {
		name string
		f    clockFacts
		want clockVerdict
	}{
		{"read as the gate answered",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.5), firstRead: at(20), endRead: at(40)},
			clockVerdict{sent: at(2.5), timing: ok}},
		{"read just within the handoff",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(12), firstRead: at(12.1), endRead: at(40)},
			clockVerdict{sent: at(12), timing: ok}},
		{"read late, the first token in its backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(176), firstRead: at(176.07), endRead: at(176.1)},
			clockVerdict{sent: at(2), timing: late}},
		{"read late, no token, the end in its backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(176), endRead: at(180)},
			clockVerdict{sent: at(2), timing: late}},
		{"read late, the first token read after the backlog",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(15), firstRead: at(40.1), endRead: at(60)},
			clockVerdict{sent: at(2), timing: ok}},
		{"no gate answer to compare with",
			clockFacts{envoyStart: at(0), departed: at(176), firstRead: at(176.07), endRead: at(176.1)},
			clockVerdict{sent: at(176), timing: ok}},
		{"a gate clock ahead of the read",
			clockFacts{envoyStart: at(0), gateSent: at(80), departed: at(50), firstRead: at(60), endRead: at(70)},
			clockVerdict{sent: at(50), timing: ok}},
		{"a gate clock behind Envoy's",
			clockFacts{envoyStart: at(0), gateSent: at(-30), departed: at(3), firstRead: at(4), endRead: at(5)},
			clockVerdict{sent: at(3), timing: ok}},
		{"a gate answer over an hour old",
			clockFacts{gateSent: at(-3_600_001), departed: at(3), firstRead: at(4), endRead: at(5)},
			clockVerdict{sent: at(3), timing: ok}},
		{"request headers skipped: departed at the gate's answer",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2), firstRead: at(176), endRead: at(180)},
			clockVerdict{sent: at(2), timing: ok}},
		{"stalled while the first token passed",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(160.02), endRead: at(160.1),
				stalls: []Stall{{at(10), at(160)}}},
			clockVerdict{sent: at(2.6), timing: late}},
		{"stalled, then drained just before the first token's read",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(39), endRead: at(60),
				stalls: []Stall{{at(10), at(30)}}},
			clockVerdict{sent: at(2.6), timing: late}},
		{"a stall over before the first token",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(40.1), endRead: at(60),
				stalls: []Stall{{at(10), at(30)}}},
			clockVerdict{sent: at(2.6), timing: ok}},
		{"a stall between tokens",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(40.1), endRead: at(130),
				stalls: []Stall{{at(50), at(120)}}},
			clockVerdict{sent: at(2.6), timing: lateStream}},
		{"a stall between tokens, and one as the first token passed",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(40.1), endRead: at(130),
				stalls: []Stall{{at(50), at(120)}, {at(20), at(35)}}},
			clockVerdict{sent: at(2.6), timing: late}},
		{"a stall ending just after the first token's read",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(40.1), endRead: at(130),
				stalls: []Stall{{at(40), at(60)}}},
			clockVerdict{sent: at(2.6), timing: late}},
		{"a stall before the request or after its end",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), firstRead: at(40.1), endRead: at(130),
				stalls: []Stall{{at(-50), at(-30)}, {at(131), at(300)}}},
			clockVerdict{sent: at(2.6), timing: ok}},
		{"no token, a stall ending as the end was read",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(2.6), endRead: at(130),
				stalls: []Stall{{at(50), at(125)}}},
			clockVerdict{sent: at(2.6), timing: late}},
		{"a picker between the gate and the meter: its time, the read the departure",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(40), picked: true, firstRead: at(40.5), endRead: at(60)},
			clockVerdict{sent: at(40), timing: ok, picker: 38 * time.Millisecond}},
		{"a picker, and a stall while it chose: not measured, read late",
			clockFacts{envoyStart: at(0), gateSent: at(2), departed: at(40), picked: true, firstRead: at(40.5), endRead: at(60),
				stalls: []Stall{{at(5), at(39)}}},
			clockVerdict{sent: at(2), timing: late}},
		{"a picker, no gate answer to compare with: not measured",
			clockFacts{envoyStart: at(0), departed: at(40), picked: true, firstRead: at(41), endRead: at(60)},
			clockVerdict{sent: at(40), timing: ok}},
	} {
		if got := stampClock(tc.f); !got.sent.Equal(tc.want.sent) || got.timing != tc.want.timing || got.picker != tc.want.picker {
			t.Errorf("%s: sent %v %s picker %v; want %v %s picker %v", tc.name, got.sent.Sub(t0), got.timing, got.picker,
				tc.want.sent.Sub(t0), tc.want.timing, tc.want.picker)
		}
	}
}

// The watch sees a stall when it wakes later than it was due by more than
// MaxHandoff, and one under way when its beat is overdue; it forgets the
// oldest beyond its ring.
func TestStallWatch(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	w := NewStallWatch()
	if got := w.Recent(at(100)); len(got) != 0 {
		t.Errorf("a watch that never beat saw %v", got)
	}
	for _, ms := range []float64{0, 5, 10, 25, 41, 46} { // due at 15: 10 ms late at 25 is no stall; due at 30: 11 ms late at 41 is
		w.Beat(at(ms))
	}
	if got := w.Recent(at(50)); len(got) != 1 || !got[0].From.Equal(at(30)) || !got[0].To.Equal(at(41)) {
		t.Errorf("stalls %v, want 30–41 ms", got)
	}
	if got := w.Recent(at(62)); len(got) != 2 || !got[1].From.Equal(at(51)) || !got[1].To.Equal(at(62)) {
		t.Errorf("stalls %v, want 30–41 ms and one under way since 51 ms", got)
	}
	for i := range 2 * len(w.ring) {
		w.Beat(at(float64(100 + 20*i)))
	}
	if got := w.Recent(w.last); len(got) != len(w.ring) {
		t.Errorf("%d stalls kept, want %d", len(got), len(w.ring))
	}
}

// Running, the watch beats on its tick (virtual time): no stall.
func TestStallWatchRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.Run(ctx, time.Now); close(done) }()
		start := time.Now()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := w.Recent(time.Now()); len(got) != 0 || !w.last.Equal(start.Add(time.Second)) {
			t.Errorf("stalls %v, last beat %v after the start; want none, 1s", got, w.last.Sub(start))
		}
		cancel()
		<-done
	})
}
