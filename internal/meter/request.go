// Package meter is the meter's core, with no Envoy types: one request's
// state as an adapter feeds it (what the gate decided, the response's
// headers, each chunk with its arrival time), and, once the response ended,
// the stamp (StampOf) and the facts that settle its reservation
// (SettlementOf). The ext_proc adapter (extproc) and the in-Envoy meter's
// summaries feed it alike; counting is internal/tally's.
package meter

import (
	"slices"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/tally"
)

// Request is the meter's per-request state. Everything it holds is
// bounded: the response's count (Tally) and the stamp.
type Request struct {
	// Stamp is the stamp as the adapter read it so far: what the gate
	// decided (range-checked), the response's status, upstream, pools.
	Stamp request.Stamp
	Sent  time.Time // the request left the gateway (see Departure, stampClock)
	// EnvoyTimed: the times are Envoy's own (the in-Envoy meter's summary),
	// not infergate's reads: nothing of infergate's can have held them up.
	EnvoyTimed bool
	GateSent   time.Time // when the gate answered (its clock)
	EnvoyStart time.Time // Envoy's request.time
	Tally      tally.Response
	Cut        bool // Envoy closed the stream before the response's end
	// Origin is who wrote the response, from Envoy's response.code_details;
	// Unsent is that detail when it proves no pool was asked (UnsentBy).
	Origin request.Origin
	Unsent string
	// Ended: the stream's terminal event was seen, as the in-Envoy meter's
	// summary tells it (the ext_proc meter reads it from its tally).
	Ended bool
	// Reservation is the rate-limit charge the gate made, settled here.
	Reservation string
	// GateTraceparent is the gate's span, the parent when Envoy sends none.
	GateTraceparent string
}

// New is one request's meter state: at most maxGaps inter-token gaps kept,
// an SSE line of at most maxEventBytes carried across chunks.
func New(maxGaps, maxEventBytes int) *Request {
	m := &Request{}
	m.Tally.MaxGaps, m.Tally.Parser.MaxLine = maxGaps, maxEventBytes
	return m
}

// Chunk counts a chunk of the response body that arrived at `at`.
func (m *Request) Chunk(b []byte, at time.Time) { m.Tally.Body(b, at) }

// Served records the pools the request's attempts went to, in order (see
// PoolOrders.ServingPools): the last one served the response.
func (m *Request) Served(tried []string) {
	m.Stamp.PoolsTried = tried
	if n := len(tried); n > 0 {
		m.Stamp.Pool = tried[n-1]
	}
}

// Departure is when the request left the gateway, for a meter that did not
// get its request headers (a filter with request_header_mode SKIP), seen at
// `at`, the response headers' arrival.
//
// With the request headers the meter stamps their arrival: Envoy sends them
// once the gate has answered, as the request goes upstream, and TTFT and
// E2E are then two arrivals on one stream, one clock; stampClock checks
// that arrival against the gate's answer (a late read is marked). Without them it takes
// the moment the gate answered, from its field: earlier by Envoy's handling
// of the answer and its routing (measured at 0.4–0.9 ms on a loaded
// 2-CPU machine, moved from the gateway's time into TTFT), and on the gate's
// clock, another replica's when gate and meter streams land on different
// ones. Skipping them saved nothing measurable (Envoy 1.40, non-streamed and
// streamed, ±5 % run to run), so the shipped configs send them, with no
// metadata and only the headers the meter reads. The time is bounded by
// what the meter knows: never before Envoy received the request
// (request.time) nor after the response reached the meter, and within the
// hour before that (as every duration the gate reports). Without the
// gate's field (a gate that wrote none), Envoy's request.time: the
// gateway's time then counts as the upstream's.
func (m *Request) Departure(at time.Time) time.Time {
	t := m.GateSent
	if t.IsZero() {
		t = m.EnvoyStart
	}
	if !m.EnvoyStart.IsZero() && t.Before(m.EnvoyStart) {
		t = m.EnvoyStart
	}
	if t.IsZero() || t.After(at) || t.Before(at.Add(-time.Hour)) {
		t = at
	}
	return t
}

// OriginOf is who wrote a response, by Envoy's response.code_details:
// "via_upstream" is the pool's answer, any other detail one of Envoy's own
// local replies (a timeout, no healthy upstream, a reset before the
// response); none, a config that does not ask for it.
func OriginOf(details string) request.Origin {
	switch details {
	case "":
		return request.OriginUnknown
	case "via_upstream":
		return request.OriginPool
	}
	return request.OriginEnvoy
}

// KnownAPI is s, the API a gate's field names, when the meter knows it: the
// field may come from anything that reaches the port.
func KnownAPI(s string) openai.API {
	if a := openai.API(s); a.Operation() != "" {
		return a
	}
	return ""
}

// neverSentDetails are the local replies Envoy writes only before its router
// has asked any pool for the request: no route matched, the route's
// cluster does not exist, the cluster had no host to send it to. Each
// proves that nothing was spent; every other local reply (a timeout, a
// reset, an overflow) may follow a request a pool received, and keeps the
// reservation. Kept short on purpose: a detail joins only when Envoy's
// router can write it before an upstream request alone.
var neverSentDetails = []string{"route_not_found", "cluster_not_found", "no_healthy_upstream"}

// UnsentBy is details when it proves that Envoy answered before any pool
// was asked (neverSentDetails), with no upstream address and at most the
// first attempt counted beside it (a retry that found no healthy host had
// an attempt before it); "" otherwise.
func UnsentBy(details string, attempts int, upstream string) string {
	if !slices.Contains(neverSentDetails, details) || upstream != "" || attempts > 1 {
		return ""
	}
	return details
}
