package extproc

import (
	"sync"
	"time"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/request"
)

// What a client or a pool controls is bounded here before a stamp is
// stored anywhere (request log, /debug/requests, spans, metrics, the
// controller's feed): a request with a huge model name or a pool answering
// with a huge upstream header costs a few hundred bytes, not megabytes.

// Bounds of stamp fields.
const (
	maxStampField  = 256  // ids, names, addresses
	maxStampReason = 1024 // a policy's reason
	maxPoolsTried  = 16   // more attempts than any retry policy makes
	maxAttempts    = 64
	maxTokens      = 1 << 30 // far beyond any context window
)

// boundStamp truncates every free-text field of st in place.
func boundStamp(st *request.Stamp) {
	for _, f := range []*string{&st.RequestID, &st.TraceID, &st.Principal, &st.Tenant, &st.Model,
		&st.ResponseModel, &st.Pool, &st.Upstream, &st.Endpoint, &st.TokenSource, &st.Decision} {
		*f = truncate(*f, maxStampField)
	}
	st.Reason = truncate(st.Reason, maxStampReason)
	if len(st.PoolsTried) > maxPoolsTried {
		st.PoolsTried = st.PoolsTried[len(st.PoolsTried)-maxPoolsTried:]
	}
	for i := range st.PoolsTried {
		st.PoolsTried[i] = truncate(st.PoolsTried[i], maxStampField)
	}
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// clampInt is v when lo <= v <= hi, else zero: a value out of its range
// is treated as absent, never used to size anything.
func clampInt(v float64, lo, hi int) int {
	if !(v >= float64(lo) && v <= float64(hi)) { // NaN fails both
		return 0
	}
	return int(v)
}

// clampMicros reads a duration in microseconds that must lie in [0, 1h].
func clampMicros(v float64) time.Duration {
	return time.Duration(clampInt(v, 0, int(time.Hour/time.Microsecond))) * time.Microsecond
}

// other is the metric label value of a name outside the known set.
const other = "other"

// maxLearnedLabels bounds the names learned as label values when no known
// set is configured.
const maxLearnedLabels = 64

// labelSet decides which names (models, pools) become metric label
// values: the configured ones always; without a configuration, the first
// maxLearnedLabels names seen on a response a pool answered successfully;
// anything else is "other". Clients name models (and a pool may name
// itself in a header), so the set must not be theirs to grow.
type labelSet struct {
	known map[string]bool // configured: fixed, read without a lock
	mu    sync.Mutex
	seen  map[string]bool // learned
}

func newLabelSet(known []string) *labelSet {
	l := &labelSet{seen: map[string]bool{}}
	if len(known) > 0 {
		l.known = make(map[string]bool, len(known))
		for _, m := range known {
			l.known[m] = true
		}
	}
	return l
}

// label returns the label value for name, seen on a response with status
// from a pool.
func (l *labelSet) label(name string, st *request.Stamp) string {
	if l.known != nil {
		if l.known[name] {
			return name
		}
		return other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[name] {
		return name
	}
	if st.Status > 0 && st.Status < 400 && st.Pool != "" && len(l.seen) < maxLearnedLabels {
		l.seen[name] = true
		return name
	}
	return other
}
