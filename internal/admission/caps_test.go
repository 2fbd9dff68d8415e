package admission

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// admitted parses body as api does at the gate and decides it under d,
// with a token budget of budget; it returns the verdict and the tokens
// reserved.
func admitted(t *testing.T, api openai.API, path, body string, d policy.Decision) (request.Verdict, int64) {
	t.Helper()
	const budget = 1_000_000
	r, err := openai.Parse(api, []byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Limiter = ratelimit.NewMemory(time.Now)
	d.Allow = true
	d.Limits = []ratelimit.Limit{{Name: "tpm", Key: "t", Unit: ratelimit.TotalTokens, Amount: budget, Window: time.Minute}}
	c.Policy = &fakePolicy{d: d}
	v := c.Decide(context.Background(), &request.Admission{RequestID: "r", Method: "POST", Path: path, Completion: true,
		API: api, Request: r, Body: []byte(body), PromptTokens: r.PromptTokens})
	if v.Deny != nil {
		return v, 0
	}
	remaining, _ := strconv.ParseInt(v.Metadata["x-ratelimit-remaining-tokens"].(string), 10, 64)
	return v, budget - remaining
}

// A body with two output caps reserves the larger, whatever the order and
// whichever its API's servers read; under a policy's cap, the cap goes
// upstream (the gate holds every key present to it).
func TestReservationCountsTheLargestCap(t *testing.T) {
	for _, tc := range []struct {
		api        openai.API
		path, body string
	}{
		{openai.APIChat, "/v1/chat/completions", `{"model":"m","max_completion_tokens":1,"max_tokens":50000,"messages":[]}`},
		{openai.APIChat, "/v1/chat/completions", `{"model":"m","max_tokens":1,"max_completion_tokens":50000,"messages":[]}`},
		{openai.APICompletions, "/v1/completions", `{"model":"m","max_completion_tokens":1,"max_tokens":50000,"prompt":""}`},
	} {
		r, _ := openai.Parse(tc.api, []byte(tc.body))
		prompt := int64(r.PromptTokens)
		if v, reserved := admitted(t, tc.api, tc.path, tc.body, policy.Decision{}); v.Deny != nil || reserved != prompt+50000 || v.MaxTokens != 0 {
			t.Errorf("%s, no cap: reserved %d, upstream cap %d, %v; want %d, none", tc.body, reserved, v.MaxTokens, v.Deny, prompt+50000)
		}
		if v, reserved := admitted(t, tc.api, tc.path, tc.body, policy.Decision{MaxTokens: 4096}); v.Deny != nil || reserved != prompt+4096 || v.MaxTokens != 4096 {
			t.Errorf("%s, cap 4096: reserved %d, upstream cap %d, %v; want %d, 4096", tc.body, reserved, v.MaxTokens, v.Deny, prompt+4096)
		}
	}
}

// A response whose cost the gate cannot bound is refused unless the
// policy names its field in allow_unbounded; then it reserves what the
// policy's reserve states, else the usual estimate.
func TestUnboundedCostRefusedByDefault(t *testing.T) {
	const path = "/v1/responses"
	for field, body := range map[string]string{
		"background":           `{"model":"m","input":"hi","max_output_tokens":100,"background":true}`,
		"conversation":         `{"model":"m","input":"hi","max_output_tokens":100,"conversation":{"id":"conv_1"}}`,
		"prompt":               `{"model":"m","max_output_tokens":100,"prompt":{"id":"pmpt_1"}}`,
		"previous_response_id": `{"model":"m","input":"hi","max_output_tokens":100,"previous_response_id":"resp_1"}`,
	} {
		others := []string{}
		for _, f := range policy.UnboundedFields {
			if f != field {
				others = append(others, f)
			}
		}
		v, reserved := admitted(t, openai.APIResponses, path, body, policy.Decision{AllowUnbounded: others})
		if v.Deny == nil || v.Deny.Status != 400 || v.Deny.Code != "unsupported_parameter" || v.Deny.Param == nil || *v.Deny.Param != field ||
			v.Reason != "unbounded_cost:"+field || reserved != 0 || v.Reservation != "" {
			t.Errorf("%s, not accepted: verdict %+v (deny %+v), reserved %d; want a 400 naming it, nothing reserved", field, v, v.Deny, reserved)
		}
		r, _ := openai.Parse(openai.APIResponses, []byte(body))
		if v, reserved := admitted(t, openai.APIResponses, path, body, policy.Decision{AllowUnbounded: []string{field}}); v.Deny != nil || reserved != int64(r.PromptTokens)+100 {
			t.Errorf("%s, accepted: %v, reserved %d; want the estimate %d", field, v.Deny, reserved, r.PromptTokens+100)
		}
		spec := &ratelimit.Cost{Requests: 1, InputTokens: 5000, OutputTokens: policy.Unset}
		if v, reserved := admitted(t, openai.APIResponses, path, body, policy.Decision{AllowUnbounded: []string{field}, Reserve: spec}); v.Deny != nil || reserved != 5000+100 {
			t.Errorf("%s, accepted with a reserve: %v, reserved %d; want the policy's %d", field, v.Deny, reserved, 5000+100)
		}
	}
	// Without a policy nothing opts in.
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	r, _ := openai.Parse(openai.APIResponses, []byte(`{"model":"m","background":true}`))
	if v := c.Decide(context.Background(), &request.Admission{RequestID: "r", Method: "POST", Path: path, Completion: true,
		API: openai.APIResponses, Request: r}); v.Deny == nil || v.Deny.Status != 400 {
		t.Errorf("no policy: %+v, want refused", v)
	}
	// A bounded response, stored or not, passes without consent.
	if v, _ := admitted(t, openai.APIResponses, path, `{"model":"m","input":"hi","store":false}`, policy.Decision{}); v.Deny != nil {
		t.Errorf("a bounded response: %+v", v.Deny)
	}
}
