package extproc

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// settleTimeout bounds settling a reservation once the response ended,
// whether or not the stream that carried it is still there.
const settleTimeout = 2 * time.Second

// meterRequest is the meter's per-request state: the core's (what it
// reads and stamps) and what the adapter keeps to read Envoy's messages.
type meterRequest struct {
	meter.Request
	// seen: this stream is a request's, to be stamped: the meter saw its
	// request headers or what the gate decided.
	seen   bool
	gate   gateSource // where what the gate decided came from
	orders *meter.PoolOrders
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
			m.Cut = errors.Is(err, io.EOF)
			s.finish(ctx, m, s.now(), false)
			return err
		}
		arrived = s.now()
	}
}

// newMeterRequest is one request's meter state, bounded as configured.
func (s *Server) newMeterRequest() *meterRequest {
	return &meterRequest{Request: *meter.New(s.opts.MaxTrackedGaps, s.opts.MaxEventBytes), orders: &s.orders, sealer: s.sealer}
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
// response attribute) is timed from the gate's answer (see meter.Request.Departure).
func (m *meterRequest) observe(msg *extprocv3.ProcessingRequest, at time.Time) bool {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.Sent, m.seen = at, true
		hm := r.RequestHeaders.GetHeaders()
		m.Stamp.RequestID = header(hm, "x-request-id")
		m.Stamp.Model = header(hm, request.ModelHeader)
		m.Stamp.Endpoint = header(hm, request.EndpointHeader) // an Endpoint Picker's choice (bounded with the stamp)
		m.fromGateOf(msg)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hm := r.ResponseHeaders.GetHeaders()
		var h headers // only what clusterOf reads
		if p := header(hm, request.PoolHeader); p != "" {
			h = headers{request.PoolHeader: p}
		}
		attrs := m.fromGateOf(msg)
		if m.Sent.IsZero() {
			m.Sent = m.Departure(at)
		}
		m.Stamp.Status = meter.ClampInt(attrFloat(attrs, "response.code"), 100, 599)
		if m.Stamp.Status == 0 {
			m.Stamp.Status = meter.ClampInt(float64(atoi(header(hm, ":status"))), 100, 599)
		}
		m.Stamp.Upstream = attrString(attrs, "upstream.address")
		details := attrString(attrs, "response.code_details")
		m.Origin = meter.OriginOf(details)
		m.Stamp.Attempts = meter.ClampInt(attrFloat(attrs, "upstream.request_attempt_count"), 0, meter.MaxAttempts)
		m.Unsent = meter.UnsentBy(details, m.Stamp.Attempts, m.Stamp.Upstream)
		m.Served(m.orders.ServingPools(clusterOf(attrs, h), attrString(attrs, request.PoolOrderAttribute), m.Stamp.Attempts))
		m.Tally.SSE = strings.HasPrefix(header(hm, "content-type"), "text/event-stream")
		if r.ResponseHeaders.GetEndOfStream() {
			return true
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.Chunk(r.ResponseBody.GetBody(), at)
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
		m.EnvoyStart = t
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
		m.Stamp.RequestID = f.requestID
	}
	if f.model != "" {
		m.Stamp.Model = f.model
	}
	m.Stamp.Stream = f.stream
	m.Stamp.Decision, m.Stamp.Reason = f.decision, f.reason
	m.Stamp.Principal, m.Stamp.Tenant = f.principal, f.tenant
	// What the gate wrote, range-checked all the same: a meter stream
	// may come from anything that reaches the port.
	m.Stamp.Gateway.Gate = meter.ClampMicros(float64(f.gateUS))
	m.Stamp.Gateway.Auth = meter.ClampMicros(float64(f.authUS))
	m.Stamp.Gateway.Policy = meter.ClampMicros(float64(f.policyUS))
	m.Stamp.Gateway.RateLimit = meter.ClampMicros(float64(f.rateLimitUS))
	m.Stamp.Gateway.Checks = meter.ClampMicros(float64(f.checksUS))
	m.Reservation, m.GateTraceparent = f.reservation, f.traceparent
	m.Stamp.PromptTokens = meter.ClampInt(float64(f.promptTokens), 0, meter.MaxTokens)
	m.Tally.API = meter.KnownAPI(f.api)
	m.GateSent = f.sentTime()
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
		m.Stamp.Model = v
	}
	m.Stamp.Stream = f["stream"].GetBoolValue()
	m.Stamp.Decision = f["decision"].GetStringValue()
	m.Stamp.Reason = f["reason"].GetStringValue()
	m.Stamp.Principal = f["principal"].GetStringValue()
	m.Stamp.Tenant = f["tenant"].GetStringValue()
	// Range-checked as the field's values are.
	us := func(k string) time.Duration { return meter.ClampMicros(f[k].GetNumberValue()) }
	m.Stamp.Gateway.Gate = us("gate_us")
	m.Stamp.Gateway.Auth = us("auth_us")
	m.Stamp.Gateway.Policy = us("policy_us")
	m.Stamp.Gateway.RateLimit = us("ratelimit_us")
	m.Stamp.Gateway.Checks = us("checks_us")
	m.Reservation = f["reservation"].GetStringValue()
	m.GateTraceparent = f[request.TraceparentKey].GetStringValue()
	m.Stamp.PromptTokens = meter.ClampInt(f["prompt_tokens"].GetNumberValue(), 0, meter.MaxTokens)
	m.Tally.API = meter.KnownAPI(f["api"].GetStringValue())
}

// finish stamps a request whose response ended at end (meter.StampOf),
// settles it (meter.SettlementOf, admission's to charge), and hands the stamp to the
// metrics, the span and the sinks.
func (s *Server) finish(ctx context.Context, m *meterRequest, end time.Time, complete bool) {
	if !m.seen {
		// Neither the request headers nor the gate's decision: a response
		// the gate answered itself (stamped there), or not a request's.
		return
	}
	if m.Sent.IsZero() { // the stream ended before the response headers
		m.Sent = m.Departure(end)
	}
	m.Tally.End(end)
	e := meter.End{At: end, Complete: complete, PoolName: s.pool, Prices: s.opts.Prices}
	e.Trusted, e.Uncertain = s.trusted(ctx, m)
	if !m.EnvoyTimed {
		e.Stalls = s.stalls.Recent(s.now())
	}
	o := meter.StampOf(&m.Request, e)
	m.Stamp, m.Sent = o.Stamp, o.Sent // as the span reads them
	st := &m.Stamp
	if st.Unverified {
		s.untrusted(ctx, st)
	}
	if e.Uncertain {
		s.metrics.MeterErrors.Add(ctx, 1, claimUncertainAttr)
	}
	s.meters.Stamped(ctx, &m.Tally, st)
	settle := meter.SettlementOf(&m.Request, &o)
	if settle != nil && settle.NeverSent {
		s.meters.CountUnsent(ctx, m.Unsent)
		s.log.Warn("Envoy answered an admitted request itself before any pool was asked; its reservation is released",
			"request_id", st.RequestID, "tenant", st.Tenant, "status", st.Status, "details", m.Unsent)
	}
	if settle != nil {
		// The stream's context is gone when the client reset: the charge
		// must reach the limiter anyway.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		s.policy.Settle(sctx, settle)
		cancel()
	}
	if sc := s.traceMeter(ctx, m, o.End); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	s.record(ctx, st)
}

// trusted reports whether the request's field verified, and claims its
// seal: a field is trusted once (a replayed one is not). A claim the
// store did not answer (after its retries) leaves it uncertain: the field
// verified, so who called is the gate's word (trusted), but that this is
// its one use is unproved (uncertain: the stamp is marked, the
// reservation kept whole).
func (s *Server) trusted(ctx context.Context, m *meterRequest) (trusted, uncertain bool) {
	if m.fieldSeal.id == "" || m.sealer == nil {
		return false, false
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	first, err := m.sealer.Claim(cctx, m.fieldSeal.tenant, m.fieldSeal.id, seal.NewClaimant(), m.fieldSeal.expires)
	switch {
	case errors.Is(err, seal.ErrExpired):
		return false, false
	case err != nil:
		s.log.Warn("could not record the gate's field as used; the request is recorded under its tenant, claim_uncertain, its reservation kept",
			"request_id", request.Truncate(m.Stamp.RequestID, request.MaxStampField), "err", err)
		return true, true
	}
	return first, false
}

// untrusted counts and logs (at most every 10 s) a stamp whose gate field
// did not verify (meter.StampOf blanked who called).
func (s *Server) untrusted(ctx context.Context, st *request.Stamp) {
	s.metrics.MeterErrors.Add(ctx, 1, unverifiedAttr)
	if now := s.now().Unix(); now-s.lastUnverified.Load() >= 10 {
		s.lastUnverified.Store(now)
		s.log.Warn("a meter stream or access-log entry without a sealed gate field that verifies (none, unsealed, forged, "+
			"expired or replayed): recorded unverified, under no tenant, settling nothing", "request_id", st.RequestID)
	}
}

var (
	unverifiedAttr     = metric.WithAttributes(attribute.String("reason", "unverified"))
	claimUncertainAttr = metric.WithAttributes(attribute.String("reason", request.ClaimUncertain))
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
