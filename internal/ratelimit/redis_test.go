package ratelimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRedisCounterKeysAndTTL(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), false)
	ctx := context.Background()
	tests := []struct {
		name    string
		opts    RedisOptions
		limit   Limit
		at      time.Duration
		wantKey string
		wantTTL time.Duration // PTTL right after the call, ±1 s
	}{
		{
			name:    "default: key is the hash tag, one window of grace",
			limit:   rpm("rpm", "tenant=a", 5),
			at:      10 * time.Second,
			wantKey: "ig:rl:{tenant=a}:requests:60000:1700006400000",
			wantTTL: 50*time.Second + time.Minute,
		},
		{
			name:    "prefix, hash tag and grace",
			opts:    RedisOptions{Prefix: "p:", HashTag: "all", Grace: 5 * time.Second},
			limit:   Limit{Name: "tpd", Key: "tenant=b", Unit: TotalTokens, Amount: 5, Window: 24 * time.Hour},
			at:      20 * time.Hour,
			wantKey: "p:{all}:tenant=b:total_tokens:86400000:1700006400000",
			wantTTL: 4*time.Hour + 5*time.Second,
		},
		{
			name:    "no grace",
			opts:    RedisOptions{Prefix: "ng:", Grace: -1},
			limit:   rpm("rpm", "k", 5),
			at:      61 * time.Second,
			wantKey: "ng:{k}:requests:60000:1700006460000",
			wantTTL: 59 * time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(tc.at))
			l := NewRedis(rdb, clock.Now, tc.opts)
			res, err := l.Reserve(ctx, []Limit{tc.limit}, req(2, 3))
			if err != nil || !res.Allowed {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
			if got := res.Reservation.Entries[0].Counter; got != tc.wantKey {
				t.Errorf("counter = %q, want %q", got, tc.wantKey)
			}
			ttl, err := rdb.PTTL(ctx, tc.wantKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl > tc.wantTTL || ttl < tc.wantTTL-time.Second {
				t.Errorf("PTTL = %s, want about %s", ttl, tc.wantTTL)
			}
			// A second charge keeps the TTL set by the first.
			clock.Advance(time.Second)
			if _, err := l.Reserve(ctx, []Limit{tc.limit}, req(0, 0)); err != nil {
				t.Fatal(err)
			}
			if ttl2, _ := rdb.PTTL(ctx, tc.wantKey).Result(); ttl2 > ttl {
				t.Errorf("PTTL grew from %s to %s on the second charge", ttl, ttl2)
			}
		})
	}
}

// Settling a window in force never creates a counter: if Redis lost it
// (restart, eviction), the settlement is dropped.
func TestRedisSettleMissingCounter(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), false)
	ctx := context.Background()
	clock := newFakeClock(t0)
	l := NewRedis(rdb, clock.Now, RedisOptions{})
	limits := []Limit{tpm("tpm", "k", 100), rpm("rpm", "k", 10)}
	res, err := l.Reserve(ctx, limits, req(10, 10))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	tokens, requests := res.Reservation.Entries[0].Counter, res.Reservation.Entries[1].Counter
	if err := rdb.Del(ctx, tokens).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx, res.Reservation, req(50, 50)); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, tokens).Result(); n != 0 {
		t.Errorf("Settle re-created the deleted counter %s", tokens)
	}
	if v, _ := rdb.Get(ctx, requests).Int64(); v != 1 {
		t.Errorf("requests counter = %d, want 1", v)
	}
}

// After the script cache is flushed (a restart or failover), EVALSHA
// fails with NOSCRIPT and the script is sent again.
func TestRedisScriptCacheFlushed(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), false)
	ctx := context.Background()
	l := NewRedis(rdb, newFakeClock(t0).Now, RedisOptions{})
	limits := []Limit{tpm("tpm", "k", 100)}
	for i := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := l.Reserve(ctx, limits, req(10, 0))
		if err != nil || !res.Allowed {
			t.Fatalf("Reserve %d after SCRIPT FLUSH = %+v, %v", i, res, err)
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, res.Reservation, req(5, 0)); err != nil {
			t.Fatalf("Settle %d after SCRIPT FLUSH: %v", i, err)
		}
	}
	if got := remaining(t, l, limits); got[0] != 85 {
		t.Errorf("remaining = %d, want 85", got[0])
	}
}

func TestRedisErrorsWrapUnavailable(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), true)
	ctx := context.Background()
	l := NewRedis(rdb, newFakeClock(t0).Now, RedisOptions{})
	limits := []Limit{rpm("rpm", "k", 10)}
	res, err := l.Reserve(ctx, limits, req(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	// Each call fails after one round trip (none if there is nothing to
	// send): the limiter does not retry a Redis that is down.
	trips := roundTrips(rdb)
	calls := []struct {
		name  string
		call  func() error
		err   error
		trips int64
	}{
		{"Reserve", func() error { _, err := l.Reserve(ctx, limits, req(0, 0)); return err }, ErrUnavailable, 1},
		{"Settle with nothing to change", func() error { return l.Settle(ctx, res.Reservation, Cost{}) }, nil, 0},
		{"Settle", func() error {
			return l.Settle(ctx, Reservation{Entries: []Entry{{Counter: "x", Unit: InputTokens, ExpiresAt: t0.Add(time.Minute).UnixMilli()}}}, req(1, 0))
		}, ErrUnavailable, 1},
	}
	for _, c := range calls {
		before := trips.Load()
		if err := c.call(); !errors.Is(err, c.err) {
			t.Errorf("%s with Redis down = %v, want %v", c.name, err, c.err)
		}
		if n := trips.Load() - before; n != c.trips {
			t.Errorf("%s with Redis down sent %d round trips, want %d", c.name, n, c.trips)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Reserve(cctx, limits, req(0, 0)); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Errorf("Reserve with a cancelled context = %v, want context.Canceled only", err)
	}
}

// clusterHashTag is what Redis Cluster hashes of a key to pick its slot:
// the part between the first '{' and the next '}' if it is not empty,
// else the whole key.
func clusterHashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// A charge carried over from an ended window creates the counter of the
// window in force under the same hash tag as the reservation's counters
// (one slot for the whole script), with the TTL Reserve would give it.
func TestRedisCarriedCounter(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), false)
	ctx := context.Background()
	tests := []struct {
		name    string
		opts    RedisOptions
		limits  []Limit
		wantKey []string // the counters of the window in force, after settling
		wantTTL time.Duration
	}{
		{
			name:    "default: the limit key is the hash tag",
			opts:    RedisOptions{Prefix: "c1:"},
			limits:  []Limit{tpm("tpm", "tenant=a", 1000), {Name: "out", Key: "tenant=a", Unit: OutputTokens, Amount: 1000, Window: time.Minute}},
			wantKey: []string{"c1:{tenant=a}:total_tokens:60000:1700006460000", "c1:{tenant=a}:output_tokens:60000:1700006460000"},
			wantTTL: 50*time.Second + time.Minute,
		},
		{
			name:    "a hash tag for all keys, and grace",
			opts:    RedisOptions{Prefix: "c2:", HashTag: "all", Grace: 5 * time.Second},
			limits:  []Limit{tpm("tpm", "tenant=a", 1000), tpm("model", "model=m", 1000)},
			wantKey: []string{"c2:{all}:tenant=a:total_tokens:60000:1700006460000", "c2:{all}:model=m:total_tokens:60000:1700006460000"},
			wantTTL: 55 * time.Second,
		},
		{
			name:    "a key holding braces and colons, no grace",
			opts:    RedisOptions{Prefix: "c3:", Grace: -1},
			limits:  []Limit{tpm("tpm", "t={x}:y", 1000)},
			wantKey: []string{"c3:{t={x}:y}:total_tokens:60000:1700006460000"},
			wantTTL: 50 * time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(50 * time.Second))
			l := NewRedis(rdb, clock.Now, tc.opts)
			res, err := l.Reserve(ctx, tc.limits, req(10, 10))
			if err != nil || !res.Allowed {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
			clock.SetOffset(70 * time.Second)
			if err := l.Settle(ctx, res.Reservation, req(10, 40)); err != nil {
				t.Fatal(err)
			}
			for i, key := range tc.wantKey {
				old := res.Reservation.Entries[i].Counter
				if clusterHashTag(key) != clusterHashTag(old) {
					t.Errorf("carried counter %q hashes %q, its reservation's %q hashes %q: another slot", key, clusterHashTag(key), old, clusterHashTag(old))
				}
				v, err := rdb.Get(ctx, key).Int64()
				if err != nil || v != 30 {
					t.Errorf("GET %s = %d, %v; want 30", key, v, err)
				}
				ttl, err := rdb.PTTL(ctx, key).Result()
				if err != nil || ttl > tc.wantTTL || ttl < tc.wantTTL-time.Second {
					t.Errorf("PTTL %s = %s, %v; want about %s", key, ttl, err, tc.wantTTL)
				}
			}
			// A later charge in that window keeps the TTL.
			if _, err := l.Reserve(ctx, tc.limits, req(1, 1)); err != nil {
				t.Fatal(err)
			}
			if ttl, _ := rdb.PTTL(ctx, tc.wantKey[0]).Result(); ttl > tc.wantTTL {
				t.Errorf("PTTL grew to %s after a Reserve", ttl)
			}
		})
	}
}

// Releasing never creates a counter either.
func TestRedisReleaseMissingCounter(t *testing.T) {
	srv := startRedis(t)
	rdb := newRedisClient(t, srv.Addr(), false)
	ctx := context.Background()
	l := NewRedis(rdb, newFakeClock(t0).Now, RedisOptions{})
	res, err := l.Reserve(ctx, []Limit{tpm("tpm", "k", 100), rpm("rpm", "k", 10)}, req(10, 10))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	tokens, requests := res.Reservation.Entries[0].Counter, res.Reservation.Entries[1].Counter
	if err := rdb.Del(ctx, tokens).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, res.Reservation); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, tokens).Result(); n != 0 {
		t.Errorf("Release re-created the deleted counter %s", tokens)
	}
	if v, err := rdb.Get(ctx, requests).Int64(); err != nil || v != 0 {
		t.Errorf("requests counter = %d, %v; want 0", v, err)
	}
}
