package extproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// The gate's plan (internal/gate) as Envoy receives it: the header
// mutation, the gate's metadata namespace and the meter's sealed field.

func (s *Server) gateRules() gate.Rules {
	return gate.Rules{KeepUsageOption: s.opts.KeepUsageOption, HonourUsageOptOut: s.opts.HonourUsageOptOut,
		ChatOutputLimit: s.opts.ChatOutputLimit}
}

// mutation is the plan's header mutation.
func mutation(p *gate.Plan) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{RemoveHeaders: p.Remove}
	if len(p.Set) > 0 {
		m.SetHeaders = make([]*corev3.HeaderValueOption, 0, len(p.Set))
	}
	for _, h := range p.Set {
		m.SetHeaders = append(m.SetHeaders, setHeader(h.Key, h.Value))
	}
	return m
}

// gateMetadata is the gate's metadata namespace, built as the Struct Envoy
// receives, field by field (structpb.NewStruct would convert a
// map[string]any first); the policy's own fields come last. An error: not
// encodable (a policy's value, a string that is not UTF-8).
func gateMetadata(p *gate.Plan, traceparent string) (*structpb.Struct, error) {
	st := &p.Stamp
	var f metaFields
	f.init(16 + len(p.Metadata))
	f.str("model", st.Model)
	f.str("api", string(st.API))
	f.set("stream", structpb.NewBoolValue(st.Stream))
	f.num("max_tokens", int64(p.MaxTokens)) // as sent upstream
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
	if p.Reservation != "" {
		f.str("reservation", p.Reservation)
	}
	if traceparent != "" {
		f.str(request.TraceparentKey, traceparent)
	}
	for k, val := range p.Metadata {
		pv, err := structpb.NewValue(val)
		if err != nil {
			return nil, err
		}
		f.set(k, pv)
	}
	// Last: a policy's field of that name does not decide what the
	// client is shown.
	f.set(request.UsageAddedKey, structpb.NewBoolValue(p.UsageAdded))
	return &f.s, f.err
}

// meterField is what the meter needs of the plan (see meterfield.go), the
// gate's answer sent at sent (Unix µs): its strings valid UTF-8 and cut to
// the stamp's bounds.
func meterField(p *gate.Plan, sent int64, traceparent string) gateField {
	st := &p.Stamp
	g := &st.Gateway
	return gateField{
		sent: sent, stream: st.Stream, promptTokens: int64(st.PromptTokens),
		gateUS: g.Gate.Microseconds(), authUS: g.Auth.Microseconds(), policyUS: g.Policy.Microseconds(),
		rateLimitUS: g.RateLimit.Microseconds(), checksUS: g.Checks.Microseconds(),
		decision: fieldString(st.Decision, request.MaxStampField), requestID: fieldString(st.RequestID, request.MaxStampField),
		model: fieldString(st.Model, request.MaxStampField), tenant: fieldString(st.Tenant, request.MaxStampField),
		principal: fieldString(st.Principal, request.MaxStampField), reason: fieldString(st.Reason, request.MaxStampReason),
		traceparent: traceparent, reservation: p.Reservation, api: string(st.API),
	}
}

// envoyMetadata is the dynamic metadata of an admitted request: the gate's
// namespace and the meter's sealed field, in a namespace of its own. Sent
// is now: the request leaves the gateway with these answers, and a meter
// that skips the request headers times the response from here.
func (s *Server) envoyMetadata(ctx context.Context, p *gate.Plan, traceparent string) (*structpb.Struct, error) {
	gm, err := gateMetadata(p, traceparent)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	mf := meterField(p, s.now().UnixMicro(), traceparent)
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
		request.MetadataNamespace: structpb.NewStructValue(gm),
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
