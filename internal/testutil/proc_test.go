package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process is started, found ready by polling, killed, started again on
// the same command and log, and stopped by its signal.
func TestProcLifecycle(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	// Ready once it has written its file; SIGTERM ends it with a word.
	script := `trap 'echo bye; exit 0' TERM; echo "run $$"; touch ` + ready + `; while :; do sleep 0.05; done`
	p := StartProc(t, exec.Command("sh", "-c", script), ProcOptions{Name: "sh", StopSignal: syscall.SIGTERM, StopGrace: 10 * time.Second})
	fileExists := func() error { _, err := os.Stat(ready); return err }
	if err := p.WaitReady(10*time.Second, fileExists); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == 0 || p.Exited() {
		t.Fatalf("running: pid %d, exited %v", p.Pid(), p.Exited())
	}
	first := p.Pid()
	p.Kill()
	if p.Pid() != 0 || !p.Exited() || p.State() == nil || p.State().Success() {
		t.Fatalf("killed: pid %d, exited %v, state %v", p.Pid(), p.Exited(), p.State())
	}
	p.Kill() // killing a stopped process does nothing

	os.Remove(ready)
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(10*time.Second, fileExists); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == first {
		t.Fatalf("restarted with the same pid %d", first)
	}
	done := p.Done()
	p.Stop()
	<-done
	if !p.State().Success() || !strings.Contains(p.Log.Tail(1000), "bye") {
		t.Fatalf("stopped by SIGTERM: state %v, log %q", p.State(), p.Log.Tail(1000))
	}
	if runs := strings.Count(p.Log.Tail(1000), "run "); runs != 2 {
		t.Fatalf("%d runs in the log, want 2:\n%s", runs, p.Log.Tail(1000))
	}
}

// A process that exits before it is ready, or is not ready in time, is an
// error that carries its log.
func TestProcNotReady(t *testing.T) {
	p := StartProc(t, exec.Command("sh", "-c", "echo cannot bind; exit 3"), ProcOptions{Name: "quitter"})
	err := p.WaitReady(10*time.Second, func() error { return os.ErrNotExist })
	if err == nil || !strings.Contains(err.Error(), "quitter exited before it was ready") || !strings.Contains(err.Error(), "cannot bind") {
		t.Fatalf("exited: %v", err)
	}
	p = StartProc(t, exec.Command("sh", "-c", "echo waiting; exec sleep 60"), ProcOptions{Name: "sleeper"})
	err = p.WaitReady(100*time.Millisecond, func() error { return os.ErrNotExist })
	if err == nil || !strings.Contains(err.Error(), "sleeper not ready within 100ms") {
		t.Fatalf("slow: %v", err)
	}
	Eventually(t, 10*time.Second, func() bool { return strings.Contains(p.Log.Tail(100), "waiting") }, "the sleeper's output")
	if !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("slow: no log in %v", err)
	}
}

// A log file keeps the output on disk and gives back its end.
func TestFileLog(t *testing.T) {
	l, err := CreateLog(filepath.Join(t.TempDir(), "p.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := StartProc(t, exec.Command("sh", "-c", "echo 0123456789"), ProcOptions{Log: l})
	<-p.Done()
	if got := l.Tail(4); got != "…789\n" {
		t.Errorf("Tail(4) = %q", got)
	}
}

// fatal records a failure instead of ending the test.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}

func (f *fatal) Fatalf(format string, args ...any) { f.msg = format }

// Eventually returns once the condition holds, and fails naming what it
// waited for when it never does.
func TestEventually(t *testing.T) {
	n := 0
	f := &fatal{TB: t}
	Eventually(f, 10*time.Second, func() bool { n++; return n == 3 }, "the third call")
	if f.msg != "" || n != 3 {
		t.Fatalf("held at call %d, failed %q", n, f.msg)
	}
	Eventually(f, 50*time.Millisecond, func() bool { return false }, "never")
	if f.msg == "" {
		t.Fatal("a condition that never holds did not fail")
	}
}
