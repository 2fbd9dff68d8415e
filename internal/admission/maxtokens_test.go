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

// A request reserves its effective max_tokens per choice: the client's,
// held to the policy's cap; unset, the cap, else the configured default.
// Both paths (the default reservation and a policy's reserve that leaves
// the output out) use it, and where the cap changed it the verdict says
// what the body must carry upstream.
func TestEffectiveMaxTokens(t *testing.T) {
	const budget = 1_000_000
	unset := int64(policy.Unset)
	for i, tc := range []struct {
		name              string
		asked, choices    int
		cap, defaultMax   int
		reserve           *ratelimit.Cost
		listing           bool       // GET /v1/models: no output
		api               openai.API // "": a chat completion
		wantReserved      int64
		wantUpstreamLimit int // Verdict.MaxTokens
	}{
		{name: "unset, capped", cap: 4096, wantReserved: 20 + 4096, wantUpstreamLimit: 4096},
		{name: "unset, capped, n=3", choices: 3, cap: 4096, wantReserved: 20 + 3*4096, wantUpstreamLimit: 4096},
		{name: "below the cap", asked: 100, cap: 4096, wantReserved: 20 + 100},
		{name: "at the cap", asked: 4096, cap: 4096, wantReserved: 20 + 4096},
		{name: "above the cap, allowed by the policy", asked: 5000, cap: 4096, wantReserved: 20 + 4096, wantUpstreamLimit: 4096},
		{name: "unset, no cap", wantReserved: 20 + DefaultOutputReservation, wantUpstreamLimit: DefaultOutputReservation},
		{name: "unset, no cap, configured default, n=2", choices: 2, defaultMax: 300, wantReserved: 20 + 2*300, wantUpstreamLimit: 300},
		{name: "set, no cap", asked: 5000, defaultMax: 300, wantReserved: 20 + 5000},
		{name: "policy reserve without output", cap: 4096, choices: 2,
			reserve: &ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: unset}, wantReserved: 7 + 2*4096, wantUpstreamLimit: 4096},
		{name: "policy reserve with output", cap: 4096,
			reserve: &ratelimit.Cost{Requests: 1, InputTokens: unset, OutputTokens: 50}, wantReserved: 20 + 50, wantUpstreamLimit: 4096},
		{name: "model listing", listing: true, cap: 4096, wantReserved: 0},
		// Each API's output cap (max_output_tokens, Anthropic's max_tokens)
		// arrives as Request.MaxTokens and is reserved and capped alike.
		{name: "responses, above the cap", api: openai.APIResponses, asked: 5000, cap: 4096, wantReserved: 20 + 4096, wantUpstreamLimit: 4096},
		{name: "responses, unset, no cap", api: openai.APIResponses, wantReserved: 20 + DefaultOutputReservation, wantUpstreamLimit: DefaultOutputReservation},
		{name: "messages, below the cap", api: openai.APIMessages, asked: 100, cap: 4096, wantReserved: 20 + 100},
		// Embeddings write nothing: their input is the reservation, and no
		// cap goes upstream.
		{name: "embeddings", api: openai.APIEmbeddings, cap: 4096, defaultMax: 300, wantReserved: 20},
		// Counting tokens runs no model: the request is all it costs.
		{name: "count_tokens", api: openai.APICountTokens, cap: 4096, wantReserved: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(t)
			c.Keys, c.JWT.Enabled = nil, false
			c.DefaultMaxTokens = tc.defaultMax
			c.Limiter = ratelimit.NewMemory(time.Now)
			key := "t=" + strconv.Itoa(i)
			c.Policy = &fakePolicy{d: policy.Decision{Allow: true, MaxTokens: tc.cap, Reserve: tc.reserve,
				Limits: []ratelimit.Limit{{Name: "tpm", Key: key, Unit: ratelimit.TotalTokens, Amount: budget, Window: time.Minute}}}}
			a := &request.Admission{RequestID: "r", Method: "POST", Path: "/v1/chat/completions", Completion: true, API: tc.api,
				Request: openai.Request{Model: "llama", MaxTokens: tc.asked, Choices: tc.choices}, PromptTokens: 20}
			if tc.listing {
				a = &request.Admission{RequestID: "r", Method: "GET", Path: "/v1/models"}
			}
			v := c.Decide(context.Background(), a)
			if v.Deny != nil {
				t.Fatalf("denied: %+v", v.Deny)
			}
			remaining, _ := strconv.ParseInt(v.Metadata["x-ratelimit-remaining-tokens"].(string), 10, 64)
			if got := budget - remaining; got != tc.wantReserved {
				t.Errorf("reserved %d tokens, want %d", got, tc.wantReserved)
			}
			if v.MaxTokens != tc.wantUpstreamLimit {
				t.Errorf("upstream max_tokens %d, want %d", v.MaxTokens, tc.wantUpstreamLimit)
			}
		})
	}
}

// The cap goes upstream whether or not the policy names budgets.
func TestCapWithoutBudgets(t *testing.T) {
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, MaxTokens: 64}}
	if v := c.Decide(context.Background(), chat(nil)); v.Deny != nil || v.MaxTokens != 64 || v.Reservation != "" {
		t.Errorf("verdict %+v: want admitted, max_tokens 64 upstream, nothing reserved", v)
	}
}
