// Package stats holds the one definition of the figures infergate reports,
// used alike by the meter, the SLA controller and the load generator: a
// percentile is the nearest rank, and durations are shown in milliseconds.
package stats

import (
	"cmp"
	"math"
	"time"
)

// Rank is the 1-based nearest rank of the q-quantile of n values: the
// smallest rank r with r/n >= q, i.e. ceil(q·n), clamped to [1, n]. With
// this definition the p95 of 20 values is the 19th, and no percentile
// lies between two observed values. (A tiny epsilon absorbs floating-point
// error in q·n, so 0.29 × 100 is rank 29, not 30.)
func Rank(n int, q float64) int {
	if n <= 0 {
		return 0
	}
	r := int(math.Ceil(q*float64(n) - 1e-9))
	return min(max(r, 1), n)
}

// Percentile returns the q-quantile (0 < q <= 1) of sorted values by
// nearest rank, or the zero value when there are none.
func Percentile[T cmp.Ordered](sorted []T, q float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	return sorted[Rank(len(sorted), q)-1]
}

// Ms renders d in milliseconds with microsecond precision: what stamps,
// pages and reports show.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
