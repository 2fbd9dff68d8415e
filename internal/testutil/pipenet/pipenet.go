// Package pipenet is an in-memory network for tests that run servers and
// clients inside a testing/synctest bubble. A dial is a net.Pipe whose
// other end the listener of the dialled host accepts. Blocking on a pipe
// is durable (a real socket's is not), so the bubble's clock moves only
// when the servers and clients all wait for it: what a test then measures
// is exact, on any machine, however busy.
package pipenet

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Net is a set of hosts; the zero value is ready to use.
type Net struct {
	mu    sync.Mutex
	hosts map[string]*listener
}

// Listen adds a host to n and returns its listener, whose Addr is the
// host's "name:port" (host-N.test:80) for URLs.
func (n *Net) Listen() net.Listener {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hosts == nil {
		n.hosts = map[string]*listener{}
	}
	addr := addr(fmt.Sprintf("host-%d.test:80", len(n.hosts)))
	l := &listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
	n.hosts[string(addr)] = l
	return l
}

// Dial connects to the host at addr, as net.Dialer.DialContext does (for
// http.Transport.DialContext).
func (n *Net) Dial(ctx context.Context, _, addr string) (net.Conn, error) {
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

type listener struct {
	addr  addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *listener) Addr() net.Addr { return l.addr }

type addr string

func (addr) Network() string  { return "pipe" }
func (a addr) String() string { return string(a) }
