package gate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// Plan is the gate's answer to a request the policy has decided, as a
// value: PlanOf computes it from the request and the verdict alone, and
// an adapter's one encoder (extproc's Server.answer) turns it into the
// proxy's answers, the gate's metadata, what the meter is told and the
// gate's span.
type Plan struct {
	// Deny is the policy's refusal, answered as it is: nothing below is set.
	Deny *openai.Error
	// Fail: the request was admitted but cannot be forwarded as it must be
	// (its output cap cannot be written): answered 500 gate_error, its
	// reservation given back.
	Fail error
	// Stamp is the gate's part of the request's stamp: the request id, the
	// model, API, stream and prompt tokens, the decision, reason and who
	// called, the policy's timings. Gateway.Gate is the adapter's to set:
	// it is the gate's own time, the plan's making included.
	Stamp request.Stamp
	Code  string // counted with the decision: "allowed", or the code a shadow denial would have answered
	// Remove and Set are the request header mutations; Body, when not nil,
	// replaces the request body.
	Remove    []string
	Set       []Header
	Body      []byte
	MaxTokens int // the output cap as sent upstream
	// UsageAdded: the gate set stream_options.include_usage on a stream
	// whose client did not ask for usage. The pool's usage-only event is
	// the meter's to read and not the client's to see: the proxy removes
	// it after the meter (sse.UsageStripper; envoy/snippet.yaml's
	// infergate.usage filter).
	UsageAdded  bool
	Reservation string // the policy's reservation, settled by the meter
	Metadata    map[string]any
}

// Header is a request header to set.
type Header struct{ Key, Value string }

// Rules are the options PlanOf follows (see extproc.Options).
type Rules struct {
	KeepUsageOption, HonourUsageOptOut bool
	ChatOutputLimit                    string
}

// PlanOf is the gate's answer to adm, a request the policy answered v:
// a denial, or the mutations that let it through (the client's reserved
// headers and credential removed, the routing header set, usage asked of a
// stream, the output capped at the reservation's) and what the meter is
// told. removed are the headers to remove.
func PlanOf(r Rules, adm *request.Admission, removed []string, v request.Verdict) Plan {
	req := adm.Request
	refused := Plan{Stamp: request.Stamp{RequestID: adm.RequestID, Model: req.Model, API: adm.API}}
	if v.Deny != nil && v.Decision != "shadow_deny" {
		refused.Deny = v.Deny
		return refused
	}
	p := refused
	p.Stamp.Stream, p.Stamp.PromptTokens = req.Stream, adm.PromptTokens
	p.Stamp.Decision, p.Stamp.Reason = cmp.Or(v.Decision, "allow"), v.Reason
	p.Stamp.Principal, p.Stamp.Tenant = v.Principal, v.Tenant
	p.Stamp.Gateway.Timings = v.Timings
	p.Code = "allowed"
	if v.Deny != nil { // shadow_deny: what would have been answered
		p.Code = v.Deny.Code
	}
	p.Reservation, p.Metadata, p.MaxTokens = v.Reservation, v.Metadata, req.MaxTokens
	if req.Model != "" {
		p.Set = append(make([]Header, 0, 2), Header{request.ModelHeader, req.Model}) // room for content-length
	}
	var err error
	if p.Remove, p.Set, err = pickerIdentity(removed, p.Set, v); err != nil {
		refused.Fail = err // a Policy that did not validate them: never sent unchecked
		return refused
	}
	// Usage on every stream: a client's include_usage: false would leave
	// the charge to infergate's own count (see Options.HonourUsageOptOut).
	// Only chat and text completions need asking: a Responses stream ends
	// with its usage (response.completed), an Anthropic one carries it in
	// message_start and message_delta.
	optedOut := req.IncludeUsage != nil && !*req.IncludeUsage
	asksUsage := adm.API == openai.APIChat || adm.API == openai.APICompletions
	if asksUsage && req.Stream && !r.KeepUsageOption && (req.IncludeUsage == nil || optedOut && !r.HonourUsageOptOut) {
		if b, err := openai.WithUsage(adm.Body); err == nil {
			p.Body, p.UsageAdded = b, true
		}
	}
	if v.MaxTokens > 0 && adm.Completion && adm.API.Generates() {
		// The reservation counted v.MaxTokens per choice: the pool must
		// not be asked for more (a client that set none, or more than
		// its cap). Not rewritable (it was validated): fail closed
		// rather than let the pool write past the reservation.
		body := p.Body
		if body == nil {
			body = adm.Body
		}
		b, err := withMaxTokens(body, v.MaxTokens, outputLimitKeys(adm.API, r.ChatOutputLimit)...)
		if err != nil {
			refused.Fail = fmt.Errorf("max_tokens: %w", err)
			return refused
		}
		p.Body, p.MaxTokens = b, v.MaxTokens
	}
	if p.Body != nil {
		p.Set = append(p.Set, Header{"content-length", strconv.Itoa(len(p.Body))})
	}
	return p
}

// pickerIdentity adds to the request's header mutation what an Endpoint
// Picker is told (request.PickerHeaders): a client's Inference Extension
// headers are removed, always, present or not (the gate is not sent them:
// see ForwardedHeaders); when the policy names a fairness id or an objective,
// both are set, the fairness id defaulting to the tenant's
// (request.TenantFairnessID). Without, nothing is set: a hosted pool is
// not told the tenant, and a picker queues the request in its default
// flow at its default priority.
func pickerIdentity(remove []string, set []Header, v request.Verdict) ([]string, []Header, error) {
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
			set = append(set, Header{h, fairness})
		case h == request.ObjectiveHeader && v.Objective != "":
			set = append(set, Header{h, v.Objective})
		default:
			remove = append(remove, h)
		}
	}
	return remove, set, nil
}
