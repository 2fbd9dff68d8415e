package loadgen

import (
	"math"
	"testing"
	"time"
)

// gapStats draws n arrivals and returns the achieved rate and the
// coefficient of variation of the gaps.
func gapStats(t *testing.T, s *Schedule, n int) (rate, cv float64) {
	t.Helper()
	var prev time.Duration
	var sum, sumSq float64
	for range n {
		next := s.Next()
		gap := (next - prev).Seconds()
		if gap < 0 {
			t.Fatalf("arrivals went backwards: %s after %s", next, prev)
		}
		sum += gap
		sumSq += gap * gap
		prev = next
	}
	mean := sum / float64(n)
	return 1 / mean, math.Sqrt(sumSq/float64(n)-mean*mean) / mean
}

func TestScheduleStatistics(t *testing.T) {
	const n = 20000
	for _, tc := range []struct {
		arrival    Arrival
		burstiness float64
		cv         float64 // expected coefficient of variation: 1/sqrt(shape)
	}{
		{Constant, 0, 0},
		{Poisson, 0, 1},
		{Gamma, 1, 1},
		{Gamma, 0.25, 2},
		{Gamma, 4, 0.5},
	} {
		s, err := NewSchedule(tc.arrival, 50, tc.burstiness, 0, 42)
		if err != nil {
			t.Fatal(err)
		}
		rate, cv := gapStats(t, s, n)
		// Standard errors at n = 20000 are well under 2% (rate) and 3% (CV).
		if math.Abs(rate-50)/50 > 0.04 {
			t.Errorf("%s(%g): mean rate %.2f, want 50", tc.arrival, tc.burstiness, rate)
		}
		if math.Abs(cv-tc.cv) > 0.06*max(tc.cv, 0.1) {
			t.Errorf("%s(%g): gap CV %.3f, want %.3f", tc.arrival, tc.burstiness, cv, tc.cv)
		}
	}
}

func TestScheduleIsSeeded(t *testing.T) {
	draw := func(seed int64) []time.Duration {
		s, err := NewSchedule(Gamma, 10, 0.5, 0, seed)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]time.Duration, 50)
		for i := range out {
			out[i] = s.Next()
		}
		return out
	}
	a, b, c := draw(7), draw(7), draw(8)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different arrival %d: %s vs %s", i, a[i], b[i])
		}
	}
	if a[10] == c[10] && a[20] == c[20] {
		t.Error("different seeds gave the same schedule")
	}
}

// TestScheduleRamp: a linear ramp from 0 to r over T packs a quarter of
// its r·T/2 arrivals into the first half and three quarters into the
// second; afterwards the rate is r.
func TestScheduleRamp(t *testing.T) {
	s, err := NewSchedule(Constant, 100, 0, 10*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	var firstHalf, secondHalf, after int
	for {
		off := s.Next()
		if off >= 20*time.Second {
			break
		}
		switch {
		case off < 5*time.Second:
			firstHalf++
		case off < 10*time.Second:
			secondHalf++
		default:
			after++
		}
	}
	// Constant arrivals make the counts exact up to rounding at the edges.
	if firstHalf < 124 || firstHalf > 126 || secondHalf < 374 || secondHalf > 376 || after < 999 || after > 1001 {
		t.Errorf("arrivals: %d in the first half of the ramp, %d in the second, %d in the next 10s; want 125, 375, 1000",
			firstHalf, secondHalf, after)
	}
}

func TestScheduleRejects(t *testing.T) {
	for _, tc := range []struct {
		a    Arrival
		rate float64
		b    float64
	}{{Poisson, 0, 1}, {Poisson, math.Inf(1), 1}, {Gamma, 1, 0}, {"lumpy", 1, 1}} {
		if _, err := NewSchedule(tc.a, tc.rate, tc.b, 0, 1); err == nil {
			t.Errorf("%s rate %g burstiness %g: no error", tc.a, tc.rate, tc.b)
		}
	}
}
