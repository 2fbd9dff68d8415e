package admission

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/request"
)

// A request Envoy answered itself before any pool was asked (NeverSent,
// from Envoy's own details) gets its reservation back whole, requests
// included, once; any other local reply of Envoy's keeps it whole, as
// does a NeverSent that does not come with Envoy as the origin (budgets
// carried over from case to case).
func TestNeverSentReleasesTheReservation(t *testing.T) {
	now := time.Unix(1_700_000_010, 0)
	for name, lim := range limiters(t, func() time.Time { return now }) {
		t.Run(name, func(t *testing.T) {
			c := newController(t)
			c.Keys, c.JWT.Enabled = nil, false
			c.Limiter = lim
			c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits}}
			ctx := context.Background()
			full := []int64{10, 1000}
			if got := budget(t, lim); !reflect.DeepEqual(got, full) {
				t.Fatalf("budget before = %v", got)
			}
			for _, tc := range []struct {
				name string
				s    request.Settlement
				want []int64
			}{
				{"route_not_found", request.Settlement{Status: 404, Origin: request.OriginEnvoy, End: request.EndComplete, NeverSent: true}, full},
				{"Envoy's 504 after an attempt", request.Settlement{Status: 504, Origin: request.OriginEnvoy, End: request.EndComplete}, []int64{9, 880}},
				{"NeverSent without Envoy's origin", request.Settlement{Status: 404, Origin: request.OriginUnknown, End: request.EndLost, NeverSent: true}, []int64{8, 760}},
			} {
				v := c.Decide(ctx, chat(nil))
				if v.Deny != nil || v.Reservation == "" {
					t.Fatalf("%s: admitted request: %+v", tc.name, v)
				}
				s := tc.s
				s.Reservation = v.Reservation
				c.Settle(ctx, &s)
				c.Settle(ctx, &s) // a replay moves nothing
				if got := budget(t, lim); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: budget %v after settling, want %v", tc.name, got, tc.want)
				}
			}
		})
	}
}
