package mock

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// lockstepIDs is what an id may be: short and plain, as it names a URL path.
var lockstepIDs = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// maxLockstepGates bounds the gates a server keeps (they live until
// Forget): more are refused, so a runaway client cannot grow the map.
const maxLockstepGates = 4096

// Lockstep is one lock-step stream's gate: what the client acknowledged,
// and when the mock wrote each event.
type Lockstep struct {
	mu      sync.Mutex
	acked   int           // events the client received: 0 .. acked-1
	changed chan struct{} // closed (and replaced) on each acknowledgement
	emitted []time.Time   // when each event was written, just before its write
}

// Ack records that the client received event n (and so every event before
// it); the mock may then write event n+1.
func (l *Lockstep) Ack(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n+1 > l.acked {
		l.acked = n + 1
		close(l.changed)
		l.changed = make(chan struct{})
	}
}

// Emitted returns when each event written so far left the mock: taken
// before the write began, so no observer downstream can have seen event k
// before Emitted()[k]. The times are the mock's clock (time.Now, with its
// monotonic reading).
func (l *Lockstep) Emitted() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.emitted...)
}

// await blocks until event seq may be written (event seq-1 acknowledged)
// or ctx ends, then records seq's emit time.
func (l *Lockstep) await(ctx context.Context, seq int) error {
	for {
		l.mu.Lock()
		if l.acked >= seq {
			l.emitted = append(l.emitted, time.Now())
			l.mu.Unlock()
			return nil
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lockstepGates are a server's gates by id.
type lockstepGates struct {
	mu    sync.Mutex
	gates map[string]*Lockstep
}

var errTooManyGates = errors.New("mock: too many lock-step streams; Forget finished ones")

func (g *lockstepGates) get(id string) (*Lockstep, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l := g.gates[id]; l != nil {
		return l, nil
	}
	if len(g.gates) >= maxLockstepGates {
		return nil, errTooManyGates
	}
	if g.gates == nil {
		g.gates = map[string]*Lockstep{}
	}
	l := &Lockstep{changed: make(chan struct{})}
	g.gates[id] = l
	return l, nil
}

// Lockstep returns the gate of the lock-step stream named id, creating it:
// a test takes it before sending its request with x-mock-lockstep: id, and
// acknowledges each event on it. It panics on an id the header would
// refuse, or when maxLockstepGates are held.
func (s *Server) Lockstep(id string) *Lockstep {
	if !lockstepIDs.MatchString(id) {
		panic("mock: invalid lock-step id " + strconv.Quote(id))
	}
	l, err := s.lockstep.get(id)
	if err != nil {
		panic(err)
	}
	return l
}

// Forget drops the gate named id (a stream still using it keeps it).
func (s *Server) Forget(id string) {
	s.lockstep.mu.Lock()
	delete(s.lockstep.gates, id)
	s.lockstep.mu.Unlock()
}

// lockstepOf is the gate a request's x-mock-lockstep header names, nil
// without one.
func (s *Server) lockstepOf(h http.Header) (*Lockstep, error) {
	id := h.Get("x-mock-lockstep")
	if id == "" {
		return nil, nil
	}
	if !lockstepIDs.MatchString(id) {
		return nil, errors.New("invalid x-mock-lockstep header: want 1 to 64 of [A-Za-z0-9_.-]")
	}
	return s.lockstep.get(id)
}

// handleLockstepAck is POST /mock/lockstep/{id}/ack?n=N: the client
// received event N of the stream named id.
func (s *Server) handleLockstepAck(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 || n >= maxOutputTokens*maxChoices || !lockstepIDs.MatchString(id) {
		writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_ack", "want POST /mock/lockstep/<id>/ack?n=<event number>")
		return
	}
	l, err := s.lockstep.get(id)
	if err != nil {
		writeError(w, http.StatusTooManyRequests, typeRateLimit, "too_many_lockstep", err.Error())
		return
	}
	l.Ack(n)
	w.WriteHeader(http.StatusNoContent)
}
