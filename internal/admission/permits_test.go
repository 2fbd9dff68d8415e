package admission

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
)

// Permits asks who is calling and the policy's allow, and nothing else: no
// budget is charged however often it is asked.
func TestPermitsChargesNothing(t *testing.T) {
	c := newController(t)
	c.Limiter = ratelimit.NewMemory(time.Now)
	fp := &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "rpm", Key: "t=acme", Unit: ratelimit.Requests, Amount: 1, Window: time.Minute}}}}
	c.Policy = fp
	ctx := context.Background()
	hdr := map[string]string{"authorization": "Bearer " + secretKey}
	for range 3 {
		if !c.Permits(ctx, chat(hdr)) {
			t.Fatal("allowed request not permitted")
		}
	}
	if fp.last.Request.Model != "llama" || fp.last.Principal.ID != "acme-prod" {
		t.Errorf("policy input %+v", fp.last)
	}
	if v := c.Decide(ctx, chat(hdr)); v.Deny != nil {
		t.Errorf("the one request of the budget was spent by Permits: %v", v.Deny)
	}
	if c.Permits(ctx, chat(nil)) {
		t.Error("no key: permitted")
	}
	fp.d.Allow = false
	if c.Permits(ctx, chat(hdr)) {
		t.Error("denied request permitted")
	}
	c.Shadow = true
	if !c.Permits(ctx, chat(hdr)) {
		t.Error("shadow mode enforces nothing: every request is permitted")
	}
}
