package extproc

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/tally"
)

// settleTimeout bounds settling a reservation once the response ended,
// whether or not the stream that carried it is still there.
const settleTimeout = 2 * time.Second

// meterRequest is the meter's per-request state. Everything it holds is
// bounded: the response's count (tally) and the stamp.
type meterRequest struct {
	stamp  request.Stamp
	sentAt time.Time // the request left the gateway (see departure, stampClock)
	// envoyTimed: the times are Envoy's own (the in-Envoy meter's summary),
	// not infergate's reads: nothing of infergate's can have held them up.
	envoyTimed bool
	// seen: this stream is a request's, to be stamped: the meter saw its
	// request headers or what the gate decided.
	seen       bool
	gate       gateSource // where what the gate decided came from
	gateSent   time.Time  // when the gate answered (its clock), from its field
	envoyStart time.Time  // Envoy's request.time
	tally      tally.Response
	orders     *poolOrders
	cut        bool // Envoy closed the stream before the response's end
	// origin is who wrote the response, from Envoy's response.code_details;
	// unsent is that detail when it proves no pool was asked (unsentBy).
	origin request.Origin
	unsent string
	// ended: the stream's terminal event was seen, as the in-Envoy meter's
	// summary tells it (the ext_proc meter reads it from its tally).
	ended bool
	// reservation is the rate-limit charge the gate made, settled here.
	reservation string
	// gateTraceparent is the gate's span, the parent when Envoy sends none.
	gateTraceparent string
	// sealer opens the gate's field; fieldSeal is the seal of a field that
	// verified, claimed once the response ended.
	sealer    FieldSealer
	fieldSeal fieldSeal
}

// meter runs the observing filter. In observability mode (recommended)
// Envoy sends copies and never waits for an answer, so nothing here can
// slow or break the response; the meter only reads until the response
// ends, then stamps the request. Configured as a blocking filter instead,
// Envoy holds every part until it is answered: the meter then lets each
// one through unchanged, before reading it.
func (s *Server) meter(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer,
	msg *extprocv3.ProcessingRequest, arrived time.Time) (err error) {
	// A panic drops this stream's record (counted), never the process: the
	// meter only observes, so the response itself is untouched.
	defer func() {
		if r := recover(); r != nil {
			_ = s.recovered(ctx, "meter", r)
			err = nil
		}
	}()
	m := s.newMeterRequest()
	blocking := !msg.GetObservabilityMode()
	s.metrics.MeterStreams.Add(ctx, 1)
	defer s.metrics.MeterStreams.Add(ctx, -1)
	for {
		if blocking {
			if resp := passThrough(msg); resp != nil {
				if err := stream.Send(resp); err != nil {
					s.finish(ctx, m, s.now(), false)
					return err
				}
			}
		}
		if done := m.observe(msg, arrived); done {
			s.finish(ctx, m, arrived, true)
			return nil
		}
		if msg, err = stream.Recv(); err != nil {
			// io.EOF: Envoy closed the stream because the response ended
			// early (client or pool reset); anything else: the stream broke.
			m.cut = errors.Is(err, io.EOF)
			s.finish(ctx, m, s.now(), false)
			return err
		}
		arrived = s.now()
	}
}

// newMeterRequest is one request's meter state, bounded as configured.
func (s *Server) newMeterRequest() *meterRequest {
	m := &meterRequest{orders: &s.orders, sealer: s.sealer}
	m.tally.MaxGaps, m.tally.Parser.MaxLine = s.opts.MaxTrackedGaps, s.opts.MaxEventBytes
	return m
}

// gateSource ranks where the meter learnt what the gate decided: the gate's
// field (as an attribute, or in its forwarded namespace) over the
// namespace of one key per field that older Envoy configs forward.
type gateSource uint8

const (
	fromNothing gateSource = iota
	fromStruct
	fromField
)

// observe takes one message; it reports true when the response is complete.
//
// What the meter reads, and where Envoy puts it (envoy/snippet.yaml): with
// the request headers, the gate's field and request.time as request
// attributes, and the request id and model headers (used only without the
// field); with the response headers, the status, the upstream, the cluster
// and its pool order and the attempts as response attributes, content-type
// (and a route's x-infergate-pool) as headers. No metadata is forwarded
// (Envoy copies a forwarded namespace into every message); Envoy Gateway,
// which takes no metadata expression as an attribute, forwards the field's
// own namespace, read here from the first message that has it. An older
// config that forwards the gate's namespace of one key per field is read as
// before. A config that skips the request headers (the field then a
// response attribute) is timed from the gate's answer (see departure).
func (m *meterRequest) observe(msg *extprocv3.ProcessingRequest, at time.Time) bool {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.sentAt, m.seen = at, true
		hm := r.RequestHeaders.GetHeaders()
		m.stamp.RequestID = header(hm, "x-request-id")
		m.stamp.Model = header(hm, request.ModelHeader)
		m.stamp.Endpoint = header(hm, request.EndpointHeader) // an Endpoint Picker's choice (bounded with the stamp)
		m.fromGateOf(msg)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hm := r.ResponseHeaders.GetHeaders()
		var h headers // only what clusterOf reads
		if p := header(hm, request.PoolHeader); p != "" {
			h = headers{request.PoolHeader: p}
		}
		attrs := m.fromGateOf(msg)
		if m.sentAt.IsZero() {
			m.sentAt = m.departure(at)
		}
		m.stamp.Status = clampInt(attrFloat(attrs, "response.code"), 100, 599)
		if m.stamp.Status == 0 {
			m.stamp.Status = clampInt(float64(atoi(header(hm, ":status"))), 100, 599)
		}
		m.stamp.Upstream = attrString(attrs, "upstream.address")
		details := attrString(attrs, "response.code_details")
		m.origin = originOf(details)
		m.stamp.Attempts = clampInt(attrFloat(attrs, "upstream.request_attempt_count"), 0, maxAttempts)
		m.unsent = unsentBy(details, m.stamp.Attempts, m.stamp.Upstream)
		order := attrString(attrs, request.PoolOrderAttribute)
		if order == "" {
			order = attrString(attrs, "xds.cluster_metadata") // an older config's whole cluster metadata
		}
		m.stamp.PoolsTried = m.orders.servingPools(clusterOf(attrs, h), order, m.stamp.Attempts)
		if n := len(m.stamp.PoolsTried); n > 0 {
			m.stamp.Pool = m.stamp.PoolsTried[n-1]
		}
		m.tally.SSE = strings.HasPrefix(header(hm, "content-type"), "text/event-stream")
		if r.ResponseHeaders.GetEndOfStream() {
			return true
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.tally.Body(r.ResponseBody.GetBody(), at)
		return r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return true
	}
	return false
}

// passThrough is the answer that lets msg through unchanged (a blocking
// meter's), or nil for a message that needs none.
func passThrough(msg *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return nil
}

// fromGateOf reads what msg carries of the request and of the gate's
// decision: request.time, and the gate's field (a response or request
// attribute, else its forwarded namespace, else the older namespace of one
// key per field), until the field is found. It returns msg's attributes.
func (m *meterRequest) fromGateOf(msg *extprocv3.ProcessingRequest) map[string]*structpb.Value {
	attrs := attributes(msg)
	if t := attrTime(attrs, "request.time"); !t.IsZero() {
		m.envoyStart = t
	}
	if m.gate == fromField {
		return attrs
	}
	field := attrString(attrs, request.MeterAttribute)
	fm := msg.GetMetadataContext().GetFilterMetadata()
	if field == "" {
		// Envoy Gateway cannot name it as an attribute: its meter forwards
		// the field's namespace (one key) instead.
		field = fm[request.MeterNamespace].GetFields()[request.MeterKey].GetStringValue()
	}
	if f, fs, ok := readGateField(m.sealer, field); ok {
		m.fieldSeal = fs
		m.fromField(&f)
		return attrs
	}
	if m.gate == fromNothing {
		m.fromGate(fm[request.MetadataNamespace])
	}
	return attrs
}

// fromField takes what the gate decided from its field.
func (m *meterRequest) fromField(f *gateField) {
	m.gate, m.seen = fromField, true
	if f.requestID != "" {
		m.stamp.RequestID = f.requestID
	}
	if f.model != "" {
		m.stamp.Model = f.model
	}
	m.stamp.Stream = f.stream
	m.stamp.Decision, m.stamp.Reason = f.decision, f.reason
	m.stamp.Principal, m.stamp.Tenant = f.principal, f.tenant
	// What the gate wrote, range-checked all the same: a meter stream
	// may come from anything that reaches the port.
	m.stamp.Gateway.Gate = clampMicros(float64(f.gateUS))
	m.stamp.Gateway.Auth = clampMicros(float64(f.authUS))
	m.stamp.Gateway.Policy = clampMicros(float64(f.policyUS))
	m.stamp.Gateway.RateLimit = clampMicros(float64(f.rateLimitUS))
	m.stamp.Gateway.Checks = clampMicros(float64(f.checksUS))
	m.reservation, m.gateTraceparent = f.reservation, f.traceparent
	m.stamp.PromptTokens = clampInt(float64(f.promptTokens), 0, maxTokens)
	m.tally.API = knownAPI(f.api)
	m.gateSent = f.sentTime()
}

// fromGate reads what the gate decided from the older namespace of one key
// per field (an Envoy config that forwards it to the meter; kept for one
// release).
func (m *meterRequest) fromGate(md *structpb.Struct) {
	f := md.GetFields()
	if f == nil {
		return
	}
	m.gate, m.seen = fromStruct, true
	if v := f["model"].GetStringValue(); v != "" {
		m.stamp.Model = v
	}
	m.stamp.Stream = f["stream"].GetBoolValue()
	m.stamp.Decision = f["decision"].GetStringValue()
	m.stamp.Reason = f["reason"].GetStringValue()
	m.stamp.Principal = f["principal"].GetStringValue()
	m.stamp.Tenant = f["tenant"].GetStringValue()
	// Range-checked as the field's values are.
	us := func(k string) time.Duration { return clampMicros(f[k].GetNumberValue()) }
	m.stamp.Gateway.Gate = us("gate_us")
	m.stamp.Gateway.Auth = us("auth_us")
	m.stamp.Gateway.Policy = us("policy_us")
	m.stamp.Gateway.RateLimit = us("ratelimit_us")
	m.stamp.Gateway.Checks = us("checks_us")
	m.reservation = f["reservation"].GetStringValue()
	m.gateTraceparent = f[request.TraceparentKey].GetStringValue()
	m.stamp.PromptTokens = clampInt(f["prompt_tokens"].GetNumberValue(), 0, maxTokens)
	m.tally.API = knownAPI(f["api"].GetStringValue())
}

// departure is when the request left the gateway, for a meter that did not
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
func (m *meterRequest) departure(at time.Time) time.Time {
	t := m.gateSent
	if t.IsZero() {
		t = m.envoyStart
	}
	if !m.envoyStart.IsZero() && t.Before(m.envoyStart) {
		t = m.envoyStart
	}
	if t.IsZero() || t.After(at) || t.Before(at.Add(-time.Hour)) {
		t = at
	}
	return t
}

// originOf is who wrote a response, by Envoy's response.code_details:
// "via_upstream" is the pool's answer, any other detail one of Envoy's own
// local replies (a timeout, no healthy upstream, a reset before the
// response); none, a config that does not ask for it.
func originOf(details string) request.Origin {
	switch details {
	case "":
		return request.OriginUnknown
	case "via_upstream":
		return request.OriginPool
	}
	return request.OriginEnvoy
}

// unsentDetails are the local replies Envoy writes only before its router
// has asked any pool for the request: no route matched, the route's
// cluster does not exist, the cluster had no host to send it to. Each
// proves that nothing was spent; every other local reply (a timeout, a
// reset, an overflow) may follow a request a pool received, and keeps the
// reservation. Kept short on purpose: a detail joins only when Envoy's
// router can write it before an upstream request alone.
var unsentDetails = []string{"route_not_found", "cluster_not_found", "no_healthy_upstream"}

// unsentBy is details when it proves that Envoy answered before any pool
// was asked (unsentDetails), with no upstream address and at most the
// first attempt counted beside it (a retry that found no healthy host had
// an attempt before it); "" otherwise.
func unsentBy(details string, attempts int, upstream string) string {
	if !slices.Contains(unsentDetails, details) || upstream != "" || attempts > 1 {
		return ""
	}
	return details
}

// generates reports whether api writes output (an unknown API is read as
// a chat's, as before the meter knew others).
func generates(api openai.API) bool { return api == "" || api.Generates() }

// knownAPI is s, the API a gate's field names, when the meter knows it: the
// field may come from anything that reaches the port.
func knownAPI(s string) openai.API {
	if a := openai.API(s); a.Operation() != "" {
		return a
	}
	return ""
}

// finish stamps a request whose response ended at end (stampOf), settles
// it (settlementOf, admission's to charge), and hands the stamp to the
// metrics, the span and the sinks.
func (s *Server) finish(ctx context.Context, m *meterRequest, end time.Time, complete bool) {
	if !m.seen {
		// Neither the request headers nor the gate's decision: a response
		// the gate answered itself (stamped there), or not a request's.
		return
	}
	if m.sentAt.IsZero() { // the stream ended before the response headers
		m.sentAt = m.departure(end)
	}
	m.tally.End(end)
	e := meterEnd{at: end, complete: complete, trusted: s.trusted(ctx, m), poolName: s.pool, prices: s.opts.Prices}
	if !m.envoyTimed {
		e.stalls = s.stalls.recent(s.now())
	}
	o := stampOf(m, e)
	m.stamp, m.sentAt = o.stamp, o.sent // as the span reads them
	st := &m.stamp
	if st.Unverified {
		s.untrusted(ctx, st)
	}
	s.countStamp(ctx, &m.tally, st)
	settle := settlementOf(m, &o)
	if settle != nil && settle.NeverSent {
		s.metrics.Unsent.Add(ctx, 1, metric.WithAttributes(attribute.String("details", m.unsent)))
		s.log.Warn("Envoy answered an admitted request itself before any pool was asked; its reservation is released",
			"request_id", st.RequestID, "tenant", st.Tenant, "status", st.Status, "details", m.unsent)
	}
	if settle != nil {
		// The stream's context is gone when the client reset: the charge
		// must reach the limiter anyway.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		s.policy.Settle(sctx, settle)
		cancel()
	}
	if sc := s.traceMeter(ctx, m, o.end); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	s.record(ctx, st)
}

// countStamp records the meter's metrics of a stamped request: what it
// could not time or read, and the inter-token gaps it timed.
func (s *Server) countStamp(ctx context.Context, t *tally.Response, st *request.Stamp) {
	switch st.Timing {
	case request.TimingLateRead:
		s.metrics.MeterErrors.Add(ctx, 1, lateReadAttr)
	case request.TimingLateStream:
		s.metrics.MeterErrors.Add(ctx, 1, lateStreamAttr)
	}
	if len(st.Gaps) > 0 && st.Timing.StreamTimed() { // gaps read from a backlog are not the stream's
		set := s.meters.poolAttrs(st)
		for _, g := range st.Gaps {
			s.metrics.InterToken.Record(ctx, g.Seconds(), set)
		}
	}
	if t.BadEvents > 0 {
		s.metrics.MeterErrors.Add(ctx, int64(t.BadEvents), metric.WithAttributes(attribute.String("reason", "bad_event")))
	}
	if t.Parser.Dropped > 0 {
		s.metrics.MeterErrors.Add(ctx, int64(t.Parser.Dropped), metric.WithAttributes(attribute.String("reason", "line_too_long")))
	}
	if t.Parser.Overflowed > 0 {
		s.metrics.MeterErrors.Add(ctx, int64(t.Parser.Overflowed), metric.WithAttributes(attribute.String("reason", "event_too_long")))
	}
	if !st.Complete {
		s.metrics.MeterErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "incomplete")))
	}
}

// trusted reports whether the request's field verified, and claims its
// seal: a field is trusted once (a replayed one is not).
func (s *Server) trusted(ctx context.Context, m *meterRequest) bool {
	if m.fieldSeal.id == "" || m.sealer == nil {
		return false
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	first, err := m.sealer.Claim(cctx, m.fieldSeal.id, m.fieldSeal.expires)
	if err != nil {
		s.log.Warn("could not record the gate's field as used; the request is recorded unverified",
			"request_id", truncate(m.stamp.RequestID, maxStampField), "err", err)
	}
	return err == nil && first
}

// untrusted counts and logs (at most every 10 s) a stamp whose gate field
// did not verify (stampOf blanked who called).
func (s *Server) untrusted(ctx context.Context, st *request.Stamp) {
	s.metrics.MeterErrors.Add(ctx, 1, unverifiedAttr)
	if now := s.now().Unix(); now-s.lastUnverified.Load() >= 10 {
		s.lastUnverified.Store(now)
		s.log.Warn("a meter stream or access-log entry without a sealed gate field that verifies (none, unsealed, forged, "+
			"expired or replayed): recorded unverified, under no tenant, settling nothing", "request_id", st.RequestID)
	}
}

var (
	unverifiedAttr = metric.WithAttributes(attribute.String("reason", "unverified"))
	lateReadAttr   = metric.WithAttributes(attribute.String("reason", string(request.TimingLateRead)))
	lateStreamAttr = metric.WithAttributes(attribute.String("reason", string(request.TimingLateStream)))
)

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}
