package testutil

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing t (naming what it waited
// for) if timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
