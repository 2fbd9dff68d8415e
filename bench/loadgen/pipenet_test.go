package loadgen

import (
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/infergate/infergate/bench/internal/pacer"
	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil/pipenet"
)

// virtual runs f in a synctest bubble with an in-memory network (the pacer
// off: its goroutine, started in a bubble, would never let it settle).
// Timings measured there are exact, however busy the machine.
func virtual(t *testing.T, f func(t *testing.T, n *pipeNet)) {
	t.Helper()
	was := pacer.SetEnabled(false)
	defer pacer.SetEnabled(was)
	synctest.Test(t, func(t *testing.T) { f(t, &pipeNet{}) })
}

type pipeNet struct{ pipenet.Net }

// serve starts srv on a new host of n, stopped at t's cleanup, and returns
// its base URL.
func (n *pipeNet) serve(t *testing.T, srv *http.Server) string {
	l := n.Listen()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// mock starts a mock upstream with cfg on n.
func (n *pipeNet) mock(t *testing.T, cfg mock.Config, wrap func(http.Handler) http.Handler) (m *mock.Server, url string, conns *atomic.Int64) {
	m, srv, conns := mockServer(cfg, wrap)
	return m, n.serve(t, srv), conns
}

// config is baseConfig against urls on n.
func (n *pipeNet) config(urls ...string) Config {
	cfg := baseConfig(urls...)
	cfg.Dial = n.Dial
	return cfg
}
