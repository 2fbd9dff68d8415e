package observe

import (
	"sync"

	"github.com/infergate/infergate/internal/request"
)

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
