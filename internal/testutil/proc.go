package testutil

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Log receives a process's output and gives back its end, for messages.
// A *Buffer keeps everything in memory; a *FileLog keeps it on disk.
type Log interface {
	io.Writer
	Tail(n int) string
}

// ProcOptions say how a process is named, logged and stopped.
type ProcOptions struct {
	// Name names the process in messages.
	Name string
	// Log receives the standard output and error the command does not
	// already send elsewhere; nil: a new Buffer.
	Log Log
	// StopSignal asks the process to end (Stop); nil: Stop kills at once.
	StopSignal os.Signal
	// StopGrace is how long Stop waits after StopSignal before it kills.
	StopGrace time.Duration
}

// Proc is a process started for a test or a harness: its output kept, its
// readiness polled with a deadline, stopped by its PID. It may be killed,
// frozen and started again with the same command.
type Proc struct {
	ProcOptions
	spec *exec.Cmd // what Restart runs again

	mu     sync.Mutex
	cmd    *exec.Cmd // nil while stopped
	exited chan struct{}
	state  *os.ProcessState // of the last run that ended
}

// Start runs cmd (its Path, Args, Env, Dir, SysProcAttr, Stdout and
// Stderr: what Restart runs again). It is not waited for: see WaitReady.
func Start(cmd *exec.Cmd, o ProcOptions) (*Proc, error) {
	if o.Name == "" {
		o.Name = cmd.Path
	}
	if o.Log == nil {
		o.Log = &Buffer{}
	}
	p := &Proc{ProcOptions: o, spec: cmd}
	return p, p.run()
}

// StartProc starts cmd for t: stopped (Stop) when t ends, its log printed
// if t failed.
func StartProc(t testing.TB, cmd *exec.Cmd, o ProcOptions) *Proc {
	t.Helper()
	p, err := Start(cmd, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", p.Name, p.Log.Tail(64<<10))
		}
	})
	return p
}

// run starts a new process of p's command.
func (p *Proc) run() error {
	cmd := exec.Command(p.spec.Path, p.spec.Args[1:]...)
	cmd.Env, cmd.Dir, cmd.SysProcAttr = p.spec.Env, p.spec.Dir, p.spec.SysProcAttr
	var log io.Writer = p.Log
	if f, ok := p.Log.(*FileLog); ok {
		log = f.File // the process writes it itself: no copying in this one
	}
	cmd.Stdout, cmd.Stderr = cmp.Or[io.Writer](p.spec.Stdout, log), cmp.Or[io.Writer](p.spec.Stderr, log)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

// Restart starts p's command again (stop it first). It is not waited for.
func (p *Proc) Restart() error {
	fmt.Fprintf(p.Log, "--- restart %s\n", time.Now().Format(time.TimeOnly))
	return p.run()
}

// WaitReady polls ready until it returns nil, failing if the process exits
// first or timeout passes; the error carries the end of its log.
func (p *Proc) WaitReady(timeout time.Duration, ready func() error) error {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready (%v); log:\n%s", p.Name, p.State(), p.Log.Tail(4000))
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v (%v); log:\n%s", p.Name, timeout, err, p.Log.Tail(4000))
		}
	}
}

// Pid is the current run's process id; 0 once Kill or Stop ended it.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited reports whether the current run has ended.
func (p *Proc) Exited() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// Done is closed when the current run ends.
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// State is how the last run ended; nil while it runs.
func (p *Proc) State() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Signal sends sig to the running process (SIGSTOP freezes it, SIGCONT
// resumes it).
func (p *Proc) Signal(sig os.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill ends the process at once (SIGKILL, as a crash or the OOM killer
// would) and waits for it; killing a stopped process does nothing.
func (p *Proc) Kill() { p.stop(nil, 0) }

// Stop asks the process to end with StopSignal, kills it if it has not
// within StopGrace (at once without a StopSignal), and waits for it.
// Stopping a stopped process does nothing.
func (p *Proc) Stop() { p.stop(p.StopSignal, p.StopGrace) }

func (p *Proc) stop(sig os.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if sig != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a frozen process cannot act on sig
		_ = cmd.Process.Signal(sig)
		select {
		case <-exited:
			return
		case <-time.After(grace):
		}
	}
	_ = cmd.Process.Kill()
	<-exited
}

// HTTPReady is a readiness check: url answers 200.
func HTTPReady(url string) func() error {
	client := &http.Client{Timeout: time.Second}
	return func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", url, resp.Status)
		}
		return nil
	}
}

// FileLog is a process's log kept in a file: for long runs whose output
// would not fit in memory, and for reading after the run.
type FileLog struct {
	*os.File
}

// CreateLog creates (or truncates) path for a process's log.
func CreateLog(path string) (*FileLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &FileLog{f}, nil
}

// Tail is the last n bytes written.
func (l *FileLog) Tail(n int) string {
	b, err := os.ReadFile(l.Name())
	if err != nil {
		return err.Error()
	}
	return tail(b, n)
}
