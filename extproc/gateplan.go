package extproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// gatePlan is the gate's answer to a request the policy has decided, as a
// value: planGate computes it from the request and the verdict alone, and
// one encoder (Server.answer) turns it into Envoy's messages, the gate's
// metadata, the meter's sealed field and the gate's span.
type gatePlan struct {
	// deny is the policy's refusal, answered as it is: nothing below is set.
	deny *openai.Error
	// fail: the request was admitted but cannot be forwarded as it must be
	// (its output cap cannot be written): answered 500 gate_error, its
	// reservation given back.
	fail error
	// stamp is the gate's part of the request's stamp: the request id, the
	// model, API, stream and prompt tokens, the decision, reason and who
	// called, the policy's timings. Gateway.Gate is the adapter's to set:
	// it is the gate's own time, the plan's making included.
	stamp request.Stamp
	code  string // counted with the decision: "allowed", or the code a shadow denial would have answered
	// remove and set are the request header mutations; body, when not nil,
	// replaces the request body.
	remove    []string
	set       []headerValue
	body      []byte
	maxTokens int    // the output cap as sent upstream
	reserved  string // the policy's reservation, settled by the meter
	metadata  map[string]any
}

type headerValue struct{ key, value string }

// gateRules are the options planGate follows.
type gateRules struct {
	keepUsageOption, honourUsageOptOut bool
	chatOutputLimit                    string
}

func (s *Server) gateRules() gateRules {
	return gateRules{keepUsageOption: s.opts.KeepUsageOption, honourUsageOptOut: s.opts.HonourUsageOptOut,
		chatOutputLimit: s.opts.ChatOutputLimit}
}

// planGate is the gate's answer to adm, a request the policy answered v:
// a denial, or the mutations that let it through (the client's reserved
// headers and credential removed, the routing header set, usage asked of a
// stream, the output capped at the reservation's) and what the meter is
// told. removed are the headers to remove.
func planGate(r gateRules, adm *request.Admission, removed []string, v request.Verdict) gatePlan {
	req := adm.Request
	refused := gatePlan{stamp: request.Stamp{RequestID: adm.RequestID, Model: req.Model, API: adm.API}}
	if v.Deny != nil && v.Decision != "shadow_deny" {
		refused.deny = v.Deny
		return refused
	}
	p := refused
	p.stamp.Stream, p.stamp.PromptTokens = req.Stream, adm.PromptTokens
	p.stamp.Decision, p.stamp.Reason = cmp.Or(v.Decision, "allow"), v.Reason
	p.stamp.Principal, p.stamp.Tenant = v.Principal, v.Tenant
	p.stamp.Gateway.Timings = v.Timings
	p.code = "allowed"
	if v.Deny != nil { // shadow_deny: what would have been answered
		p.code = v.Deny.Code
	}
	p.reserved, p.metadata, p.maxTokens = v.Reservation, v.Metadata, req.MaxTokens
	if req.Model != "" {
		p.set = append(make([]headerValue, 0, 2), headerValue{request.ModelHeader, req.Model}) // room for content-length
	}
	var err error
	if p.remove, p.set, err = pickerIdentity(removed, p.set, v); err != nil {
		refused.fail = err // a Policy that did not validate them: never sent unchecked
		return refused
	}
	// Usage on every stream: a client's include_usage: false would leave
	// the charge to infergate's own count (see Options.HonourUsageOptOut).
	// Only chat and text completions need asking: a Responses stream ends
	// with its usage (response.completed), an Anthropic one carries it in
	// message_start and message_delta.
	optedOut := req.IncludeUsage != nil && !*req.IncludeUsage
	asksUsage := adm.API == openai.APIChat || adm.API == openai.APICompletions
	if asksUsage && req.Stream && !r.keepUsageOption && (req.IncludeUsage == nil || optedOut && !r.honourUsageOptOut) {
		if b, err := openai.WithUsage(adm.Body); err == nil {
			p.body = b
		}
	}
	if v.MaxTokens > 0 && adm.Completion && adm.API.Generates() {
		// The reservation counted v.MaxTokens per choice: the pool must
		// not be asked for more (a client that set none, or more than
		// its cap). Not rewritable (it was validated): fail closed
		// rather than let the pool write past the reservation.
		body := p.body
		if body == nil {
			body = adm.Body
		}
		b, err := withMaxTokens(body, v.MaxTokens, outputLimitKeys(adm.API, r.chatOutputLimit)...)
		if err != nil {
			refused.fail = fmt.Errorf("max_tokens: %w", err)
			return refused
		}
		p.body, p.maxTokens = b, v.MaxTokens
	}
	if p.body != nil {
		p.set = append(p.set, headerValue{"content-length", strconv.Itoa(len(p.body))})
	}
	return p
}

// pickerIdentity adds to the request's header mutation what an Endpoint
// Picker is told (request.PickerHeaders): a client's Inference Extension
// headers are removed, always, present or not (the gate is not sent them:
// see GateHeaders); when the policy names a fairness id or an objective,
// both are set, the fairness id defaulting to the tenant's
// (request.TenantFairnessID). Without, nothing is set: a hosted pool is
// not told the tenant, and a picker queues the request in its default
// flow at its default priority.
func pickerIdentity(remove []string, set []headerValue, v request.Verdict) ([]string, []headerValue, error) {
	remove = slices.Grow(slices.Clip(remove), len(request.PickerHeaders))
	switch {
	case v.FairnessID == "" && v.Objective == "":
		return append(remove, request.PickerHeaders...), set, nil
	case v.FairnessID != "" && !request.ValidFairnessID(v.FairnessID):
		return nil, nil, errors.New("the policy's fairness_id is not a valid one")
	case v.Objective != "" && !request.ValidObjective(v.Objective):
		return nil, nil, errors.New("the policy's objective is not a valid one")
	}
	fairness := cmp.Or(v.FairnessID, request.TenantFairnessID(v.Tenant))
	for _, h := range request.PickerHeaders {
		switch {
		case h == request.FairnessIDHeader && fairness != "":
			set = append(set, headerValue{h, fairness})
		case h == request.ObjectiveHeader && v.Objective != "":
			set = append(set, headerValue{h, v.Objective})
		default:
			remove = append(remove, h)
		}
	}
	return remove, set, nil
}

// mutation is the plan's header mutation.
func (p *gatePlan) mutation() *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{RemoveHeaders: p.remove}
	if len(p.set) > 0 {
		m.SetHeaders = make([]*corev3.HeaderValueOption, 0, len(p.set))
	}
	for _, h := range p.set {
		m.SetHeaders = append(m.SetHeaders, setHeader(h.key, h.value))
	}
	return m
}

// gateMetadata is the gate's metadata namespace, built as the Struct Envoy
// receives, field by field (structpb.NewStruct would convert a
// map[string]any first); the policy's own fields come last. An error: not
// encodable (a policy's value, a string that is not UTF-8).
func (p *gatePlan) gateMetadata(traceparent string) (*structpb.Struct, error) {
	st := &p.stamp
	var f metaFields
	f.init(16 + len(p.metadata))
	f.str("model", st.Model)
	f.str("api", string(st.API))
	f.set("stream", structpb.NewBoolValue(st.Stream))
	f.num("max_tokens", int64(p.maxTokens)) // as sent upstream
	f.num("prompt_tokens", int64(st.PromptTokens))
	f.str("decision", st.Decision)
	f.str("reason", st.Reason)
	f.str("principal", st.Principal)
	f.str("tenant", st.Tenant)
	f.num("gate_us", st.Gateway.Gate.Microseconds())
	f.num("auth_us", st.Gateway.Auth.Microseconds())
	f.num("policy_us", st.Gateway.Policy.Microseconds())
	f.num("ratelimit_us", st.Gateway.RateLimit.Microseconds())
	f.num("checks_us", st.Gateway.Checks.Microseconds())
	if p.reserved != "" {
		f.str("reservation", p.reserved)
	}
	if traceparent != "" {
		f.str(request.TraceparentKey, traceparent)
	}
	for k, val := range p.metadata {
		pv, err := structpb.NewValue(val)
		if err != nil {
			return nil, err
		}
		f.set(k, pv)
	}
	return &f.s, f.err
}

// meterField is what the meter needs of the plan (see meterfield.go), the
// gate's answer sent at sent (Unix µs): its strings valid UTF-8 and cut to
// the stamp's bounds.
func (p *gatePlan) meterField(sent int64, traceparent string) gateField {
	st := &p.stamp
	g := &st.Gateway
	return gateField{
		sent: sent, stream: st.Stream, promptTokens: int64(st.PromptTokens),
		gateUS: g.Gate.Microseconds(), authUS: g.Auth.Microseconds(), policyUS: g.Policy.Microseconds(),
		rateLimitUS: g.RateLimit.Microseconds(), checksUS: g.Checks.Microseconds(),
		decision: fieldString(st.Decision, maxStampField), requestID: fieldString(st.RequestID, maxStampField),
		model: fieldString(st.Model, maxStampField), tenant: fieldString(st.Tenant, maxStampField),
		principal: fieldString(st.Principal, maxStampField), reason: fieldString(st.Reason, maxStampReason),
		traceparent: traceparent, reservation: p.reserved, api: string(st.API),
	}
}

// envoyMetadata is the dynamic metadata of an admitted request: the gate's
// namespace and the meter's sealed field, in a namespace of its own. Sent
// is now: the request leaves the gateway with these answers, and a meter
// that skips the request headers times the response from here.
func (s *Server) envoyMetadata(ctx context.Context, p *gatePlan, traceparent string) (*structpb.Struct, error) {
	gate, err := p.gateMetadata(traceparent)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	mf := p.meterField(s.now().UnixMicro(), traceparent)
	field, err := sealField(ctx, s.sealer, &mf)
	switch {
	case errors.Is(err, seal.ErrTenantFull), errors.Is(err, seal.ErrFull):
		return nil, fmt.Errorf("sealing the meter's field: %w", err)
	case err != nil:
		s.log.Warn("could not record the meter's field as outstanding; its stamp may read unverified", "err", err)
	}
	if len(field) > maxMeterField { // the reservation is the one part not cut (UTF-8: checked above)
		return nil, errors.New("the meter's field is " + strconv.Itoa(len(field)) + " bytes; the limit is " + strconv.Itoa(maxMeterField))
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		request.MetadataNamespace: structpb.NewStructValue(gate),
		request.MeterNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			request.MeterKey: structpb.NewStringValue(field)}}),
	}}, nil
}

// inFlightError is the refusal of a request whose tenant holds as many
// sealed fields outstanding as its share allows (seal.ErrTenantFull: 429,
// as admission refuses one whose reservation's seal would pass it), or
// whose gateway's whole table is full (seal.ErrFull: 503); nil for
// another error.
func inFlightError(err error) *openai.Error {
	switch {
	case errors.Is(err, seal.ErrTenantFull):
		return openai.NewError(http.StatusTooManyRequests, openai.TypeRateLimit, "too_many_requests_in_flight", "",
			"too many of this tenant's requests are in flight or were lost on the way; retry once some have finished")
	case errors.Is(err, seal.ErrFull):
		return openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "too_many_requests_in_flight", "",
			"the gateway holds too many requests in flight; retry shortly")
	}
	return nil
}
