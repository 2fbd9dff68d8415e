package gate

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// PlanOf, branch by branch, without Envoy: what a verdict on a request
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
		rules   Rules
		adm     *request.Admission
		removed []string
		v       request.Verdict
		// want
		deny      bool
		fail      bool
		decision  string
		code      string
		set       []Header
		remove    []string // nil: removed and every request.PickerHeaders
		body      string   // "": unchanged
		maxTokens int
	}{
		"policy denies": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}), v: request.Verdict{Deny: denied, Decision: "deny"},
			deny: true},
		"shadow denial admits, counted with its code": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v:        request.Verdict{Deny: denied, Decision: "shadow_deny", Reason: "rate_limited"},
			decision: "shadow_deny", code: "rate_limited", set: []Header{{request.ModelHeader, "m"}}},
		"allowed by default, routing header set, headers removed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m", MaxTokens: 7}),
			removed: []string{"authorization", "x-infergate-model"}, decision: "allow", code: "allowed",
			set: []Header{{request.ModelHeader, "m"}}, maxTokens: 7},
		"no model, no routing header": {adm: &request.Admission{RequestID: "req-1", Method: "GET", Path: "/health"},
			v: request.Verdict{Decision: "allow"}, decision: "allow", code: "allowed"},
		"a stream is asked for its usage": {adm: chat(`{"model":"m","stream":true}`, streamed),
			decision: "allow", code: "allowed", body: usageAsked, maxTokens: 50,
			set: []Header{{request.ModelHeader, "m"}, {"content-length", "67"}}},
		"a client's opt-out is overridden": {adm: chat(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
			openai.Request{Model: "m", Stream: true, IncludeUsage: &no}),
			decision: "allow", code: "allowed", body: usageAsked,
			set: []Header{{request.ModelHeader, "m"}, {"content-length", "67"}}},
		"a client's opt-out is honoured when configured": {rules: Rules{HonourUsageOptOut: true},
			adm: chat(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
				openai.Request{Model: "m", Stream: true, IncludeUsage: &no}),
			decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "m"}}},
		"a client that asks already is left": {adm: chat(usageAsked, openai.Request{Model: "m", Stream: true, IncludeUsage: &yes}),
			decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "m"}}},
		"the option kept when configured": {rules: Rules{KeepUsageOption: true}, adm: chat(`{"model":"m","stream":true}`, streamed),
			decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "m"}}, maxTokens: 50},
		"a body WithUsage cannot read is left": {adm: chat(`[]`, streamed),
			decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "m"}}, maxTokens: 50},
		"an API that reports its usage is not asked": {
			adm: &request.Admission{RequestID: "req-1", Completion: true, API: openai.APIMessages,
				Request: openai.Request{Model: "m", Stream: true}, Body: []byte(`{"model":"m","stream":true}`)},
			decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "m"}}},
		"the output capped at the reservation's": {adm: chat(`{"model":"m","max_tokens":100}`, openai.Request{Model: "m", MaxTokens: 100}),
			v:        request.Verdict{MaxTokens: 20},
			decision: "allow", code: "allowed", body: `{"model":"m","max_tokens":20}`, maxTokens: 20,
			set: []Header{{request.ModelHeader, "m"}, {"content-length", "29"}}},
		"the cap written into the usage-asking body": {adm: chat(`{"model":"m","stream":true}`, streamed),
			v:        request.Verdict{MaxTokens: 20},
			decision: "allow", code: "allowed", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":20}`,
			maxTokens: 20, set: []Header{{request.ModelHeader, "m"}, {"content-length", "83"}}},
		"no cap on an API that writes no output": {
			adm: &request.Admission{RequestID: "req-1", Completion: true, API: openai.APIEmbeddings,
				Request: openai.Request{Model: "e"}, Body: []byte(`{"model":"e","input":"x"}`)},
			v: request.Verdict{MaxTokens: 20}, decision: "allow", code: "allowed", set: []Header{{request.ModelHeader, "e"}}},
		"no cap on a request that is not inference": {adm: &request.Admission{RequestID: "req-1", Path: "/v1/files"},
			v: request.Verdict{MaxTokens: 20}, decision: "allow", code: "allowed"},
		"a cap that cannot be written fails closed": {adm: chat(`[]`, openai.Request{Model: "m"}), v: request.Verdict{MaxTokens: 20},
			fail: true},
		"an objective: the picker told it, and the tenant as the fairness id": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			removed: []string{"authorization"}, v: request.Verdict{Objective: "sheddable"}, decision: "allow", code: "allowed",
			set:    []Header{{request.ModelHeader, "m"}, {request.FairnessIDHeader, "acme"}, {request.ObjectiveHeader, "sheddable"}},
			remove: []string{"authorization", request.EndpointHeader, request.EndpointSubsetKey, request.EndpointServedKey, request.ModelRewriteHeader}},
		"the policy's fairness id, no objective: the client's removed": {adm: chat(`{"model":"m"}`, openai.Request{Model: "m"}),
			v: request.Verdict{FairnessID: "acme/search"}, decision: "allow", code: "allowed",
			set:    []Header{{request.ModelHeader, "m"}, {request.FairnessIDHeader, "acme/search"}},
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
			p := PlanOf(c.rules, c.adm, c.removed, v)
			if (p.Deny != nil) != c.deny || (p.Fail != nil) != c.fail {
				t.Fatalf("deny %v, fail %v; want deny %v, fail %v", p.Deny, p.Fail, c.deny, c.fail)
			}
			if c.deny || c.fail {
				if p.Stamp.Model != c.adm.Request.Model || p.Stamp.RequestID != "req-1" || p.Set != nil || p.Body != nil {
					t.Errorf("refused plan %+v: want the model and request id alone", p)
				}
				return
			}
			st := p.Stamp
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
			if p.Code != c.code || !slices.Equal(p.Set, c.set) || !slices.Equal(p.Remove, wantRemove) ||
				string(p.Body) != c.body || p.MaxTokens != c.maxTokens || p.Reservation != "r-1" || p.Metadata["note"] != "x" {
				t.Errorf("plan: code %q, set %v, remove %v, body %q, max_tokens %d, reserved %q\nwant: code %q, set %v, remove %v, body %q, max_tokens %d",
					p.Code, p.Set, p.Remove, p.Body, p.MaxTokens, p.Reservation, c.code, c.set, wantRemove, c.body, c.maxTokens)
			}
			if (p.Body == nil) != (c.body == "") {
				t.Errorf("body %q, want it unchanged (nil): %v", p.Body, c.body == "")
			}
			const asked = `"include_usage":true`
			if added := strings.Contains(c.body, asked) && !strings.Contains(string(c.adm.Body), asked); p.UsageAdded != added {
				t.Errorf("UsageAdded %t, want %t: the proxy must strip exactly the usage the gate asked for", p.UsageAdded, added)
			}
		})
	}
}
