package mock

import (
	"os"
	"testing"

	"github.com/infergate/infergate/bench/internal/pacer"
)

// The package's tests run servers inside synctest bubbles, which the
// pacer's goroutine would never let settle if a bubble started it; the test
// below turns it on for itself.
func TestMain(m *testing.M) {
	pacer.SetEnabled(false)
	os.Exit(m.Run())
}

// The stream path with the pacer, with TestCadence's checks (never early,
// absolute deadlines, the median gap).
func TestCadenceOnPacer(t *testing.T) {
	pacer.SetEnabled(true)
	defer pacer.SetEnabled(false)
	TestCadence(t)
}
