// Package vtime helps tests that run in virtual time (testing/synctest).
package vtime

import (
	"testing/synctest"
	"time"
)

// Advance moves the bubble's clock on by d and lets everything due run
// until it blocks again. It must be called inside a synctest bubble.
func Advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}
