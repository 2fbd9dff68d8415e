package module

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/sse"
)

// filter is one request: the gate on its way in, the meter on its way out.
// Envoy calls it on one worker thread; the decision runs on a goroutine of
// its own and hands its plan back through mu and the SDK's scheduler.
type filter struct {
	shared.EmptyHttpFilter
	opts *Options
	h    shared.HttpFilterHandle

	started time.Time
	headers map[string]string // the request's, copied out of Envoy's map
	body    []byte            // the request body, copied once whole
	api     openai.API
	// answered: the request got its answer (admitted and resumed, or a
	// local reply); nothing more is owed on the way in.
	answered bool

	mu sync.Mutex // guards the hand-off between the decision and Envoy's thread
	// pending is a decided plan not yet applied; over: the stream is
	// complete, so a plan that arrives now is released, never applied.
	pending *decision
	over    bool
	// applying is the plan apply is writing: a panic there gives its
	// reservation back (the request never reaches a pool).
	applying *decision

	// The meter: set once the plan is applied (admitted), nil otherwise.
	m           *meter.Request
	respHeaders map[string]any    // the policy's x-ratelimit-* of an admitted request, set on its response
	ended       bool              // the response's end of stream was seen
	meterBroken bool              // a panic on the response path: nothing settles by this count
	gateSpan    trace.SpanContext // the gate's span: the meter's parent
	// unasked removes the usage event the gate asked the pool for on the
	// client's behalf (plan.UsageAdded), after the meter has read it.
	unasked *sse.UsageStripper
}

// decision is what the goroutine decided: the plan and the verdict.
type decision struct {
	adm      *request.Admission
	policyAt time.Time // when the policy was asked
	v        request.Verdict
	plan     gate.Plan
	fail     *openai.Error // the decision itself failed (a panic): answered as it is
	// listed is the gate's own answer to GET /v1/models (Catalog), nil
	// for any other request.
	listed *gate.Listed
}

// OnRequestHeaders reads the headers, refuses an unauthenticated caller at
// once, and holds the request for its body (or decides now without one).
func (f *filter) OnRequestHeaders(hm shared.HeaderMap, endOfStream bool) (st shared.HeadersStatus) {
	defer f.recovered("request_headers", func() { st = shared.HeadersStatusStop })
	f.started = time.Now()
	f.headers = headersOf(hm)
	hook(f.headers, "request_headers")
	adm, _ := f.opts.Intake.Headless(f.headers, nil)
	policyAt := time.Now()
	if v := f.opts.Policy.Identify(context.Background(), adm); v.Deny != nil && v.Decision != "shadow_deny" {
		f.api = adm.API
		f.denyAt("", v, policyAt)
		return shared.HeadersStatusStop
	}
	if endOfStream {
		f.decide()
		return shared.HeadersStatusStop
	}
	return shared.HeadersStatusStop
}

// OnRequestBody lets Envoy buffer the body (bounded by its buffer limit
// and by the gate's), then decides on the whole of it.
func (f *filter) OnRequestBody(body shared.BodyBuffer, endOfStream bool) (st shared.BodyStatus) {
	defer f.recovered("request_body", func() { st = shared.BodyStatusStopNoBuffer })
	if f.answered {
		return shared.BodyStatusContinue
	}
	size := f.h.BufferedRequestBody().GetSize() + body.GetSize()
	if size > uint64(f.opts.Intake.MaxBodyBytes) {
		e := gate.TooLarge(int(min(size, 1<<40)), f.opts.Intake.MaxBodyBytes)
		f.deny("", request.Verdict{Deny: e, Reason: e.Code})
		return shared.BodyStatusStopNoBuffer
	}
	if !endOfStream {
		return shared.BodyStatusStopAndBuffer
	}
	f.body = make([]byte, 0, size)
	for _, c := range f.h.BufferedRequestBody().GetChunks() {
		f.body = append(f.body, c.ToUnsafeBytes()...)
	}
	for _, c := range body.GetChunks() {
		f.body = append(f.body, c.ToUnsafeBytes()...)
	}
	f.decide()
	return shared.BodyStatusStopAndBuffer
}

// OnRequestTrailers: a request with trailers ends here, not at its body.
func (f *filter) OnRequestTrailers(shared.HeaderMap) (st shared.TrailersStatus) {
	defer f.recovered("request_trailers", func() { st = shared.TrailersStatusStop })
	if f.answered {
		return shared.TrailersStatusContinue
	}
	if f.body == nil {
		for _, c := range f.h.BufferedRequestBody().GetChunks() {
			f.body = append(f.body, c.ToUnsafeBytes()...)
		}
		f.decide()
	}
	return shared.TrailersStatusStop
}

// decide validates the request on Envoy's thread (cheap, and a refusal
// needs no goroutine), then asks the policy on a goroutine: Redis, Rego
// and external checks may block, Envoy's worker must not. The plan comes
// back through the scheduler, which runs apply on the worker thread.
func (f *filter) decide() {
	adm, removed, verr := f.opts.Intake.Admission(f.headers, nil, f.body)
	f.api = adm.API
	if verr != nil {
		f.deny(adm.Request.Model, request.Verdict{Deny: verr, Reason: verr.Code})
		return
	}
	id, one, listing := f.opts.Catalog.Request(adm.Method, adm.Path)
	sched := f.h.GetScheduler() // created here, on the worker thread
	go func() {
		d := &decision{adm: adm}
		defer func() {
			if r := recover(); r != nil {
				f.logPanic("decide", r)
				d.fail = gateError()
				if d.v.Reservation != "" {
					f.release(adm.RequestID, d.v.Reservation)
					d.v.Reservation = ""
				}
			}
			f.handOff(sched, d)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
		defer cancel()
		d.policyAt = time.Now()
		if listing {
			l := f.opts.Catalog.Answer(ctx, f.opts.Policy, adm, id, one, settleTimeout)
			d.listed, d.v = &l, l.V
			d.v.Reservation = "" // settled by Answer: nothing to give back
			return
		}
		d.v = f.opts.Policy.Decide(ctx, adm)
		hook(f.headers, "decide")
		d.plan = gate.PlanOf(f.opts.Rules, adm, removed, d.v)
	}()
}

// handOff gives the decision to Envoy's thread, or releases its
// reservation when the request is already over (the client left).
func (f *filter) handOff(sched shared.Scheduler, d *decision) {
	f.mu.Lock()
	if f.over {
		f.mu.Unlock()
		if d.v.Reservation != "" && d.fail == nil && d.plan.Deny == nil {
			f.release(d.adm.RequestID, d.v.Reservation)
		}
		return
	}
	f.pending = d
	f.mu.Unlock()
	sched.Schedule(func() {
		defer f.recovered("apply", nil)
		f.apply()
	})
}

// apply answers the request by its plan, on Envoy's thread: a denial, a
// failure (500, the reservation given back), or the mutations, after
// which Envoy routes it and the meter takes the response.
func (f *filter) apply() {
	f.mu.Lock()
	d := f.pending
	f.pending = nil
	f.mu.Unlock()
	if d == nil || f.answered {
		return
	}
	p := &d.plan
	switch {
	case d.fail == nil && d.listed != nil:
		f.list(d)
		return
	case d.fail != nil:
		f.deny(d.adm.Request.Model, request.Verdict{Deny: d.fail, Reason: d.fail.Code})
		return
	case p.Deny != nil:
		f.denyAt(p.Stamp.Model, d.v, d.policyAt)
		return
	case p.Fail != nil:
		f.release(d.adm.RequestID, d.v.Reservation)
		f.opts.Logger.Error("gate cannot forward an admitted request", "err", p.Fail)
		e := gateError()
		f.deny(d.adm.Request.Model, request.Verdict{Deny: e, Reason: e.Code})
		return
	}
	// From here the request is admitted; a panic before it continues
	// fails it closed and gives the reservation back.
	f.applying, f.respHeaders = d, p.Metadata
	hm := f.h.RequestHeaders()
	for _, k := range p.Remove {
		hm.Remove(k)
	}
	for _, s := range p.Set {
		hm.Set(s.Key, s.Value)
	}
	if p.Body != nil {
		b := f.h.BufferedRequestBody()
		b.Drain(b.GetSize())
		b.Append(p.Body)
	}
	m := meter.New(f.opts.MaxTrackedGaps, f.opts.MaxEventBytes)
	m.Stamp = p.Stamp
	m.Stamp.Gateway.Gate = time.Since(f.started) - d.v.Timings.Checks // external checks are not the gateway's time
	ctx := context.Background()
	f.opts.Meters.Decided(ctx, p.Stamp.Decision, p.Code, m.Stamp.Gateway.Gate)
	f.gateSpan = observe.GateSpan(ctx, f.opts.Tracer, f.started, d.policyAt, time.Now(), &m.Stamp)
	f.opts.Meters.MeterStreams.Add(ctx, 1)
	m.Reservation, m.Tally.API = p.Reservation, p.Stamp.API
	f.m, f.answered, f.applying = m, true, nil
	if p.UsageAdded {
		f.unasked = &sse.UsageStripper{}
	}
	f.h.ClearRouteCache() // the route is chosen on the model header just set
	m.Sent = time.Now()
	m.GateSent, m.EnvoyStart = m.Sent, f.started
	f.h.ContinueRequest()
}

// deny answers the request with the gate's error, in the style its API
// expects, and stamps it.
func (f *filter) deny(model string, v request.Verdict) { f.denyAt(model, v, time.Time{}) }

// denyAt is deny of a request the policy was asked about at policyAt.
func (f *filter) denyAt(model string, v request.Verdict, policyAt time.Time) {
	f.answered = true
	st := gate.Answered(gate.Answer{RequestID: f.headers["x-request-id"], Model: model, API: f.api, Status: v.Deny.Status,
		Decision: "deny", Started: f.started, Took: time.Since(f.started)}, v)
	ctx := context.Background()
	f.opts.Meters.Decided(ctx, "deny", v.Deny.Code, st.Gateway.Gate)
	if sc := observe.GateSpan(ctx, f.opts.Tracer, f.started, policyAt, time.Now(), &st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	f.opts.Logger.LogAttrs(context.Background(), slog.LevelInfo, "request denied",
		slog.String("request_id", st.RequestID), slog.Int("status", v.Deny.Status),
		slog.String("code", v.Deny.Code), slog.String("message", request.Truncate(v.Deny.Message, request.MaxStampReason)))
	f.record(&st)
	f.localReply(v.Deny, v.Headers)
}

// list answers GET /v1/models from the catalog, as the ext_proc gate does:
// a refusal as any other, else 200 with the models the caller may call.
func (f *filter) list(d *decision) {
	l := d.listed
	if l.Refused {
		f.denyAt(l.Model, l.V, d.policyAt)
		return
	}
	f.answered = true
	decision := cmp.Or(l.V.Decision, "allow")
	st := gate.Answered(gate.Answer{RequestID: f.headers["x-request-id"], Model: l.Model, Status: http.StatusOK,
		Decision: decision, Started: f.started, Took: time.Since(f.started)}, l.V)
	ctx := context.Background()
	f.opts.Meters.Decided(ctx, decision, "allowed", st.Gateway.Gate)
	if sc := observe.GateSpan(ctx, f.opts.Tracer, f.started, d.policyAt, time.Now(), &st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	f.record(&st)
	hdrs := [][2]string{{"content-type", "application/json"}, {request.ErrorHeader, ""}}
	for k, v := range l.V.Metadata {
		if s, ok := v.(string); ok && strings.HasPrefix(k, "x-ratelimit-") {
			hdrs = append(hdrs, [2]string{k, s})
		}
	}
	f.h.SendLocalResponse(http.StatusOK, hdrs, l.Body, "infergate_models")
}

// localReply sends e as Envoy's local reply: OpenAI's error body, or
// Anthropic's on its paths; the same headers as the ext_proc gate's.
func (f *filter) localReply(e *openai.Error, extra map[string]string) {
	body := e.JSON()
	path, _, _ := strings.Cut(f.headers[":path"], "?")
	if openai.APIOf(path).Anthropic() {
		body = e.AnthropicJSON()
	}
	hdrs := make([][2]string, 0, 2+len(extra))
	hdrs = append(hdrs, [2]string{"content-type", "application/json"}, [2]string{request.ErrorHeader, e.Code})
	for k, v := range extra {
		hdrs = append(hdrs, [2]string{k, v})
	}
	f.h.SendLocalResponse(uint32(e.Status), hdrs, body, "infergate_"+e.Code)
}

// OnResponseHeaders reads what the meter needs of the response's start.
func (f *filter) OnResponseHeaders(hm shared.HeaderMap, endOfStream bool) shared.HeadersStatus {
	defer f.recovered("response_headers", nil)
	m := f.m
	if m == nil {
		return shared.HeadersStatusContinue
	}
	for k, v := range f.respHeaders { // OpenAI's x-ratelimit-* (ext_proc's config sets them from the gate's metadata)
		if s, ok := v.(string); ok && strings.HasPrefix(k, "x-ratelimit-") {
			hm.Set(k, s)
		}
	}
	m.Stamp.Status = meter.ClampInt(float64(atoi(hm.GetOne(":status").ToUnsafeString())), 100, 599)
	m.Tally.SSE = strings.HasPrefix(hm.GetOne("content-type").ToUnsafeString(), "text/event-stream")
	details, _ := f.h.GetAttributeString(shared.AttributeIDResponseCodeDetails)
	m.Origin = meter.OriginOf(details.ToUnsafeString())
	if up, ok := f.h.GetAttributeString(shared.AttributeIDUpstreamAddress); ok {
		m.Stamp.Upstream = up.ToString()
	}
	attempts, _ := f.h.GetAttributeNumber(shared.AttributeIDUpstreamRequestAttemptCount)
	m.Stamp.Attempts = meter.ClampInt(attempts, 0, meter.MaxAttempts)
	m.Unsent = meter.UnsentBy(details.ToString(), m.Stamp.Attempts, m.Stamp.Upstream)
	if c, ok := f.h.GetAttributeString(shared.AttributeIDXdsClusterName); ok && c.Len > 0 {
		tried := make([]string, max(m.Stamp.Attempts, 1))
		for i := range tried {
			tried[i] = c.ToString()
		}
		m.Served(tried)
	}
	hook(f.headers, "response_headers")
	f.ended = endOfStream
	return shared.HeadersStatusContinue
}

// OnResponseBody counts each chunk as it passes: views into Envoy's
// buffers, never held (Continue per chunk). Only on a stream whose usage
// the gate asked for is a chunk rewritten, when it holds (part of) that
// usage event: the meter reads it first.
func (f *filter) OnResponseBody(body shared.BodyBuffer, endOfStream bool) shared.BodyStatus {
	defer f.recovered("response_body", nil)
	if f.m == nil || f.meterBroken {
		return shared.BodyStatusContinue
	}
	at := time.Now()
	chunks := body.GetChunks()
	for _, c := range chunks {
		f.m.Chunk(c.ToUnsafeBytes(), at)
	}
	if f.unasked != nil {
		f.dropUnasked(body, chunks, endOfStream)
	}
	hook(f.headers, "response_body")
	if endOfStream {
		f.ended = true
	}
	return shared.BodyStatusContinue
}

// dropUnasked passes body through f.unasked. A chunk it leaves whole stays
// Envoy's; once one changes, the body is replaced by what the stripper let
// through (copied, only then). At the end of the stream, what it still
// held follows.
func (f *filter) dropUnasked(body shared.BodyBuffer, chunks []shared.UnsafeEnvoyBuffer, endOfStream bool) {
	var out []byte
	changed := false
	for i, c := range chunks {
		b, ch := f.unasked.Strip(c.ToUnsafeBytes())
		if ch && !changed {
			changed = true
			for _, before := range chunks[:i] {
				out = append(out, before.ToUnsafeBytes()...)
			}
		}
		if changed {
			out = append(out, b...) // b may be the stripper's buffer: copied before the next Strip
		}
	}
	var held []byte
	if endOfStream {
		held = f.unasked.End()
	}
	if changed {
		body.Drain(body.GetSize())
		body.Append(append(out, held...))
	} else if len(held) > 0 {
		body.Append(held)
	}
}

// OnResponseTrailers ends the response (gRPC-style trailers).
func (f *filter) OnResponseTrailers(shared.HeaderMap) shared.TrailersStatus {
	defer f.recovered("response_trailers", nil)
	f.ended = true
	return shared.TrailersStatusContinue
}

// OnStreamComplete stamps and settles the request; a plan still on its
// way is released, never applied.
func (f *filter) OnStreamComplete() {
	defer f.recovered("stream_complete", nil)
	f.mu.Lock()
	f.over = true
	d := f.pending
	f.pending = nil
	f.mu.Unlock()
	if d != nil && d.v.Reservation != "" && d.fail == nil && d.plan.Deny == nil {
		f.release(d.adm.RequestID, d.v.Reservation)
	}
	if f.m == nil {
		return
	}
	f.opts.Meters.MeterStreams.Add(context.Background(), -1)
	if f.meterBroken {
		return
	}
	m, end, complete := f.m, time.Now(), f.ended
	f.m = nil
	m.Cut = !complete
	go func() { // the settlement may block (Redis): off Envoy's thread
		defer func() {
			if r := recover(); r != nil {
				f.logPanic("settle", r)
			}
		}()
		f.finish(m, end, complete)
	}()
}

// finish stamps a request whose response ended at end and settles it.
func (f *filter) finish(m *meter.Request, end time.Time, complete bool) {
	m.Tally.End(end)
	e := meter.End{At: end, Complete: complete, Trusted: true, PoolName: poolName, Prices: f.opts.Prices}
	if f.opts.Stalls != nil && !m.EnvoyTimed {
		e.Stalls = f.opts.Stalls.Recent(time.Now())
	}
	o := meter.StampOf(m, e)
	st := &o.Stamp
	ctx := context.Background()
	f.opts.Meters.Stamped(ctx, &m.Tally, st)
	if s := meter.SettlementOf(m, &o); s != nil {
		if s.NeverSent {
			f.opts.Meters.CountUnsent(ctx, m.Unsent)
		}
		sctx, cancel := context.WithTimeout(ctx, settleTimeout)
		f.opts.Policy.Settle(sctx, s)
		cancel()
	}
	parent := trace.ContextWithSpanContext(ctx, f.gateSpan)
	if sc := observe.MeterSpan(parent, f.opts.Tracer, o.Sent, m.Tally.First, o.End, st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	f.record(st)
}

func poolName(p string) string { return p }

func (f *filter) record(st *request.Stamp) {
	f.opts.Meters.Record(context.Background(), st)
	for _, s := range f.opts.Sinks {
		s.Record(context.Background(), st)
	}
}

// release gives back a reservation whose request never reached a pool.
func (f *filter) release(requestID, reservation string) {
	if reservation == "" {
		return
	}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				f.logPanic("release", r)
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		f.opts.Policy.Release(ctx, requestID, reservation)
	}()
}

// recovered ends a callback that panicked without taking Envoy down: a
// request not yet answered fails closed (503 gate_error) and gives its
// reservation back; on the response path the meter stops (its
// reservation stays charged: nothing proved less) and the response
// passes untouched. then sets the callback's status.
func (f *filter) recovered(where string, then func()) {
	r := recover()
	if r == nil {
		return
	}
	f.logPanic(where, r)
	if then != nil {
		then()
	}
	defer func() { // answering must not panic again
		if r := recover(); r != nil {
			f.logPanic(where+"_answer", r)
		}
	}()
	switch {
	case !f.answered:
		f.answered = true
		f.mu.Lock()
		f.over = true // a decision still on its way is released
		f.mu.Unlock()
		if d := f.applying; d != nil {
			f.applying = nil
			f.release(d.adm.RequestID, d.v.Reservation)
		}
		f.localReply(openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "gate_error", "", "internal gateway error"), nil)
	case f.m != nil:
		f.meterBroken = true
	}
}

func (f *filter) logPanic(where string, r any) {
	f.opts.Meters.Panics.Add(context.Background(), 1, panicAttr)
	f.opts.Logger.Error("infergate module panicked; the request fails closed, Envoy serves on",
		"where", where, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
}

// panicAttr labels infergate.extproc.panics of the module.
var panicAttr = metric.WithAttributes(attribute.String("role", "module"))

func gateError() *openai.Error {
	return openai.NewError(http.StatusInternalServerError, openai.TypeServer, "gate_error", "", "internal gateway error")
}

// headersOf copies Envoy's request headers (names are lower-case in
// Envoy), the first value of each: they outlive the callback.
func headersOf(hm shared.HeaderMap) map[string]string {
	all := hm.GetAll()
	h := make(map[string]string, len(all))
	for _, kv := range all {
		k := kv[0].ToUnsafeString()
		if _, ok := h[k]; !ok {
			h[strings.Clone(k)] = kv[1].ToString()
		}
	}
	return h
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return n
}
