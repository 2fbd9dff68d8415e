package gate

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// planGate, branch by branch, without Envoy: what a verdict on a request
// becomes (a denial, a failure, or the mutations and the gate's stamp).
func TestPlanGate(t *testing.T) {
	yes, no := true, false
	denied := openai.NewError(429, openai.TypeRateLimit, "rate_limited", "", "slow down")
	timings := request.Timings{Auth: time.Millisecond, Policy: 2 * time.Millisecond, RateLimit: 3 * time.Millisecond, Checks: 4 * time.Millisecond}
	chat := func(body string, req openai.Request) *request.Admission {
		return &request.Admission{RequestID: "req-1", Method: "POST", Path: "/v1/chat/completions", Completion: true,
			API: openai.APIChat, Request: req, Body: []byte(body), PromptTokens: req.PromptTokens}
	}
	streamed := openai.Request{Model: "m", Stream: true, PromptTokens: 9, MaxTokens: 50}
	usageAsked := `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`
	for name, c := range map[string]struct {
		rules   gateRules
		adm     *request.Admission
		removed []string
		v       request.Verdict
		// want
		deny      bool
		fail      bool
		decision  string
		code      string
		set       []headerValue
		remove    []string // nil: removed and every request.PickerHeaders
		body      string   // "": unchanged
		maxTokens int
	}{
		"policy denies": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}), v: request.Verdict{Deny: denied, Decision: "deny"},
			deny: true},
		"shadow denial admits, counted with its code": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v:        request.Verdict{Deny: denied, Decision: "shadow_deny", Reason: "rate_limited"},
			decision: "shadow_deny", code: "rate_limited", set: []headerValue{{request.ModelHeader, "m"}}},
		"allowed by default, routing header set, headers removed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m", MaxTokens: 7}),
			removed: []string{"authorization", "x-infergate-model"}, decision: "allow", code: "allowed",
			set: []headerValue{{request.ModelHeader, "m"}}, maxTokens: 7},
		"no model, no routing header": {adm: &request.Admission{RequestID: "req-1", Method: "GET", Path: "/health"},
			v: request.Verdict{Decision: "allow"}, decision: "allow", code: "allowed"},
		"a stream is asked for its usage": {adm: chat(`{"model":"m","stream":true}`, streamed),
			decision: "allow", code: "allowed", body: usageAsked, maxTokens: 50,
			set: []headerValue{{request.ModelHeader, "m"}, {"content-length", "67"}}},
		"a client's opt-out is overridden": {adm: chat(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
			openai.Request{Model: "m", Stream: true, IncludeUsage: &no}),
			decision: "allow", code: "allowed", body: usageAsked,
			set: []headerValue{{request.ModelHeader, "m"}, {"content-length", "67"}}},
		"a client's opt-out is honoured when configured": {rules: gateRules{honourUsageOptOut: true},
			adm: chat(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
				openai.Request{Model: "m", Stream: true, IncludeUsage: &no}),
			decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "m"}}},
		"a client that asks already is left": {adm: chat(usageAsked, openai.Request{Model: "m", Stream: true, IncludeUsage: &yes}),
			decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "m"}}},
		"the option kept when configured": {rules: gateRules{keepUsageOption: true}, adm: chat(`{"model":"m","stream":true}`, streamed),
			decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "m"}}, maxTokens: 50},
		"a body WithUsage cannot read is left": {adm: chat(`[]`, streamed),
			decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "m"}}, maxTokens: 50},
		"an API that reports its usage is not asked": {
			adm: &request.Admission{RequestID: "req-1", Completion: true, API: openai.APIMessages,
				Request: openai.Request{Model: "m", Stream: true}, Body: []byte(`{"model":"m","stream":true}`)},
			decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "m"}}},
		"the output capped at the reservation's": {adm: chat(`{"model":"m","max_tokens":100}`, openai.Request{Model: "m", MaxTokens: 100}),
			v:        request.Verdict{MaxTokens: 20},
			decision: "allow", code: "allowed", body: `{"model":"m","max_tokens":20}`, maxTokens: 20,
			set: []headerValue{{request.ModelHeader, "m"}, {"content-length", "29"}}},
		"the cap written into the usage-asking body": {adm: chat(`{"model":"m","stream":true}`, streamed),
			v:        request.Verdict{MaxTokens: 20},
			decision: "allow", code: "allowed", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":20}`,
			maxTokens: 20, set: []headerValue{{request.ModelHeader, "m"}, {"content-length", "83"}}},
		"no cap on an API that writes no output": {
			adm: &request.Admission{RequestID: "req-1", Completion: true, API: openai.APIEmbeddings,
				Request: openai.Request{Model: "e"}, Body: []byte(`{"model":"e","input":"x"}`)},
			v: request.Verdict{MaxTokens: 20}, decision: "allow", code: "allowed", set: []headerValue{{request.ModelHeader, "e"}}},
		"no cap on a request that is not inference": {adm: &request.Admission{RequestID: "req-1", Path: "/v1/files"},
			v: request.Verdict{MaxTokens: 20}, decision: "allow", code: "allowed"},
		"a cap that cannot be written fails closed": {adm: chat(`[]`, openai.Request{Model: "m"}), v: request.Verdict{MaxTokens: 20},
			fail: true},
		"an objective: the picker told it, and the tenant as the fairness id": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			removed: []string{"authorization"}, v: request.Verdict{Objective: "sheddable"}, decision: "allow", code: "allowed",
			set:    []headerValue{{request.ModelHeader, "m"}, {request.FairnessIDHeader, "acme"}, {request.ObjectiveHeader, "sheddable"}},
			remove: []string{"authorization", request.EndpointHeader, request.EndpointSubsetKey, request.EndpointServedKey, request.ModelRewriteHeader}},
		"the policy's fairness id, no objective: the client's removed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v: request.Verdict{FairnessID: "acme/search"}, decision: "allow", code: "allowed",
			set:    []headerValue{{request.ModelHeader, "m"}, {request.FairnessIDHeader, "acme/search"}},
			remove: []string{request.ObjectiveHeader, request.EndpointHeader, request.EndpointSubsetKey, request.EndpointServedKey, request.ModelRewriteHeader}},
		"an objective the policy did not validate fails closed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v: request.Verdict{Objective: "Critical\r\nx-evil: 1"}, fail: true},
		"a fairness id the policy did not validate fails closed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v: request.Verdict{FairnessID: strings.Repeat("a", request.MaxFairnessIDBytes+1)}, fail: true},
	} {
		t.Run(name, func(t *testing.T) {
			v := c.v
			v.Principal, v.Tenant, v.Reservation, v.Timings = "key-1", "acme", "r-1", timings
			v.Metadata = map[string]any{"note": "x"}
			if v.Reason == "" {
				v.Reason = "because"
			}
			p := planGate(c.rules, c.adm, c.removed, v)
			if (p.deny != nil) != c.deny || (p.fail != nil) != c.fail {
				t.Fatalf("deny %v, fail %v; want deny %v, fail %v", p.deny, p.fail, c.deny, c.fail)
			}
			if c.deny || c.fail {
				if p.stamp.Model != c.adm.Request.Model || p.stamp.RequestID != "req-1" || p.set != nil || p.body != nil {
					t.Errorf("refused plan %+v: want the model and request id alone", p)
				}
				return
			}
			st := p.stamp
			want := request.Stamp{RequestID: "req-1", Model: c.adm.Request.Model, API: c.adm.API, Stream: c.adm.Request.Stream,
				PromptTokens: c.adm.PromptTokens, Decision: c.decision, Reason: v.Reason, Principal: "key-1", Tenant: "acme",
				Gateway: request.GatewayTime{Timings: timings}}
			if st.RequestID != want.RequestID || st.Model != want.Model || st.API != want.API || st.Stream != want.Stream ||
				st.PromptTokens != want.PromptTokens || st.Decision != want.Decision || st.Reason != want.Reason ||
				st.Principal != want.Principal || st.Tenant != want.Tenant || st.Gateway != want.Gateway {
				t.Errorf("stamp %+v\nwant  %+v", st, want)
			}
			wantRemove := c.remove
			if wantRemove == nil {
				wantRemove = append(slices.Clone(c.removed), request.PickerHeaders...)
			}
			if p.code != c.code || !slices.Equal(p.set, c.set) || !slices.Equal(p.remove, wantRemove) ||
				string(p.body) != c.body || p.maxTokens != c.maxTokens || p.reserved != "r-1" || p.metadata["note"] != "x" {
				t.Errorf("plan: code %q, set %v, remove %v, body %q, max_tokens %d, reserved %q\nwant: code %q, set %v, remove %v, body %q, max_tokens %d",
					p.code, p.set, p.remove, p.body, p.maxTokens, p.reserved, c.code, c.set, wantRemove, c.body, c.maxTokens)
			}
			if (p.body == nil) != (c.body == "") {
				t.Errorf("body %q, want it unchanged (nil): %v", p.body, c.body == "")
			}
		})
	}
}

// The metadata and the meter's field say what the plan says, the field's
// strings cut to the stamp's bounds; what protobuf cannot carry is an
// error (the request then fails closed).
func TestPlanEncodings(t *testing.T) {
	p := gatePlan{stamp: request.Stamp{RequestID: "req-1", Model: "m", API: openai.APIChat, Stream: true, PromptTokens: 9,
		Decision: "allow", Reason: strings.Repeat("r", maxStampReason+10), Principal: "key-1", Tenant: "acme",
		Gateway: request.GatewayTime{Gate: 5 * time.Microsecond, Timings: request.Timings{Auth: time.Microsecond,
			Policy: 2 * time.Microsecond, RateLimit: 3 * time.Microsecond, Checks: 4 * time.Microsecond}}},
		maxTokens: 20, reserved: "r-1", metadata: map[string]any{"note": "x", "model": "policy's"}}
	md, err := p.gateMetadata("00-tp")
	if err != nil {
		t.Fatal(err)
	}
	f := md.GetFields()
	for k, want := range map[string]any{"model": "policy's", "api": "chat", "stream": true, "max_tokens": 20.0, "prompt_tokens": 9.0,
		"decision": "allow", "reason": p.stamp.Reason, "principal": "key-1", "tenant": "acme", "gate_us": 5.0, "auth_us": 1.0,
		"policy_us": 2.0, "ratelimit_us": 3.0, "checks_us": 4.0, "reservation": "r-1", request.TraceparentKey: "00-tp", "note": "x"} {
		if got := f[k].AsInterface(); got != want {
			t.Errorf("metadata %s = %v, want %v", k, got, want)
		}
	}
	if len(f) != 17 {
		t.Errorf("metadata has %d fields, want 17", len(f))
	}
	q := p
	q.reserved, q.metadata = "", nil
	if md, _ := q.gateMetadata(""); md.GetFields()["reservation"] != nil || md.GetFields()[request.TraceparentKey] != nil {
		t.Errorf("metadata %v: no reservation nor traceparent wanted", md)
	}

	got := p.meterField(1234, "00-tp")
	want := gateField{sent: 1234, stream: true, promptTokens: 9, gateUS: 5, authUS: 1, policyUS: 2, rateLimitUS: 3, checksUS: 4,
		decision: "allow", requestID: "req-1", model: "m", tenant: "acme", principal: "key-1",
		reason: truncate(p.stamp.Reason, maxStampReason), traceparent: "00-tp", reservation: "r-1", api: "chat"}
	if got != want {
		t.Errorf("field %+v\nwant  %+v", got, want)
	}
	q = p
	q.stamp.RequestID = "id-\xff"
	if f := q.meterField(0, ""); f.requestID != "id-\uFFFD" {
		t.Errorf("field request id %q, want valid UTF-8", f.requestID)
	}

	for name, bad := range map[string]func(*gatePlan){
		"a string that is not UTF-8": func(p *gatePlan) { p.stamp.Tenant = "\xff" },
		"a key that is not UTF-8":    func(p *gatePlan) { p.metadata = map[string]any{"\xff": "x"} },
		"a value protobuf can't":     func(p *gatePlan) { p.metadata = map[string]any{"f": func() {}} },
	} {
		q := p
		bad(&q)
		if _, err := q.gateMetadata(""); err == nil {
			t.Errorf("%s: encoded, want an error", name)
		}
	}
}

// The adapter's last check: a field longer than the meter reads (only a
// reservation can make one) fails closed, its reservation given back.
func TestGateFailsClosedOnAnOverlongField(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	g := &gateRequest{started: time.Now(), headers: headers{":path": "/v1/chat/completions", "x-request-id": "req-1"}}
	adm := &request.Admission{RequestID: "req-1", Request: openai.Request{Model: "m"}}
	v := request.Verdict{Reservation: strings.Repeat("r", maxMeterField)}
	plan := planGate(s.gateRules(), adm, nil, v)
	out := s.answer(context.Background(), g, adm, v, &plan)
	if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 500 {
		t.Fatalf("answers %v, want one 500", out)
	}
	if len(p.released) != 1 || len(sink.stamps) != 1 || sink.stamps[0].Reason != "gate_error" || sink.stamps[0].Model != "m" {
		t.Errorf("releases %d, stamps %+v; want the reservation released and a gate_error stamp", len(p.released), sink.stamps)
	}
}
