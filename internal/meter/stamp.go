package meter

import (
	"slices"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

// End is how a request's response ended, and what the meter's
// adapter learnt of it beyond what the meter read.
type End struct {
	At       time.Time // the response's end, as read (or as the in-Envoy meter timed it)
	Complete bool      // the response ended whole
	// Trusted: what the gate decided reached the meter intact, once (the
	// ext_proc adapter: its sealed field verified and its seal was
	// claimed first).
	Trusted bool
	// Uncertain: the field verified but its claim was not answered (the
	// store did not reply): the stamp is marked, the reservation kept whole.
	Uncertain bool
	Stalls    []Stall // when infergate did not run (stampClock); unused when Envoy timed the stream
	// PoolName names a pool (an Envoy cluster) as the stamp shows it.
	PoolName func(string) string
	Prices   *price.Table // the models' prices; nil prices nothing
}

// Outcome is what the meter makes of one request once its response
// ended: the stamp, when the request left the gateway, when its response
// ended, and what settles it.
type Outcome struct {
	Stamp request.Stamp
	Sent  time.Time // the departure, as stampClock dated it
	// End is the response's end: its terminal event's arrival ([DONE])
	// when the client left right there.
	End time.Time
	Cut bool // Envoy closed the stream before the response ended
	// Usage is the pool's usage as it is charged (an output reported alone
	// takes the gate's estimate as its input); nil: none read.
	Usage       *openai.Usage
	Reservation string // the gate's reservation; "" once the field is not trusted
	Uncertain   bool   // the field's claim was not answered: the reservation is kept whole
}

// StampOf is the meter's arithmetic for one request whose response ended
// (m's tally closed): the stamp's times (TTFT, E2E, the gateway's, the
// total), its timing verdict (stampClock), its counts and their source, the
// gaps' percentiles, its bounds, and what an untrusted field may not say.
// It reads m and changes nothing.
func StampOf(m *Request, e End) Outcome {
	t := &m.Tally
	o := Outcome{Stamp: m.Stamp, Sent: m.Sent, End: e.At, Cut: m.Cut, Reservation: m.Reservation}
	st := &o.Stamp
	st.PoolsTried = slices.Clone(st.PoolsTried) // named in place below
	st.Complete = e.Complete
	if at, ok := t.Terminal(); ok && !st.Complete { // the client left at [DONE]
		st.Complete, o.End, o.Cut = true, at, false
	}
	st.API, st.ResponseModel, st.ContentEvents, st.ITLMax = t.API, t.Model, t.ContentEvents, t.ITLMax
	// The response's counts, range-checked: they are charged to a budget.
	// An input reported ahead of the output replaces the gate's estimate;
	// an output reported alone takes it as its input.
	if t.HasInput {
		st.PromptTokens = ClampInt(float64(t.Input), 0, MaxTokens)
		st.CachedTokens, st.CacheWriteTokens = cacheParts(st.PromptTokens, t.InputCached, t.InputCacheWrite)
	}
	o.Usage = t.Usage
	if o.Usage != nil && t.OutputOnly {
		o.Usage = &openai.Usage{PromptTokens: st.PromptTokens, CompletionTokens: o.Usage.CompletionTokens}
	}
	st.Bound() // before anything uses it: labels, the settlement, the sinks
	if !e.Trusted {
		// Who called and what the gate decided are the gate's word only
		// in a sealed field that verified, once: anything else (no field,
		// an unsealed one, a forgery, a replay) settles nothing and is
		// recorded under no tenant's name, and feeds no controller.
		st.Tenant, st.Principal, st.Reason = "", "", ""
		st.Decision, st.Unverified = "unverified", true
		o.Reservation = ""
	}
	if e.Trusted && e.Uncertain {
		st.Verification, o.Uncertain = request.ClaimUncertain, true
	}
	for i, p := range st.PoolsTried {
		st.PoolsTried[i] = e.PoolName(p)
	}
	st.Pool = e.PoolName(st.Pool)
	if st.Decision == "" {
		st.Decision = "allow"
	}
	st.Timing = request.TimingOK
	if !m.EnvoyTimed {
		v := stampClock(clockFacts{envoyStart: m.EnvoyStart, gateSent: m.GateSent, departed: o.Sent,
			picked: st.Endpoint != "", firstRead: t.First, endRead: o.End, stalls: e.Stalls})
		o.Sent, st.Timing, st.Gateway.Picker = v.sent, v.timing, v.picker
	}
	st.E2E = o.End.Sub(o.Sent)
	if !t.First.IsZero() {
		st.TTFT = t.First.Sub(o.Sent)
	}
	st.Sent, st.Start = o.Sent, o.Sent
	if !m.EnvoyStart.IsZero() {
		// External checks (moderation) happen before the request leaves but
		// are neither gateway nor model time: the stamp keeps them apart.
		// The start is Envoy's clock, the rest infergate's: where they
		// disagree by more than the gateway took, its time is 0 and the
		// start moves, so that Total stays the sum of the parts.
		st.Start = m.EnvoyStart
		if earliest := o.Sent.Add(-st.Gateway.Checks); earliest.Before(st.Start) {
			st.Start = earliest
		}
		st.Gateway.Total = o.Sent.Sub(st.Start) - st.Gateway.Checks
	}
	st.Total = o.End.Sub(st.Start)
	switch {
	case o.Usage != nil:
		st.TokenSource = "usage"
		st.PromptTokens = ClampInt(float64(o.Usage.PromptTokens), 0, MaxTokens)
		st.CompletionTokens = ClampInt(float64(o.Usage.CompletionTokens), 0, MaxTokens)
		st.CachedTokens, st.CacheWriteTokens = cacheParts(st.PromptTokens, o.Usage.CachedTokens, o.Usage.CacheWriteTokens)
	case t.SSE:
		st.TokenSource = "events"
		st.CompletionTokens = st.ContentEvents
	}
	st.Cost = costOf(st, e.Prices)
	st.Gaps = t.Gaps
	// What the meter could not read (the response itself passed untouched).
	st.UnreadEvents = t.Unread()
	if len(t.Gaps) > 0 {
		sorted := slices.Clone(t.Gaps)
		slices.Sort(sorted)
		st.ITLP50 = stats.Percentile(sorted, 0.50)
		st.ITLP95 = stats.Percentile(sorted, 0.95)
	}
	return o
}

// cacheParts range-checks the cached parts of a prompt of prompt tokens:
// a part out of range (negative, or more than the prompt left) is 0, so
// those tokens are priced as input, never less.
func cacheParts(prompt, cached, written int) (int, int) {
	cached = ClampInt(float64(cached), 0, prompt)
	return cached, ClampInt(float64(written), 0, prompt-cached)
}

// costOf is st's cost at its model's price on its pool, from its tokens:
// the pool's usage, or what the meter counted (marked Counted). A request
// of no priced model, whose tokens were not read, or that ran no model
// (count_tokens: its count is no usage) costs nothing here.
func costOf(st *request.Stamp, prices *price.Table) request.Cost {
	if st.TokenSource == "" || st.API == openai.APICountTokens {
		return request.Cost{}
	}
	p, src, ok := prices.Lookup(st.Model, st.Pool)
	if !ok {
		return request.Cost{}
	}
	return request.Cost{
		Amount: p.Cost(price.Tokens{Prompt: st.PromptTokens, Cached: st.CachedTokens,
			CacheWrite: st.CacheWriteTokens, Completion: st.CompletionTokens}),
		Currency: prices.Currency, Price: string(src), Counted: st.TokenSource != "usage",
	}
}

// SettlementOf is what the meter saw of o's request, for admission to
// settle (the accounting rule is admission's), or nil: a request that was
// denied or whose field is not trusted settles nothing.
//
// One settlement per request, for the attempt that answered. The meter is
// a downstream filter: when Envoy retries (on the next pool, or the same),
// its router keeps a failed attempt's response to itself and forwards only
// the one it finally answers with, so this stream sees, and charges, the
// last attempt alone (the stamp's Attempts, the last of PoolsTried). A
// failed attempt is charged nothing: Envoy retries only before a response
// has started downstream, so none of its tokens reached the client, and
// what its pool spent on it (a prefill before a reset or a per-try
// timeout) is never seen here. An attempt that fails after its response
// started is not retried: it is the answering one, reported as it ended
// (admission keeps its reservation unless its usage or its end was seen).
// (Hedged requests, which the routes infergate serves never configure,
// would break "the last attempt".)
func SettlementOf(m *Request, o *Outcome) *request.Settlement {
	st, t := &o.Stamp, &m.Tally
	if st.Decision == "deny" || st.Unverified {
		return nil
	}
	s := &request.Settlement{RequestID: st.RequestID, Tenant: st.Tenant, Reservation: o.Reservation, ClaimUncertain: o.Uncertain,
		API: st.API, Status: st.Status, Origin: m.Origin, SSE: t.SSE, End: request.EndLost,
		Terminal: t.Ended() || m.Ended, UsageRead: o.Usage != nil,
		PromptTokens: st.PromptTokens, InputReported: t.HasInput || o.Usage != nil && !t.OutputOnly,
		Events: st.ContentEvents, Principal: st.Principal, Model: st.Model, Pool: st.Pool,
		NeverSent: m.Unsent != "" && m.Origin == request.OriginEnvoy}
	if o.Usage != nil {
		s.CompletionTokens = st.CompletionTokens
		s.CachedTokens, s.CacheWriteTokens = st.CachedTokens, st.CacheWriteTokens
	}
	switch {
	case st.Complete:
		s.End = request.EndComplete
	case o.Cut:
		s.End = request.EndCut
	}
	return s
}
