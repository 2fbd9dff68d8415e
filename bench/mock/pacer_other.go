//go:build !linux

package mock

// newPacer: without a timerfd, sleepers use runtime timers.
func newPacer() *pacer { return nil }
