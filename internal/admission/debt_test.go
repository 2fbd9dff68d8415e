package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// mediaChat is a chat asking about n images by URL, parsed as the gate
// parses it.
func mediaChat(t *testing.T, hdr map[string]string, images int) *request.Admission {
	t.Helper()
	parts := []string{`{"type":"text","text":"What are these?"}`}
	for i := range images {
		parts = append(parts, `{"type":"image_url","image_url":{"url":"https://example.com/`+strconv.Itoa(i)+`.png"}}`)
	}
	body := []byte(`{"model":"llama","max_tokens":100,"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
	r, err := openai.Parse(openai.APIChat, body)
	if err != nil {
		t.Fatal(err)
	}
	return &request.Admission{RequestID: "r", Method: "POST", Path: "/v1/chat/completions", Headers: hdr, Completion: true,
		API: openai.APIChat, Request: r, PromptTokens: r.PromptTokens, Body: body}
}

// The scenario: a per-minute budget exceeded twelve times over by
// a request whose images counted far more than estimated is paid back in
// the following eleven minutes, on every store, not forgotten at the next
// window.
func TestMediaOverrunIsPaidBack(t *testing.T) {
	srv := redisserver.Start(t)
	for name, newLimiter := range map[string]func(ratelimit.Clock) ratelimit.Limiter{
		"memory": func(c ratelimit.Clock) ratelimit.Limiter { return ratelimit.NewMemory(c) },
		"redis": func(c ratelimit.Clock) ratelimit.Limiter {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			return ratelimit.NewRedis(rdb, c, ratelimit.RedisOptions{Prefix: "debt:"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := newController(t)
			now := time.Unix(1_700_006_400, 0).Add(5 * time.Second) // 5 s into a minute
			c.Now = func() time.Time { return now }
			c.Limiter = newLimiter(func() time.Time { return now })
			const budget = 10_000
			c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
				{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: budget, Window: time.Minute}}}}
			ctx := context.Background()
			hdr := map[string]string{"x-api-key": secretKey}

			a := mediaChat(t, hdr, 2)
			v := c.Decide(ctx, a)
			if v.Deny != nil {
				t.Fatalf("the media request: %+v", v.Deny)
			}
			// The pool counts the images at about 60,000 tokens each
			// (within what an image may cost: MaxTokensPerImage) and
			// writes its cap: 12 times the budget, within the bounds.
			prompt, completion := 119_900, 100
			if a.Request.MaxPromptTokens < prompt {
				t.Fatalf("MaxPromptTokens %d below the scenario's prompt", a.Request.MaxPromptTokens)
			}
			now = now.Add(20 * time.Second)
			c.Settle(ctx, &request.Settlement{RequestID: "r", Reservation: v.Reservation, API: openai.APIChat, Status: 200,
				Origin: request.OriginPool, End: request.EndComplete, UsageRead: true, PromptTokens: prompt, CompletionTokens: completion})

			small := func() request.Verdict { return c.Decide(ctx, chat(hdr)) }
			for minute := 1; minute <= 11; minute++ {
				now = time.Unix(1_700_006_400, 0).Add(time.Duration(minute)*time.Minute + 30*time.Second)
				if v := small(); v.Deny == nil || v.Deny.Status != 429 {
					t.Fatalf("minute %d: a request was admitted (%+v) with %d tokens of debt left", minute, v.Deny, (12-minute)*budget)
				}
			}
			now = time.Unix(1_700_006_400, 0).Add(12*time.Minute + 30*time.Second)
			if v := small(); v.Deny != nil {
				t.Fatalf("minute 12, the debt paid: %+v", v.Deny)
			}
		})
	}
}

// The bounds travel sealed from the gate to the settlement: a pool
// reporting more output than the cap sent upstream is charged the cap.
func TestSettleHoldsUsageToTheSealedBounds(t *testing.T) {
	c := newController(t)
	now := time.Unix(1_700_006_400, 0)
	c.Now = func() time.Time { return now }
	c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "tpm", Key: "t=acme", Unit: ratelimit.OutputTokens, Amount: 1_000_000, Window: time.Minute}}}}
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}
	a := mediaChat(t, hdr, 0)
	v := c.Decide(ctx, a)
	if v.Deny != nil {
		t.Fatal(v.Deny)
	}
	c.Settle(ctx, &request.Settlement{RequestID: "r", Reservation: v.Reservation, API: openai.APIChat, Status: 200,
		Origin: request.OriginPool, End: request.EndComplete, UsageRead: true, PromptTokens: 10, CompletionTokens: 1 << 29})
	got := c.Decide(ctx, chat(hdr)).Metadata["x-ratelimit-remaining-tokens"]
	// 100 charged (the cap), then 100 reserved by the probe.
	if want := fmt.Sprint(1_000_000 - 200); got != want {
		t.Errorf("remaining %v, want %s (the cap charged, not the pool's count)", got, want)
	}
}
