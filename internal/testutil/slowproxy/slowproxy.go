// Package slowproxy is a TCP proxy for tests that holds a server's replies:
// put between a client and a real server (Redis), it makes the client's
// reads time out while the server has run what it was sent, as a slow or
// overloaded store does.
package slowproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections to a target. The reply to a request may be
// held: a request is what one read of the client gave, its reply what the
// next read of the server gives (a client that sends one command at a
// time, as go-redis does outside pipelines).
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	match []byte        // the requests whose replies are held contain it
	hold  int           // replies still to hold
	delay time.Duration // how long each is held
	every bool          // hold every reply until Hold is called again
	held  atomic.Int64
	conns map[net.Conn]struct{}
	done  chan struct{}
	wg    sync.WaitGroup
}

// Start listens on a loopback port and forwards to target until the test
// ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Hold makes the replies to the next n requests that contain match (any
// request when match is "") wait d each before they are forwarded (a
// client whose read timed out meanwhile has closed its connection: the
// reply is dropped with it). Hold("", 0, 0) forwards every reply at once
// again.
func (p *Proxy) Hold(match string, n int, d time.Duration) {
	p.mu.Lock()
	p.match, p.hold, p.delay, p.every = []byte(match), n, d, false
	p.mu.Unlock()
}

// HoldAll makes every reply wait d until Hold is called.
func (p *Proxy) HoldAll(d time.Duration) {
	p.mu.Lock()
	p.match, p.hold, p.delay, p.every = nil, 0, d, true
	p.mu.Unlock()
}

// Held is how many replies were held so far.
func (p *Proxy) Held() int64 { return p.held.Load() }

// take reports how long the reply to request is held (0: not).
func (p *Proxy) take(request []byte) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.every:
	case p.hold > 0 && bytes.Contains(request, p.match):
		p.hold--
	default:
		return 0
	}
	p.held.Add(1)
	return p.delay
}

// Close stops the proxy and cuts its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
	}
	close(p.done)
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go p.pipe(client)
	}
}

// pipe forwards one connection: each request as it comes, noting how long
// its reply is held; either side closing closes both.
func (p *Proxy) pipe(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(server) {
		return
	}
	defer p.untrack(server)
	var next atomic.Int64 // how long the reply to the last request is held, in ns
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer server.Close()
		defer client.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				next.Store(int64(p.take(buf[:n])))
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if d := time.Duration(next.Swap(0)); d > 0 {
				select {
				case <-time.After(d):
				case <-p.done:
					return
				}
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
