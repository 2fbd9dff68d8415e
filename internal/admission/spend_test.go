package admission

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// spendLog records what a Controller tells its SpendRecorder of
// settlements.
type spendLog []spendEntry

func (l *spendLog) Reserved(string, []ratelimit.State) {}

type spendEntry struct {
	tenant, model string
	charged       ratelimit.Cost
	proved        bool
}

func (l *spendLog) Charged(_ context.Context, tenant string, s *request.Settlement, c ratelimit.Cost, proved bool) {
	*l = append(*l, spendEntry{tenant, s.Model, c, proved})
}

// The spend ledger learns each settlement's charge, once: the proven usage
// when the response proved it, else the reservation kept; a replay adds
// nothing.
func TestSettlementsReachTheSpendRecorder(t *testing.T) {
	now := time.Unix(1_700_000_010, 0)
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits}}
	var got spendLog
	c.Spend = &got
	ctx := context.Background()
	admit := func() string {
		v := c.Decide(ctx, chat(nil))
		if v.Deny != nil || v.Reservation == "" {
			t.Fatalf("admitted request: %+v", v)
		}
		return v.Reservation
	}
	proved := admit()
	c.Settle(ctx, &request.Settlement{Reservation: proved, Model: "m", Origin: request.OriginPool, SSE: true, End: request.EndComplete,
		Terminal: true, UsageRead: true, PromptTokens: 7, CompletionTokens: 3})
	c.Settle(ctx, &request.Settlement{Reservation: proved, Model: "m", Origin: request.OriginPool, SSE: true, End: request.EndComplete,
		Terminal: true, UsageRead: true, PromptTokens: 7, CompletionTokens: 3}) // a replay
	lost := admit()
	c.Settle(ctx, &request.Settlement{Reservation: lost, Model: "m", SSE: true, End: request.EndLost, PromptTokens: 7})
	// A total-tokens budget records no split: its reservation (120 tokens,
	// as budget() shows) counts as input (reservedCost).
	want := spendLog{
		{model: "m", charged: ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: 3}, proved: true},
		{model: "m", charged: ratelimit.Cost{Requests: 1, InputTokens: 120}, proved: false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("recorded %+v, want %+v", got, want)
	}
}
