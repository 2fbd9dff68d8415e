package mock

import (
	"os"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/internal/pacer"
)

// The package's tests run servers inside synctest bubbles, which the
// pacer's goroutine would never let settle if a bubble started it; the test
// below turns it on for itself.
func TestMain(m *testing.M) {
	pacer.SetEnabled(false)
	os.Exit(m.Run())
}

// The stream path with the pacer, on the wall clock: never early, on
// absolute deadlines. How late is BenchmarkWakeLateness's to measure
// (bench/internal/pacer).
func TestCadenceOnPacer(t *testing.T) {
	pacer.SetEnabled(true)
	defer pacer.SetEnabled(false)
	_, ts := newTestServer(t, Config{TTFT: 30 * time.Millisecond, ITL: 10 * time.Millisecond})
	events, _ := streamRequest(t, ts, "/v1/chat/completions", cadenceBody, nil)
	p := parseStream(t, events, true)
	if len(p.contentT) != 10 {
		t.Fatalf("%d content events, want 10", len(p.contentT))
	}
	for k, at := range p.contentT {
		if due := 30*time.Millisecond + time.Duration(k)*10*time.Millisecond; at < due {
			t.Errorf("content event %d at %v, before its deadline %v", k, at, due)
		}
	}
}
