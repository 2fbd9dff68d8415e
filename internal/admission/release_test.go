package admission

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

var releaseLimits = []ratelimit.Limit{
	{Name: "rpm", Key: "t=acme", Unit: ratelimit.Requests, Amount: 10, Window: time.Minute},
	{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 1000, Window: time.Minute},
}

// budget returns what remains of each of releaseLimits, charging nothing.
func budget(t *testing.T, l ratelimit.Limiter) []int64 {
	t.Helper()
	res, err := l.Reserve(context.Background(), releaseLimits, ratelimit.Cost{})
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, s := range res.States {
		out = append(out, s.Remaining)
	}
	return out
}

// limiters are the backends a release must work on: memory, and Redis
// behind the fallback as internal/cli wires it.
func limiters(t *testing.T, clock ratelimit.Clock) map[string]ratelimit.Limiter {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return map[string]ratelimit.Limiter{
		"memory": ratelimit.NewMemory(clock),
		"redis": ratelimit.WithFallback(ratelimit.NewRedis(rdb, clock, ratelimit.RedisOptions{}),
			ratelimit.FailClosed, nil, nil),
	}
}

// A request denied after its reservation (a check rejects it, is down with
// onError: deny, is not configured, or the client hangs up during it)
// leaves the budget exactly as it was before the request: requests and
// tokens. Before, the reservation stayed charged as a lost stream, so a
// moderation outage drained every tenant's budget.
func TestDenialAfterReservationReleasesIt(t *testing.T) {
	var status atomic.Int64
	var hangUp atomic.Pointer[context.CancelFunc]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cancel := hangUp.Load(); cancel != nil {
			(*cancel)()                 // the client goes away while the check runs
			io.Copy(io.Discard, r.Body) // lets the server see the hang-up
			select {
			case <-r.Context().Done():
			case <-time.After(time.Second):
			}
			return
		}
		if s := int(status.Load()); s != 0 {
			w.WriteHeader(s)
			w.Write([]byte(`{"reason":"violence"}`))
			return
		}
		io.Copy(io.Discard, r.Body) // lets the server see the hang-up
		<-r.Context().Done()        // down: the check times out
	}))
	defer srv.Close()

	now := time.Unix(1_700_000_010, 0)
	for name, lim := range limiters(t, func() time.Time { return now }) {
		t.Run(name, func(t *testing.T) {
			c := newController(t)
			c.Keys, c.JWT.Enabled = nil, false
			c.Limiter = lim
			check := NewCheck(Check{Name: "moderation", URL: srv.URL, Timeout: 50 * time.Millisecond, Log: c.Log})
			c.Checks = map[string]*Check{"moderation": check}
			ctx := context.Background()

			// One admitted request first, so there is a budget in use.
			c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits}}
			if v := c.Decide(ctx, chat(nil)); v.Deny != nil || v.Reservation == "" {
				t.Fatalf("admitted request: %+v", v)
			}
			before := budget(t, lim)
			if want := []int64{9, 880}; !reflect.DeepEqual(before, want) {
				t.Fatalf("budget after one request = %v, want %v", before, want)
			}

			for _, tc := range []struct {
				name   string
				checks []string
				status int // the check's answer; 0: times out
				hangUp bool
				want   int // the denial's status
			}{
				{name: "check denies", checks: []string{"moderation"}, status: 403, want: 400},
				{name: "check down (5xx), onError deny", checks: []string{"moderation"}, status: 503, want: 503},
				{name: "check down (timeout), onError deny", checks: []string{"moderation"}, want: 503},
				{name: "check not configured", checks: []string{"pii"}, want: 500},
				{name: "client hangs up during the check", checks: []string{"moderation"}, hangUp: true, want: 503},
			} {
				status.Store(int64(tc.status))
				c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits, Checks: tc.checks}}
				ctx, cancel := context.WithCancel(context.Background())
				if tc.hangUp {
					hangUp.Store(&cancel)
				}
				v := c.Decide(ctx, chat(nil))
				hangUp.Store(nil)
				cancel()
				if v.Deny == nil || v.Deny.Status != tc.want {
					t.Errorf("%s: denial %+v, want status %d", tc.name, v.Deny, tc.want)
				}
				if v.Reservation != "" {
					t.Errorf("%s: a denied verdict carries reservation %q", tc.name, v.Reservation)
				}
				if got := budget(t, lim); !reflect.DeepEqual(got, before) {
					t.Errorf("%s: budget %v after the denial, want %v as before the request", tc.name, got, before)
				}
			}
		})
	}
}

// A check that panics after the reservation gives it back too.
func TestPanicAfterReservationReleasesIt(t *testing.T) {
	now := time.Unix(1_700_000_010, 0)
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	mem := ratelimit.NewMemory(func() time.Time { return now })
	c.Limiter = mem
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits, Checks: []string{"moderation"}}}
	c.Checks = map[string]*Check{"moderation": {Name: "moderation", URL: "http://127.0.0.1:1", Timeout: time.Second, Log: c.Log}} // nil Client
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Decide did not panic with a nil client")
			}
		}()
		c.Decide(context.Background(), chat(nil))
	}()
	if got, want := budget(t, mem), []int64{10, 1000}; !reflect.DeepEqual(got, want) {
		t.Errorf("budget after a panic = %v, want %v", got, want)
	}
}

// In shadow mode a check's denial is not enforced: the request goes on to
// a pool, so its reservation stays for the meter to settle.
func TestShadowDenialKeepsReservation(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	now := time.Unix(1_700_000_010, 0)
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Shadow = true
	mem := ratelimit.NewMemory(func() time.Time { return now })
	c.Limiter = mem
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits, Checks: []string{"moderation"}}}
	c.Checks = map[string]*Check{"moderation": NewCheck(Check{Name: "moderation", URL: srv.URL, Timeout: time.Second, Log: c.Log})}
	ctx := context.Background()
	v := c.Decide(ctx, chat(nil))
	if v.Decision != "shadow_deny" || v.Reservation == "" {
		t.Fatalf("shadow denial: decision %q, reservation %q; want shadow_deny with the reservation", v.Decision, v.Reservation)
	}
	if got, want := budget(t, mem), []int64{9, 880}; !reflect.DeepEqual(got, want) {
		t.Errorf("budget = %v, want %v (reserved)", got, want)
	}
	c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, PromptTokens: 20, CompletionTokens: 30, UsageRead: true, End: request.EndComplete})
	if got, want := budget(t, mem), []int64{9, 950}; !reflect.DeepEqual(got, want) {
		t.Errorf("budget after settling = %v, want %v", got, want)
	}
}

// A release counts as a settlement with no usage: reserved and settled
// reservations still match once traffic stops.
func TestReleaseCountedAsSettled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	reader := sdkmetric.NewManualReader()
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_010, 0)
	c := newController(t)
	c.Keys, c.JWT.Enabled, c.Metrics = nil, false, m
	c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: releaseLimits, Checks: []string{"moderation"}}}
	c.Checks = map[string]*Check{"moderation": NewCheck(Check{Name: "moderation", URL: srv.URL, Timeout: time.Second, Log: c.Log})}
	if v := c.Decide(context.Background(), chat(nil)); v.Deny == nil {
		t.Fatal("not denied")
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				state, _ := dp.Attributes.Value("state")
				op, _ := dp.Attributes.Value("op")
				got[mt.Name+"/"+state.AsString()+op.AsString()] += dp.Value
			}
		}
	}
	want := map[string]int64{
		"infergate.ratelimit.reservations/reserved": 1,
		"infergate.ratelimit.reservations/settled":  1,
		"infergate.ratelimit.tokens/reserved":       120,
		"infergate.ratelimit.tokens/settled":        0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// The output reserved is the effective max_tokens for each completion
// asked for; a policy's reserve is taken as it states it, a field it left
// out (policy.Unset) keeping the default.
func TestReservationCost(t *testing.T) {
	unset := int64(policy.Unset)
	for _, tc := range []struct {
		name                       string
		prompt, maxTokens, choices int
		spec                       *ratelimit.Cost
		want                       ratelimit.Cost
	}{
		{name: "one completion", prompt: 20, maxTokens: 100, choices: 1, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 100}},
		{name: "n=4", prompt: 20, maxTokens: 100, choices: 4, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 400}},
		{name: "unset choices count as one", prompt: 20, maxTokens: 100, choices: 0, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 100}},
		{name: "negative choices count as one", prompt: 20, maxTokens: 100, choices: -3, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 100}},
		{name: "no output (not a completion)", prompt: 0, maxTokens: 0, choices: 1, want: ratelimit.Cost{Requests: 1}},
		{name: "largest request the gate accepts", prompt: 20, maxTokens: 1<<31 - 1, choices: 128, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: (1<<31 - 1) * 128}},
		{name: "exact far past any budget", prompt: 20, maxTokens: 1 << 40, choices: 1 << 20, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 1 << 60}},
		{name: "saturated", prompt: 20, maxTokens: 1 << 40, choices: 1 << 23, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: math.MaxInt64}},
		{name: "saturated at the edge", prompt: 0, maxTokens: math.MaxInt64 / 3, choices: 4, want: ratelimit.Cost{Requests: 1, OutputTokens: math.MaxInt64}},
		{name: "exact at the edge", prompt: 0, maxTokens: math.MaxInt64 / 3, choices: 3, want: ratelimit.Cost{Requests: 1, OutputTokens: math.MaxInt64 / 3 * 3}},
		{name: "policy reserve as stated", prompt: 20, maxTokens: 100, choices: 4, spec: &ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: 9}, want: ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: 9}},
		{name: "policy reserve without output", prompt: 20, maxTokens: 100, choices: 4, spec: &ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: unset}, want: ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: 400}},
		{name: "policy reserve without input", prompt: 20, maxTokens: 100, choices: 4, spec: &ratelimit.Cost{Requests: 1, InputTokens: unset, OutputTokens: 0}, want: ratelimit.Cost{Requests: 1, InputTokens: 20, OutputTokens: 0}},
	} {
		if got := reservationCost(tc.prompt, tc.maxTokens, tc.choices, tc.spec); got != tc.want {
			t.Errorf("%s: reservationCost = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
