package loadgen

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Progress reports a run on w: a bar redrawn in place when w is a
// terminal, otherwise a plain line once a second (logs stay readable).
type Progress struct {
	w        io.Writer
	tty      bool
	label    string
	total    int           // requests expected, if known
	duration time.Duration // run length, if known
	start    time.Time

	done, failed atomic.Int64
	stop         chan struct{}
	wg           sync.WaitGroup
}

// StartProgress starts reporting. total (requests over all targets and
// phases) or duration, whichever is known, scales the bar; both may be 0.
func StartProgress(w io.Writer, label string, total int, duration time.Duration) *Progress {
	p := &Progress{w: w, tty: isTerminal(w), label: label, total: total, duration: duration,
		start: time.Now(), stop: make(chan struct{})}
	every := time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	p.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				p.draw(false)
			}
		}
	})
	return p
}

// Observe counts a completed request; use it as (part of) Config.OnSample.
func (p *Progress) Observe(s *Sample) {
	if !s.OK() {
		p.failed.Add(1)
	}
	p.done.Add(1)
}

// Stop ends the reporting with a final line.
func (p *Progress) Stop() {
	close(p.stop)
	p.wg.Wait()
	p.draw(true)
}

func (p *Progress) draw(final bool) {
	elapsed := time.Since(p.start)
	done, failed := p.done.Load(), p.failed.Load()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	counts := fmt.Sprintf("%d", done)
	if p.total > 0 {
		counts = fmt.Sprintf("%d/%d", done, p.total)
	}
	line := fmt.Sprintf("%s%s requests, %d failed, %.1f req/s, %s", p.label, counts, failed, rate, elapsed.Round(time.Second))
	if final {
		line = fmt.Sprintf("%s%s requests, %d failed, in %s", p.label, counts, failed, elapsed.Round(time.Millisecond))
	}
	if !p.tty {
		fmt.Fprintln(p.w, line)
		return
	}
	frac := 0.0
	switch {
	case final:
		frac = 1
	case p.total > 0:
		frac = float64(done) / float64(p.total)
	case p.duration > 0:
		frac = elapsed.Seconds() / p.duration.Seconds()
	}
	const width = 24
	filled := int(min(max(frac, 0), 1) * width)
	bar := "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] "
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r\033[K%s%s%s", bar, line, end)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
