package extproc

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// DefaultMaxWaitingBodiesPerPrincipal is
// Options.MaxWaitingBodiesPerPrincipal's default: a sixteenth of
// DefaultMaxGateStreamsPerPeer, so that one key, or one tenant, holding
// bodies on purpose leaves the gate to the others; far above what a client
// uploading prompts at any honest speed keeps waiting (a body arrives in
// milliseconds).
const DefaultMaxWaitingBodiesPerPrincipal = 256

// DefaultBodyTimeout is Options.BodyTimeout's default: a request body
// (at most gate.maxBodyBytes, 1 MiB by default) that has not arrived this
// long after its headers is not coming at any useful speed.
const DefaultBodyTimeout = 30 * time.Second

// waiter is one count of waitingBodies: a key (the principal's id) or a
// tenant.
type waiter struct {
	tenant bool
	id     string
}

// waitingBodies counts the gate streams each caller holds between its
// request headers (where the gate knows who it is) and its body's end, per
// key and per tenant, up to max each: a caller that holds bodies back
// holds its own streams, not the gate's. Only callers with a stream
// waiting are kept, so the map is no larger than the streams open (each
// bounded per peer).
type waitingBodies struct {
	max  int
	mu   sync.Mutex
	held map[waiter]int
}

// acquire takes a waiting stream for the principal and its tenant (either
// may be "": not counted), or reports which of them holds max already.
func (w *waitingBodies) acquire(principal, tenant string) (taken []waiter, full *waiter) {
	want := make([]waiter, 0, 2)
	if principal != "" {
		want = append(want, waiter{id: principal})
	}
	if tenant != "" {
		want = append(want, waiter{tenant: true, id: tenant})
	}
	if len(want) == 0 {
		return nil, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range want {
		if w.held[want[i]] >= w.max {
			return nil, &want[i]
		}
	}
	for _, k := range want {
		w.held[k]++
	}
	return want, nil
}

// release gives back what acquire took.
func (w *waitingBodies) release(taken []waiter) {
	if len(taken) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range taken {
		if n := w.held[k] - 1; n > 0 {
			w.held[k] = n
		} else {
			delete(w.held, k)
		}
	}
}

// await counts g, whose caller v identified, as waiting for its body, or
// refuses it (429) when its key or tenant already holds as many as it may.
// nil: go on reading the body.
func (s *Server) await(ctx context.Context, g *gateRequest, v request.Verdict) []*extprocv3.ProcessingResponse {
	g.principal, g.tenant = v.Principal, v.Tenant
	taken, full := s.waiting.acquire(v.Principal, v.Tenant)
	if full == nil {
		g.waits, g.awaiting = taken, true
		if len(taken) > 0 {
			s.metrics.WaitingBodies.Add(ctx, 1)
		}
		return nil
	}
	who := "this API key"
	if full.tenant {
		who = "this tenant"
	}
	e := openai.NewError(http.StatusTooManyRequests, openai.TypeRateLimit, "too_many_waiting_bodies", "",
		who+" already has "+strconv.Itoa(s.waiting.max)+" requests whose body has not arrived; send or cancel them first")
	s.log.Warn("a caller holds too many requests waiting for their body; refused", "principal", request.Truncate(v.Principal, request.MaxStampField),
		"tenant", request.Truncate(v.Tenant, request.MaxStampField), "tenant_full", full.tenant, "max", s.waiting.max)
	return s.deny(ctx, g, "", request.Verdict{Deny: e, Reason: e.Code, Principal: v.Principal, Tenant: v.Tenant,
		Headers: map[string]string{"retry-after": "1"}})
}

// stopWaiting: g's body is in, or its stream over; idempotent.
func (s *Server) stopWaiting(g *gateRequest) {
	if len(g.waits) > 0 {
		s.metrics.WaitingBodies.Add(context.Background(), -1)
	}
	s.waiting.release(g.waits)
	g.waits, g.awaiting = nil, false
}

// bodyTimedOut answers a request whose body did not arrive within
// Options.BodyTimeout of its headers: 408, stamped under its caller.
func (s *Server) bodyTimedOut(ctx context.Context, g *gateRequest) *extprocv3.ProcessingResponse {
	s.stopWaiting(g)
	e := openai.NewError(http.StatusRequestTimeout, openai.TypeInvalidRequest, "request_body_timeout", "",
		"the request body did not arrive within "+s.opts.BodyTimeout.String())
	return s.deny(ctx, g, "", request.Verdict{Deny: e, Reason: e.Code, Principal: g.principal, Tenant: g.tenant})[0]
}

// received is one stream.Recv's result.
type received struct {
	msg *extprocv3.ProcessingRequest
	err error
}

// receive reads stream on a goroutine of its own, until it fails or ctx
// is done, so that the gate can wait for the next message and a deadline
// at once. The gate starts it once it awaits a body, and watches the
// stream's own context beside it: a reader cut off by ctx delivers
// nothing.
func receive(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer) <-chan received {
	ch := make(chan received)
	go func() {
		for {
			msg, err := stream.Recv()
			select {
			case ch <- received{msg, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
