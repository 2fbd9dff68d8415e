package meter

import "time"

// Range checks of what the meter reads: anything that reaches an
// adapter's port (a meter stream, an access-log entry) may send a value.
const (
	MaxAttempts = 64
	MaxTokens   = 1 << 30 // far beyond any context window
)

// ClampInt is v when lo <= v <= hi, else zero: a value out of its range
// is treated as absent, never used to size anything.
func ClampInt(v float64, lo, hi int) int {
	if !(v >= float64(lo) && v <= float64(hi)) { // NaN fails both
		return 0
	}
	return int(v)
}

// ClampMicros reads a duration in microseconds that must lie in [0, 1h].
func ClampMicros(v float64) time.Duration {
	return time.Duration(ClampInt(v, 0, int(time.Hour/time.Microsecond))) * time.Microsecond
}
