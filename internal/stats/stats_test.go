package stats

import (
	"testing"
	"time"
)

func TestRank(t *testing.T) {
	for _, tc := range []struct {
		n    int
		q    float64
		want int
	}{
		{0, 0.5, 0}, {1, 0.95, 1}, {2, 0.5, 1}, {3, 0.5, 2}, {10, 0.95, 10}, {20, 0.95, 19},
		{21, 0.95, 20}, {100, 0.29, 29}, {100, 0.95, 95}, {100, 0.99, 99}, {1000, 0.999, 999},
		{5, 0, 1}, {5, 1, 5}, {5, 1.5, 5},
	} {
		if got := Rank(tc.n, tc.q); got != tc.want {
			t.Errorf("Rank(%d, %v) = %d, want %d", tc.n, tc.q, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	v := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := Percentile(v, 0.5); got != 5 {
		t.Errorf("p50 = %v, want 5", got)
	}
	if got := Percentile(v, 0.95); got != 10 {
		t.Errorf("p95 = %v, want 10", got)
	}
	if got := Percentile([]int64(nil), 0.95); got != 0 {
		t.Errorf("empty p95 = %v, want 0", got)
	}
}

func TestMs(t *testing.T) {
	if got := Ms(1234567 * time.Nanosecond); got != 1.234 {
		t.Errorf("Ms = %v, want 1.234", got)
	}
}
