package loadgen

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/infergate/infergate/bench/internal/pacer"
	"github.com/infergate/infergate/bench/mock"
)

// pipeNet is an in-memory network for tests in a synctest bubble: a dial
// is a net.Pipe whose other end the target's http.Server accepts. Blocking
// on a pipe is durable, so the bubble's clock moves only when the mock, the
// client and the runner all wait for it: a run's timings are then exact, on
// any machine, however busy.
type pipeNet struct {
	mu    sync.Mutex
	hosts map[string]*pipeListener
}

// serve starts h on a new host of the network, stopped at t's cleanup, and
// returns its base URL.
func (n *pipeNet) serve(t *testing.T, srv *http.Server) string {
	n.mu.Lock()
	if n.hosts == nil {
		n.hosts = map[string]*pipeListener{}
	}
	host := fmt.Sprintf("target-%d.test:80", len(n.hosts))
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	n.hosts[host] = l
	n.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + host
}

func (n *pipeNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.hosts[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: fmt.Errorf("no host %s", addr)}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: net.ErrClosed}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// virtual runs f in a synctest bubble with an in-memory network (the pacer
// off: its goroutine, started in a bubble, would never let it settle).
func virtual(t *testing.T, f func(t *testing.T, n *pipeNet)) {
	t.Helper()
	was := pacer.SetEnabled(false)
	defer pacer.SetEnabled(was)
	synctest.Test(t, func(t *testing.T) { f(t, &pipeNet{}) })
}

// mock starts a mock upstream with cfg on n, in virtual time.
func (n *pipeNet) mock(t *testing.T, cfg mock.Config, wrap func(http.Handler) http.Handler) (m *mock.Server, url string, conns *atomic.Int64) {
	m, srv, conns := mockServer(cfg, wrap)
	return m, n.serve(t, srv), conns
}

// config is baseConfig against urls on n.
func (n *pipeNet) config(urls ...string) Config {
	cfg := baseConfig(urls...)
	cfg.dial = n.dial
	return cfg
}
