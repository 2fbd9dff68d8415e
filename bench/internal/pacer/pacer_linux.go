package pacer

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// timerfd_create(2) arguments: CLOCK_MONOTONIC is the clock of Go's
// monotonic readings; TFD_NONBLOCK and TFD_CLOEXEC are O_NONBLOCK and
// O_CLOEXEC.
const clockMonotonic = 1

type itimerspec struct {
	interval syscall.Timespec
	value    syscall.Timespec
}

// newPacer creates a timerfd and a goroutine that reads it through the
// runtime's poller (the fd is non-blocking, so os.NewFile registers it
// there) and calls fire at each expiry. It returns nil if there is no
// timerfd.
func newPacer() *pacer {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic,
		syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil
	}
	p := &pacer{arm: func(d time.Duration) {
		// Relative: d was just computed from the same monotonic clock.
		// It cannot fail with a valid fd and spec, and if it did the
		// sleepers' runtime timers would still wake them.
		spec := itimerspec{value: syscall.NsecToTimespec(d.Nanoseconds())}
		_, _, _ = syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	}}
	f := os.NewFile(fd, "pacer-timerfd")
	go func() {
		var expirations [8]byte
		for {
			if _, err := f.Read(expirations[:]); err != nil {
				return // never closed; the runtime timers carry on alone
			}
			p.fire()
		}
	}()
	return p
}
