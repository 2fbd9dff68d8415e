package extproc

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// gateRequest is the gate's per-request state.
type gateRequest struct {
	started time.Time
	headers headers
	body    []byte
	// eager: Envoy streams body chunks without waiting for the headers
	// answer (request_body_mode STREAMED with
	// send_body_without_waiting_for_header_response), so the gate answers
	// headers and body together once it has read the body: one round trip.
	eager       bool
	headersOwed bool // a request_headers message awaits its answer
	chunksOwed  int  // streamed body chunks await their answers
	decided     bool
	api         openai.API                // the API of an inference request, once decide knows it
	metadata    map[string]map[string]any // forwarded dynamic metadata
	policyAt    time.Time                 // when the policy was asked (zero: it was not)
	// principal and tenant are who the headers identified (Identify);
	// waits what the request holds of their waiting-body counts while
	// awaiting is true: between its headers and its body's end.
	principal, tenant string
	waits             []waiter
	awaiting          bool
}

// gate runs the blocking filter for one request.
//
// Recommended Envoy config (envoy/snippet.yaml): request headers SEND, body
// STREAMED, send_body_without_waiting_for_header_response. Envoy then sends
// headers and body back to back and the gate answers them all at once: one
// round trip, with the routing header set before Envoy picks a route. With
// body BUFFERED instead, headers are answered first and the decision rides
// on the body answer: two round trips.
func (s *Server) gate(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer,
	msg *extprocv3.ProcessingRequest, arrived time.Time) error {
	pc := msg.GetProtocolConfig()
	g := &gateRequest{
		started: arrived,
		eager: pc.GetSendBodyWithoutWaitingForHeaderResponse() &&
			pc.GetRequestBodyMode() == extprocv3modes.ProcessingMode_STREAMED,
	}
	defer s.stopWaiting(g) // a stream that ends before its body
	// Once a body is awaited, messages come from a reader of their own,
	// so that the wait has a deadline (Options.BodyTimeout): a body that
	// does not arrive in time is answered 408 and its stream ended.
	var inbox <-chan received
	var deadline *time.Timer
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	for {
		answers, err := s.safeGateStep(ctx, g, msg)
		for _, resp := range answers {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		if err != nil {
			return nil // answered 503: this request is over, the process lives
		}
		if inbox == nil && g.awaiting {
			inbox, deadline = receive(rctx, stream), time.NewTimer(s.opts.BodyTimeout)
		}
		if inbox == nil {
			if msg, err = stream.Recv(); err != nil {
				return err
			}
			continue
		}
		var expired <-chan time.Time
		if g.awaiting {
			expired = deadline.C
		}
		select {
		case r := <-inbox:
			if r.err != nil {
				return r.err
			}
			msg = r.msg
		case <-expired:
			return stream.Send(s.bodyTimedOut(ctx, g)) // the stream ends: Envoy answers the client 408
		case <-ctx.Done(): // reset by Envoy (the reader may have left without a word)
			return ctx.Err()
		}
	}
}

// safeGateStep is gateStep that survives a panic: the request is answered
// 503 (the gate fails closed) and the panic counted and logged, instead of
// the process dying with every request in flight.
func (s *Server) safeGateStep(ctx context.Context, g *gateRequest, msg *extprocv3.ProcessingRequest) (out []*extprocv3.ProcessingResponse, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.recovered(ctx, "gate", r)
			e := openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "gate_error", "", "internal gateway error")
			out = []*extprocv3.ProcessingResponse{g.immediate(e)}
		}
	}()
	return s.gateStep(ctx, g, msg), nil
}

// gateStep takes one message and returns the answers now due. After the
// decision anything else Envoy is configured to send passes untouched.
func (s *Server) gateStep(ctx context.Context, g *gateRequest, msg *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		g.headers = headersFrom(m.RequestHeaders.GetHeaders())
		g.metadata = metadataFrom(msg.GetMetadataContext())
		g.headersOwed = true
		out, v := s.identify(ctx, g)
		if out != nil {
			return out // refused unread: no body awaited, buffered or parsed
		}
		if m.RequestHeaders.GetEndOfStream() {
			return s.decide(ctx, g)
		}
		if out := s.await(ctx, g, v); out != nil {
			return out // its caller holds too many bodies back already
		}
		if g.eager {
			return nil // answer once the body is in
		}
		// The decision rides on the body answer; drop spoofed headers now.
		g.headersOwed = false
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: g.spoofed()},
			}},
		}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		if g.decided {
			return []*extprocv3.ProcessingResponse{bodyResponse(nil)}
		}
		if body := m.RequestBody.GetBody(); g.body == nil {
			g.body = body // the message is ours: no copy of a one-chunk body
		} else {
			g.body = append(g.body, body...)
		}
		if g.eager {
			g.chunksOwed++
		}
		if m.RequestBody.GetEndOfStream() || len(g.body) > s.opts.MaxBodyBytes {
			return s.decide(ctx, g)
		}
		if !g.eager {
			// A partial buffer (BUFFERED_PARTIAL) or a lazy STREAMED body:
			// the route is already chosen, so nothing can be decided on.
			e := openai.NewError(http.StatusInternalServerError, openai.TypeServer, "gate_misconfigured", "",
				"the gateway's request filter is not configured to read the request body")
			return s.deny(ctx, g, "", request.Verdict{Deny: e, Reason: e.Code})
		}
		return nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}}
	}
	return nil
}

func bodyResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}}
}

// spoofed lists the client's x-infergate-* headers: only the gate sets those.
func (g *gateRequest) spoofed() []string { return gate.Spoofed(g.headers) }

// MaxModelBytes bounds the model name a request may carry (gate.MaxModelBytes).
const MaxModelBytes = gate.MaxModelBytes

func headerSafe(s string) bool { return gate.HeaderSafe(s) }

// identify asks the policy who is calling from the request headers and
// Envoy's metadata alone, before the body: an unauthenticated caller is
// answered at once, whatever its body, and costs the gate no parsing (nor,
// in either mode, the wait for a body Envoy has not sent). An immediate
// response is a valid answer to any message: Envoy drops the answers
// still owed and closes the stream. nil: decide as ever, once the body is
// in (Decide identifies the caller again); v says who is calling.
func (s *Server) identify(ctx context.Context, g *gateRequest) (out []*extprocv3.ProcessingResponse, v request.Verdict) {
	adm, _ := s.newAdmission(g)
	policyAt := s.now()
	v = s.policy.Identify(ctx, adm)
	if v.Deny == nil || v.Decision == "shadow_deny" {
		return nil, v
	}
	g.api, g.policyAt = adm.API, policyAt // the stamp's, as decide would have set them
	return s.deny(ctx, g, "", v), v
}

// decide validates the request, asks the policy, and either admits it
// (routing header, body and header mutations, metadata for the meter) or
// denies it with an immediate response. It returns every answer owed.
func (s *Server) decide(ctx context.Context, g *gateRequest) []*extprocv3.ProcessingResponse {
	g.decided = true
	s.stopWaiting(g) // the body is in
	adm, removed, verr := s.admission(g)
	if verr != nil {
		return s.deny(ctx, g, adm.Request.Model, request.Verdict{Deny: verr, Reason: verr.Code})
	}
	if id, one, ok := s.catalog().Request(adm.Method, adm.Path); ok {
		return s.models(ctx, g, adm, id, one) // answered by the gate (models.go)
	}
	g.policyAt = s.now()
	v := s.policy.Decide(ctx, adm)
	p := gate.PlanOf(s.gateRules(), adm, removed, v)
	return s.answer(ctx, g, adm, v, &p)
}

// newAdmission is what the policy is asked about the request from its
// headers and Envoy's metadata, without its body (gate.Intake.Headless).
func (s *Server) newAdmission(g *gateRequest) (adm *request.Admission, spoofed []string) {
	return s.intake().Headless(g.headers, g.metadata)
}

// admission is what the policy is asked about the request, body included,
// and the request headers to remove before it leaves (gate.Intake.Admission).
func (s *Server) admission(g *gateRequest) (adm *request.Admission, removed []string, verr *openai.Error) {
	adm, removed, verr = s.intake().Admission(g.headers, g.metadata, g.body)
	g.api = adm.API
	return adm, removed, verr
}

func (s *Server) intake() gate.Intake {
	return gate.Intake{CompletionPaths: s.opts.CompletionPaths, MaxBodyBytes: s.opts.MaxBodyBytes}
}

// answer turns a plan into the answers owed: a denial, or the admission
// with its metadata and the meter's field, counted and traced.
func (s *Server) answer(ctx context.Context, g *gateRequest, adm *request.Admission, v request.Verdict, p *gate.Plan) []*extprocv3.ProcessingResponse {
	switch {
	case p.Deny != nil:
		return s.deny(ctx, g, p.Stamp.Model, v)
	case p.Fail != nil:
		return s.failClosed(ctx, g, adm, v, p.Fail)
	}
	p.Stamp.Gateway.Gate = time.Since(g.started) - v.Timings.Checks // external checks are not the gateway's time
	s.meters.Decided(ctx, p.Stamp.Decision, p.Code, p.Stamp.Gateway.Gate)
	traceparent := ""
	if sc := s.traceGate(ctx, g, g.policyAt, s.now(), &p.Stamp); sc.IsValid() {
		traceparent = observe.Traceparent(sc)
	}
	md, err := s.envoyMetadata(ctx, p, traceparent)
	if err != nil {
		return s.failClosed(ctx, g, adm, v, err)
	}
	return g.admit(mutation(p), p.Body, md)
}

// failClosed answers a request the gate admitted but cannot forward as it
// must (500 gate_error), and gives its reservation back: it never reached a
// pool.
func (s *Server) failClosed(ctx context.Context, g *gateRequest, adm *request.Admission, v request.Verdict, err error) []*extprocv3.ProcessingResponse {
	s.unreserve(ctx, adm, v)
	if e := inFlightError(err); e != nil {
		return s.deny(ctx, g, adm.Request.Model, request.Verdict{Deny: e, Reason: e.Code, Tenant: v.Tenant, Principal: v.Principal,
			Headers: map[string]string{"retry-after": "1"}})
	}
	s.log.Error("gate cannot forward an admitted request", "err", err)
	e := openai.NewError(http.StatusInternalServerError, openai.TypeServer, "gate_error", "", "internal gateway error")
	return s.deny(ctx, g, adm.Request.Model, request.Verdict{Deny: e, Reason: e.Code})
}

// unreserve gives back the reservation of a request the gate admitted but
// then could not forward: it never reached a pool.
func (s *Server) unreserve(ctx context.Context, adm *request.Admission, v request.Verdict) {
	if v.Reservation == "" {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	s.policy.Release(sctx, adm.RequestID, v.Reservation)
}

// metaFields builds the gate's metadata Struct; the first field that
// protobuf could not encode (a string that is not UTF-8) is kept in err.
type metaFields struct {
	s   structpb.Struct
	err error
}

func (f *metaFields) init(n int) { f.s.Fields = make(map[string]*structpb.Value, n) }

func (f *metaFields) set(k string, v *structpb.Value) {
	if !utf8.ValidString(k) && f.err == nil {
		f.err = errors.New("metadata key " + strconv.Quote(k) + " is not UTF-8")
	}
	f.s.Fields[k] = v
}

func (f *metaFields) str(k, v string) {
	if !utf8.ValidString(v) && f.err == nil {
		f.err = errors.New("metadata " + k + " is not UTF-8")
	}
	f.set(k, structpb.NewStringValue(v))
}

func (f *metaFields) num(k string, v int64) { f.set(k, structpb.NewNumberValue(float64(v))) }

// admit builds the answers that let the request through, in the order
// Envoy expects them: headers first, then each held body chunk.
func (g *gateRequest) admit(mutation *extprocv3.HeaderMutation, newBody []byte, md *structpb.Struct) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	common := &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true}
	if g.headersOwed {
		out = append(out, &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
		})
		common = nil // header mutations on body answers are ignored in STREAMED mode
	}
	switch {
	case g.chunksOwed > 0: // streamed: the first chunk carries the new body, the rest are cleared
		for i := range g.chunksOwed {
			c := &extprocv3.CommonResponse{}
			switch {
			case newBody == nil:
			case i == 0:
				c.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: newBody}}
			default:
				c.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
			}
			out = append(out, bodyResponse(c))
		}
	case !g.headersOwed: // buffered: one answer carries everything
		if newBody != nil {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: newBody}}
		}
		out = append(out, bodyResponse(common))
	}
	g.headersOwed, g.chunksOwed = false, 0
	out[0].DynamicMetadata = md
	return out
}

// deny answers with an immediate error, in the style the request's API
// expects, and stamps the request.
func (s *Server) deny(ctx context.Context, g *gateRequest, model string, v request.Verdict) []*extprocv3.ProcessingResponse {
	g.decided = true
	st := gate.Answered(gate.Answer{RequestID: g.headers["x-request-id"], Model: model, API: g.api, Status: v.Deny.Status,
		Decision: "deny", Started: g.started, Took: time.Since(g.started)}, v)
	s.meters.Decided(ctx, "deny", v.Deny.Code, st.Gateway.Gate)
	s.log.LogAttrs(ctx, slog.LevelInfo, "request denied",
		slog.String("request_id", st.RequestID), slog.Int("status", v.Deny.Status),
		slog.String("code", v.Deny.Code), slog.String("message", request.Truncate(v.Deny.Message, request.MaxStampReason)))
	if sc := s.traceGate(ctx, g, g.policyAt, s.now(), &st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	s.record(ctx, &st)
	extra := make([]*corev3.HeaderValueOption, 0, len(v.Headers))
	for k, val := range v.Headers {
		extra = append(extra, setHeader(k, val))
	}
	return []*extprocv3.ProcessingResponse{g.immediate(v.Deny, extra...)}
}

// pathAPI is the API the request's path names, whether or not the gate
// parses it: it sets the style of the gate's errors.
func (g *gateRequest) pathAPI() openai.API {
	path, _, _ := strings.Cut(g.headers[":path"], "?")
	return openai.APIOf(path)
}

// immediate answers e in the style the request's API expects: Anthropic's
// error body on its paths, OpenAI's everywhere else.
func (g *gateRequest) immediate(e *openai.Error, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	resp := immediate(e, extra...)
	if g.pathAPI().Anthropic() {
		resp.GetImmediateResponse().Body = e.AnthropicJSON()
	}
	return resp
}
