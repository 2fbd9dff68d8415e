package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/internal/testutil/slowproxy"
)

const otherKey = "sk-live-other-tenant"

// tenantBudgets gives each tenant a budget of its own: 10,000 tokens a
// minute (a chat() reserves 120).
type tenantBudgets struct{}

func (tenantBudgets) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	return policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "tpm", Key: "t=" + in.Tenant, Unit: ratelimit.TotalTokens, Amount: 10_000, Window: time.Minute}}}, nil
}

// frozen is a clock stopped at its first reading: a test that compares a
// budget's counter across calls must not see its window turn over.
func frozen() func() time.Time {
	t0 := time.Now()
	return func() time.Time { return t0 }
}

// twoTenants is a Controller with two keys, secretKey (tenant acme) and
// otherKey (globex), per-tenant budgets on limiter, settle-once records in
// once, and a spend log.
func twoTenants(t *testing.T, limiter ratelimit.Limiter, once seal.Once) (*Controller, *spendLog) {
	c := newController(t)
	path := filepath.Join(t.TempDir(), "keys.yaml")
	sum := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	os.WriteFile(path, []byte("keys:\n- id: acme-prod\n  sha256: "+sum(secretKey)+"\n  tenant: acme\n"+
		"- id: globex-prod\n  sha256: "+sum(otherKey)+"\n  tenant: globex\n"), 0o600)
	keys, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	c.Keys.Store(keys)
	c.Limiter, c.Settled, c.Policy = limiter, once, tenantBudgets{}
	var spent spendLog
	c.Spend = &spent
	return c, &spent
}

// remaining is what tenant key's budget has left, as a new request's
// headers say (that request settled at once, as proved unused).
func remaining(t *testing.T, c *Controller, key string) int {
	t.Helper()
	ctx := context.Background()
	v := c.Decide(ctx, chat(map[string]string{"x-api-key": key}))
	if v.Deny != nil {
		t.Fatalf("a probe was refused: %v", v.Deny)
	}
	n, _ := strconv.Atoi(v.Metadata["x-ratelimit-remaining-tokens"].(string))
	c.Release(ctx, "probe", v.Reservation)
	return n + 120
}

// proved is a settlement whose pool's usage was read whole: 7 + 3 tokens.
func proved(reservation string) *request.Settlement {
	return &request.Settlement{Reservation: reservation, Model: "llama", Origin: request.OriginPool, SSE: true,
		End: request.EndComplete, Terminal: true, UsageRead: true, PromptTokens: 7, CompletionTokens: 3}
}

// One tenant that leaks its seals (requests Envoy refused after the gate
// admitted them, never settled) fills its own share of the settle-once
// records: its next request is refused 429 too_many_requests_in_flight,
// its reservation given back whole; another tenant's requests are
// admitted, settled and recorded exactly as before. Before, the table was
// one for all: once full, every tenant's settlement was refused.
func TestFullTenantShareRefusesOnlyThatTenant(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	for name, once := range map[string]func() seal.Once{
		"memory": func() seal.Once { return &seal.MemoryOnce{PerTenant: 4, Now: time.Now} },
		"redis": func() seal.Once {
			rdb.FlushAll(context.Background())
			return seal.RedisOnce{Client: rdb, Now: time.Now, PerTenant: 4}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, spent := twoTenants(t, ratelimit.NewMemory(frozen()), once())
			ctx := context.Background()
			greedy, other := map[string]string{"x-api-key": secretKey}, map[string]string{"x-api-key": otherKey}
			for i := range 4 { // four seals: the share
				if v := c.Decide(ctx, chat(greedy)); v.Deny != nil || v.Reservation == "" {
					t.Fatalf("request %d within the share: %+v", i, v.Deny)
				}
			}
			before := remaining(t, c, otherKey)
			v := c.Decide(ctx, chat(greedy))
			if v.Deny == nil || v.Deny.Status != http.StatusTooManyRequests || v.Deny.Code != "too_many_requests_in_flight" ||
				v.Reservation != "" || v.Headers["retry-after"] == "" {
				t.Fatalf("past its share: %+v, want 429 too_many_requests_in_flight", v)
			}
			for range 3 {
				v := c.Decide(ctx, chat(other))
				if v.Deny != nil || v.Reservation == "" {
					t.Fatalf("another tenant refused: %v", v.Deny)
				}
				c.Settle(ctx, proved(v.Reservation))
			}
			if after := remaining(t, c, otherKey); after != before-30 {
				t.Errorf("globex's budget: %d left after three settled requests of 10 tokens, want %d", after, before-30)
			}
			for _, e := range *spent {
				if e.tenant != "globex" || !e.proved || e.charged.InputTokens+e.charged.OutputTokens != 10 {
					t.Errorf("spend recorded %+v, want globex's proved 10 tokens", e)
				}
			}
			if len(*spent) != 3 {
				t.Errorf("%d settlements recorded, want 3", len(*spent))
			}
		})
	}
}

// The share's refusal gives the reservation back whole: two refused
// requests leave the tenant's budget holding its two admitted ones.
func TestFullTenantShareReleasesTheReservation(t *testing.T) {
	c, _ := twoTenants(t, ratelimit.NewMemory(frozen()), &seal.MemoryOnce{PerTenant: 2, Now: time.Now})
	ctx := context.Background()
	greedy := map[string]string{"x-api-key": secretKey}
	for range 2 {
		if v := c.Decide(ctx, chat(greedy)); v.Deny != nil {
			t.Fatal(v.Deny)
		}
	}
	for range 2 {
		if v := c.Decide(ctx, chat(greedy)); v.Deny == nil || v.Deny.Code != "too_many_requests_in_flight" {
			t.Fatalf("past the share: %+v", v.Deny)
		}
	}
	res, err := c.Limiter.Reserve(ctx, []ratelimit.Limit{{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 10_000, Window: time.Minute}},
		ratelimit.Cost{})
	if err != nil || len(res.States) != 1 || res.States[0].Remaining != 10_000-2*120 {
		t.Errorf("acme's budget after two refusals: %+v %v, want %d left", res.States, err, 10_000-2*120)
	}
}

// A slow Redis: the settle-once claims and the budget scripts go through a
// proxy that holds replies past the client's read timeout, after Redis ran
// them. Three cases, each tenant's requests alike: the claim's first reply
// lost (its retry, under the same claimant, settles to the proof); every
// try of the claim lost (uncertain: recorded under its tenant, its
// reservation kept whole); the budget script's reply lost (never resent:
// the counter settled, the spend records the reservation). No settlement
// loses its tenant, each is recorded once, replays move nothing, and every
// counter holds at least what the pool used.
func TestSlowRedisKeepsTenantsAndBalances(t *testing.T) {
	srv := redisserver.Start(t)
	proxy := slowproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 100 * time.Millisecond, MaxRetries: -1,
		Protocol: 2, DisableIdentity: true}) // no handshake: every reply is a command's
	t.Cleanup(func() { _ = rdb.Close() })
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = direct.Close() })
	once := seal.RedisOnce{Client: rdb, Now: time.Now, Retry: seal.Retry{Attempts: 3, PerAttempt: time.Second, Total: 5 * time.Second}}
	clock := frozen()
	c, spent := twoTenants(t, ratelimit.NewRedis(rdb, clock, ratelimit.RedisOptions{}), once)
	ctx := context.Background()
	tenants := map[string]string{secretKey: "acme", otherKey: "globex"}
	decide := func(key string) string {
		v := c.Decide(ctx, chat(map[string]string{"x-api-key": key}))
		if v.Deny != nil || v.Reservation == "" {
			t.Fatalf("refused: %v", v.Deny)
		}
		return v.Reservation
	}
	// Warm up: every script loaded, so each settlement is one reply for
	// the claim, then one for the budget.
	c.Settle(ctx, proved(decide(secretKey)))
	c.Settle(ctx, proved(decide(otherKey)))
	*spent = nil
	type admitted struct{ key, reservation string }
	var reqs []admitted
	for i := range 12 {
		key := secretKey
		if i%2 == 1 {
			key = otherKey
		}
		reqs = append(reqs, admitted{key, decide(key)})
	}
	held := []struct {
		match string
		n     int
	}{
		{"ig:sealed:", 1}, // the claim's first reply
		{"ig:sealed:", 3}, // every try of the claim
		{"t=", 1},         // the budget script's reply (its counters: t=<tenant>)
	}
	for i, r := range reqs {
		h := held[i%3]
		proxy.Hold(h.match, h.n, 300*time.Millisecond)
		c.Settle(ctx, proved(r.reservation))
	}
	proxy.Hold("", 0, 0)
	if proxy.Held() != 4*(1+3+1) {
		t.Fatalf("%d replies held, want %d", proxy.Held(), 4*(1+3+1))
	}
	if len(*spent) != len(reqs) {
		t.Fatalf("%d settlements recorded, want %d (one each)", len(*spent), len(reqs))
	}
	want := []struct {
		tokens int64
		proved bool
	}{{10, true}, {120, false}, {120, false}}
	used := map[string]int64{"acme": 10, "globex": 10} // the warm-up's
	for i, e := range *spent {
		if tenant := tenants[reqs[i].key]; e.tenant != tenant {
			t.Errorf("settlement %d recorded under %q, want %q", i, e.tenant, tenant)
		}
		w := want[i%3]
		if got := e.charged.InputTokens + e.charged.OutputTokens; got != w.tokens || e.proved != w.proved {
			t.Errorf("settlement %d (case %d): charged %d, proved %v; want %d, %v", i, i%3, got, e.proved, w.tokens, w.proved)
		}
		counted := w.tokens
		if i%3 == 2 {
			counted = 10 // the script ran; its reply alone was lost
		}
		used[e.tenant] += counted
	}
	// Replays (a second meter stream, a retried settlement) move nothing.
	for _, r := range reqs {
		c.Settle(ctx, proved(r.reservation))
	}
	if len(*spent) != len(reqs) {
		t.Errorf("replays recorded: %d settlements, want %d", len(*spent), len(reqs))
	}
	for _, tenant := range tenants {
		if got := counter(t, direct, clock, "t="+tenant); got != used[tenant] {
			t.Errorf("%s: counter %d, want %d (at least the 10 tokens each request used)", tenant, got, used[tenant])
		}
	}
}

// counter is what a tenant's tpm budget counts at now, read in Redis
// directly.
func counter(t *testing.T, rdb *redis.Client, now func() time.Time, key string) int64 {
	t.Helper()
	l := ratelimit.NewRedis(rdb, now, ratelimit.RedisOptions{})
	res, err := l.Reserve(context.Background(), []ratelimit.Limit{{Name: "tpm", Key: key, Unit: ratelimit.TotalTokens, Amount: 10_000, Window: time.Minute}},
		ratelimit.Cost{Requests: 1})
	if err != nil || len(res.States) != 1 {
		t.Fatal(res, err)
	}
	if err := l.Release(context.Background(), res.Reservation); err != nil {
		t.Fatal(err)
	}
	return 10_000 - res.States[0].Remaining
}
