//go:build !linux

package pacer

// newPacer: without a timerfd, sleepers use runtime timers.
func newPacer() *pacer { return nil }
