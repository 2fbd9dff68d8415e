// Package redisserver runs a throwaway redis-server for tests: no
// persistence, loopback only, a random free port, stopped when the test
// ends.
//
// The binary is $REDIS_SERVER if set, else redis-server on PATH
// (scripts/install-test-deps.sh installs it). A missing binary fails the
// test: tests that need Redis never skip silently.
package redisserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// StartTimeout bounds how long Start and Restart wait for the server to
// answer PING.
const StartTimeout = 10 * time.Second

// Server is a running (or stopped) redis-server.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	// durable: every write is in the append-only file before Redis
	// answers (appendfsync always), so a killed server restarts with
	// every acknowledged counter.
	durable bool

	mu   sync.Mutex
	proc *testutil.Proc   // nil while stopped
	log  *testutil.Buffer // output of every run, dumped when the test fails
}

// Start runs redis-server on a free loopback port and waits until it
// answers PING. The server is stopped by t.Cleanup; its log is printed
// only if the test failed.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, false)
}

// StartDurable is Start with the append-only file on and fsynced on every
// write, as a deployment that must not lose charges runs Redis: Restart
// then brings back every acknowledged write.
func StartDurable(t testing.TB) *Server {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, durable bool) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if durable {
		dir = memDir(t)
	}
	s := &Server{t: t, bin: bin, dir: dir, log: &testutil.Buffer{}, durable: durable}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("redis-server %s log:\n%s", s.Addr(), s.log.String())
		}
	})
	// The port is found free and then handed to redis-server, so another
	// process may take it in between: try a few ports.
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redisserver: finding a free port: %v", err)
		}
		s.port = port
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("redisserver: %v", lastErr)
	return nil
}

// memDir is a temp dir in memory (/dev/shm) where there is one, else on
// disk. A durable server's append-only file must survive the server's
// kill, which a file in memory does; on a disk other processes write to
// (builds, links), fsync waits behind their data, for hundreds of
// milliseconds, past the timeouts of the clients under test.
func memDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "redisserver-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Addr is the server's host:port.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// Stop kills the server (SIGKILL, as a crash would) and waits for it to
// exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart stops the server if it runs and starts a new one on the same
// port (empty, unless it is durable), waiting until it answers PING.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := retry(s.start); err != nil {
		s.t.Fatalf("redisserver: restart on port %d: %v", s.port, err)
	}
}

// retry runs start until it succeeds or StartTimeout passes: a port our
// own process just released may not be free again yet.
func retry(start func() error) error {
	deadline := time.Now().Add(StartTimeout)
	for {
		err := start()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start runs redis-server on s.port and waits for PING.
func (s *Server) start() error {
	args := []string{"--save", "", "--dir", s.dir, "--appendonly", "no"}
	if s.durable {
		args = []string{"--save", "", "--dir", s.dir, "--appendonly", "yes", "--appendfsync", "always"}
	}
	p, err := run(s.bin, s.port, s.log, args...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// run starts redis-server on the loopback port with more args, its output
// to log, and waits until it answers PING as itself; on failure it is
// killed.
func run(bin string, port int, log *testutil.Buffer, args ...string) (*testutil.Proc, error) {
	fmt.Fprintf(log, "--- starting %s on port %d %v\n", bin, port, args)
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--daemonize", "no", "--logfile", ""}, args...)...)
	p, err := testutil.Start(cmd, testutil.ProcOptions{Name: fmt.Sprintf("redis-server on port %d", port), Log: log})
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := p.WaitReady(StartTimeout, func() error { return probe(addr, p.Pid()) }); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// probe sends PING and INFO server, and checks that the server answers
// PONG and is the process pid (not some other server that took the port).
func probe(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "$"))
	if err != nil || !strings.HasPrefix(line, "$") {
		return fmt.Errorf("INFO answered %q", strings.TrimSpace(line))
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(r, info); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(pid) + "\r\n"
	if !bytes.Contains(info, []byte(want)) {
		return fmt.Errorf("port %s is served by another redis-server", addr)
	}
	return nil
}

// binary finds redis-server.
func binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("redisserver: REDIS_SERVER=%s: %w", p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redisserver: redis-server not found on PATH and REDIS_SERVER is not set; " +
			"install it with `eval \"$(scripts/install-test-deps.sh)\"` (Debian: apt-get install redis-server) " +
			"or point REDIS_SERVER at a redis-server binary")
	}
	return p, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
