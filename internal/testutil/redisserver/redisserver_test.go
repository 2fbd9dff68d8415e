package redisserver

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ping(t *testing.T, addr string) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if got := string(buf[:n]); got != "+PONG\r\n" {
		t.Fatalf("PING answered %q", got)
	}
	return nil
}

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	addr := s.Addr()
	if !strings.HasPrefix(addr, "127.0.0.1:") || s.Port() == 0 {
		t.Fatalf("Addr = %q, Port = %d", addr, s.Port())
	}
	if err := ping(t, addr); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	s.Stop()
	if err := ping(t, addr); err == nil {
		t.Fatal("PING answered after Stop")
	}
	s.Stop() // no-op
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Restart moved from %s to %s", addr, s.Addr())
	}
	if err := ping(t, addr); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	s.Restart() // while running
	if err := ping(t, addr); err != nil {
		t.Fatalf("PING after a second Restart: %v", err)
	}
}

// Two servers at once get different ports.
func TestTwoServers(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr() == b.Addr() {
		t.Fatalf("both servers on %s", a.Addr())
	}
}

func TestBinary(t *testing.T) {
	t.Setenv("REDIS_SERVER", filepath.Join(t.TempDir(), "missing"))
	if _, err := binary(); err == nil || !strings.Contains(err.Error(), "REDIS_SERVER") {
		t.Errorf("binary() with a missing REDIS_SERVER = %v", err)
	}
	t.Setenv("REDIS_SERVER", "")
	t.Setenv("PATH", t.TempDir())
	if _, err := binary(); err == nil || !strings.Contains(err.Error(), "install-test-deps.sh") {
		t.Errorf("binary() without redis-server = %v, want an install hint", err)
	}
}

// A durable server killed and restarted still has what it acknowledged;
// a plain one comes back empty.
func TestDurableSurvivesKill(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testing.TB) *Server
		want  string
	}{{"durable", StartDurable, "$1\r\n7\r\n"}, {"plain", Start, "$-1\r\n"}} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.start(t)
			if got := command(t, s.Addr(), "SET k 7"); got != "+OK\r\n" {
				t.Fatalf("SET answered %q", got)
			}
			s.Stop() // SIGKILL
			s.Restart()
			if got := command(t, s.Addr(), "GET k"); got != tc.want {
				t.Fatalf("GET after kill and restart answered %q, want %q", got, tc.want)
			}
		})
	}
}

// command sends one inline command and returns the raw reply.
func command(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}
