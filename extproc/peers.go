package extproc

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/peer"

	"github.com/infergate/infergate/internal/openai"
)

// DefaultMaxGateStreamsPerPeer is Options.MaxGateStreamsPerPeer's default:
// far above the gate streams one Envoy keeps open (each lasts while Envoy
// reads a request, then closes), so only a peer that holds streams on
// purpose meets it.
const DefaultMaxGateStreamsPerPeer = 4096

// peerStreams counts the gate streams each peer holds open, up to a bound
// per peer. A peer is an IP address, over all its connections; streams
// from anything else (a unix: socket) are one peer.
type peerStreams struct {
	max  int
	mu   sync.Mutex
	open map[netip.Addr]int // peers with a stream open only: as many as there are streams at most
}

// acquire takes a stream for peer, or reports that it holds max already.
func (p *peerStreams) acquire(peer netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[peer] >= p.max {
		return false
	}
	p.open[peer]++
	return true
}

// release gives back a stream acquire took.
func (p *peerStreams) release(peer netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.open[peer] - 1; n > 0 {
		p.open[peer] = n
	} else {
		delete(p.open, peer)
	}
}

// peerAddr is the IP address of the stream's peer; the zero Addr for a
// peer without one (a unix: socket).
func peerAddr(ctx context.Context) netip.Addr {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok {
			return a.AddrPort().Addr().Unmap()
		}
	}
	return netip.Addr{}
}

// overloaded answers a gate stream beyond its peer's bound: 503
// gate_overloaded at once, whatever the request (the gate fails closed:
// a request it will not decide never reaches a pool).
func (s *Server) overloaded(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, first *extprocv3.ProcessingRequest) error {
	e := openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "gate_overloaded", "",
		"the gateway is handling too many requests from this peer; retry shortly")
	s.metrics.GateDecisions.Add(ctx, 1, s.meters.DecisionAttrs("deny", e.Code))
	g := &gateRequest{}
	if h, ok := first.Request.(*extprocv3.ProcessingRequest_RequestHeaders); ok {
		g.headers = headersFrom(h.RequestHeaders.GetHeaders()) // the style of the error: the path's API
	}
	return stream.Send(g.immediate(e, setHeader("retry-after", "1")))
}
