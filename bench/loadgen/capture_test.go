package loadgen

import (
	"bytes"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
)

// Sequential sends never overlap at concurrency 1, and Capture sees every
// body as read: streamed lines with their times, the comments included.
func TestSequentialCapture(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		var inFlight, peak atomic.Int64
		count := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				defer inFlight.Add(-1)
				h.ServeHTTP(w, r)
			})
		}
		cfg := mock.Config{TTFT: -1, ITL: time.Millisecond, EmitTimestamps: true}
		_, a, _ := n.mock(t, cfg, count)
		_, b, _ := n.mock(t, cfg, count)
		c := n.config(a, b)
		c.Concurrency, c.Sequential = 1, true
		var mu sync.Mutex
		bodies := map[[2]int][]byte{}
		c.Capture = func(s *Sample, raw *Raw) {
			if len(raw.Lines) == 0 || raw.Lines[len(raw.Lines)-1].End != len(raw.Body) {
				t.Errorf("lines do not cover the body: %d lines, %d bytes", len(raw.Lines), len(raw.Body))
			}
			for i := 1; i < len(raw.Lines); i++ {
				if raw.Lines[i].At.Before(raw.Lines[i-1].At) || raw.Lines[i].At.Before(s.Start) {
					t.Errorf("line %d read before the one before it", i)
				}
			}
			mu.Lock()
			bodies[[2]int{s.Target, s.Item}] = bytes.Clone(raw.Body)
			mu.Unlock()
		}
		rec := run(t, c)
		if peak.Load() != 1 {
			t.Errorf("%d requests in flight at once, want 1", peak.Load())
		}
		if len(bodies) != 2*8 {
			t.Fatalf("captured %d bodies, want 16", len(bodies))
		}
		for k, body := range bodies {
			if !bytes.Contains(body, []byte(": t=")) || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
				t.Fatalf("body %v:\n%s", k, body)
			}
		}
		if cmp := rec.Compare(0, 1); cmp.Pairs != 8 {
			t.Errorf("%d pairs", cmp.Pairs)
		}

		// A non-streamed body is captured whole.
		c.Workload.Stream = false
		c.Capture = func(s *Sample, raw *Raw) {
			if !bytes.HasPrefix(raw.Body, []byte(`{"id":"chatcmpl-`)) || len(raw.Lines) != 0 {
				t.Errorf("non-streamed capture: %q, %d lines", raw.Body, len(raw.Lines))
			}
		}
		run(t, c)
	})
}
