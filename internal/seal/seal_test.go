package seal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/internal/testutil/slowproxy"
)

func loaded(t *testing.T, store Store, opts Options) *Keyring {
	t.Helper()
	r := NewKeyring(store, opts)
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// A seal opens only as it was written, for what it was written, under a
// key the ring holds, before it expires.
func TestSealOpens(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	opts := Options{Now: func() time.Time { return now }}
	r := loaded(t, &MemoryStore{}, opts)
	s := r.Seal(Reservation, "dGVuYW50.{\"e\":[]}", now.Add(time.Hour))
	got, err := r.Open(Reservation, s)
	if err != nil || got.Body != "dGVuYW50.{\"e\":[]}" || got.ID == "" || !got.Issued.Equal(now) || !got.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("Open = %+v, %v", got, err)
	}
	if again := r.Seal(Reservation, got.Body, now.Add(time.Hour)); again == s {
		t.Error("two seals of one body are alike: no random id")
	}
	other := loaded(t, &MemoryStore{}, opts)
	head := s[:strings.LastIndex(s[:strings.Index(s, "dGVu")-1], ".")]
	for name, tc := range map[string]struct {
		s    string
		p    Purpose
		want error
	}{
		"body changed":   {strings.Replace(s, "dGVuYW50", "Z2xvYmV4", 1), Reservation, ErrForged},
		"expiry changed": {strings.Replace(s, ".1700003600000.", ".1800003600000.", 1), Reservation, ErrForged},
		"another use":    {s, Field, ErrForged},
		"another ring":   {other.Seal(Reservation, got.Body, now.Add(time.Hour)), Reservation, ErrUnknownKey},
		"no body":        {head, Reservation, ErrForged},
		"garbage":        {"....", Reservation, ErrForged},
		"empty":          {"", Reservation, ErrForged},
		"long header":    {strings.Repeat("a", 300) + "." + s, Reservation, ErrForged},
	} {
		if _, err := r.Open(tc.p, tc.s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if r.UnknownKeys() != 1 {
		t.Errorf("%d unknown keys counted, want 1", r.UnknownKeys())
	}
	now = now.Add(time.Hour)
	if _, err := r.Open(Reservation, s); !errors.Is(err, ErrExpired) {
		t.Errorf("at its expiry: %v", err)
	}
	// No seal outlives MaxAge, whatever expiry it asks for.
	long, _ := r.Open(Reservation, r.Seal(Reservation, "b", now.Add(1000*time.Hour)))
	if !long.Expires.Equal(now.Add(25 * time.Hour)) {
		t.Errorf("expires %v, want MaxAge from now", long.Expires.Sub(now))
	}
}

// The in-memory records hold the seals outstanding, and fail closed: a
// seal claims once, a seal never issued (or issued while full) never;
// what expired or was claimed frees its room.
func TestMemoryOnce(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	o := &MemoryOnce{Max: 2, Now: func() time.Time { return now }}
	ctx := context.Background()
	issue := func(id string, exp time.Duration) error { return o.Issue(ctx, Reservation, "acme", id, now.Add(exp)) }
	claim := func(id string, exp time.Duration) (bool, error) {
		return o.Claim(ctx, Reservation, "acme", id, NewClaimant(), now.Add(exp))
	}
	if err := issue("a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Claim(ctx, Field, "acme", "a", "x", now.Add(time.Minute)); ok || err != nil {
		t.Errorf("a field's id is a reservation's: %v %v", ok, err)
	}
	if ok, err := claim("a", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := claim("a", time.Minute); ok || err != nil {
		t.Errorf("a replay: %v %v", ok, err)
	}
	if ok, err := claim("never", time.Minute); ok || err != nil {
		t.Errorf("never issued: %v %v", ok, err)
	}
	if err := errors.Join(issue("b", time.Hour), issue("c", 2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := issue("d", time.Hour); !errors.Is(err, ErrFull) {
		t.Errorf("full: %v", err)
	}
	if ok, _ := claim("d", time.Hour); ok {
		t.Error("a seal issued while full settles")
	}
	if ok, err := claim("c", -time.Second); ok || !errors.Is(err, ErrExpired) {
		t.Errorf("expired: %v %v", ok, err)
	}
	now = now.Add(4 * time.Minute) // c's minute has ended: its room is free
	if err := issue("e", time.Hour); err != nil {
		t.Errorf("after a seal expired: %v", err)
	}
	if ok, _ := claim("b", -4*time.Minute+time.Hour); !ok {
		t.Error("an outstanding seal no longer claims")
	}
	if o.n != 1 || o.Outstanding("acme") != 1 {
		t.Errorf("%d outstanding, %d of acme's, want 1", o.n, o.Outstanding("acme"))
	}
}

// onceStores are both stores, each tenant's share 3: memory, and Redis
// (real, standalone).
func onceStores(t *testing.T, now func() time.Time) map[string]Once {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return map[string]Once{
		"memory": &MemoryOnce{PerTenant: 3, Now: now},
		"redis":  RedisOnce{Client: rdb, Now: now, PerTenant: 3},
	}
}

// A tenant that leaks seals fills its own share only: its next Issue is
// refused (ErrTenantFull), another tenant's issue and claim as before; a
// claim, or an expiry, gives the room back. Issuing one seal twice (a
// retry) holds one place.
func TestTenantShares(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	for name, o := range onceStores(t, clock) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			exp := now.Add(2 * time.Minute)
			for _, id := range []string{"g1", "g2", "g3", "g3"} {
				if err := o.Issue(ctx, Field, "greedy", id, exp); err != nil {
					t.Fatal(id, err)
				}
			}
			if err := o.Issue(ctx, Reservation, "greedy", "g4", exp); !errors.Is(err, ErrTenantFull) {
				t.Fatalf("past its share: %v, want ErrTenantFull", err)
			}
			for _, id := range []string{"o1", "o2", "o3"} {
				if err := o.Issue(ctx, Reservation, "other", id, exp); err != nil {
					t.Fatalf("another tenant refused: %v", err)
				}
				if ok, err := o.Claim(ctx, Reservation, "other", id, NewClaimant(), exp); !ok || err != nil {
					t.Fatalf("another tenant's claim: %v %v", ok, err)
				}
			}
			if ok, err := o.Claim(ctx, Field, "greedy", "g1", NewClaimant(), exp); !ok || err != nil {
				t.Fatal(ok, err)
			}
			if err := o.Issue(ctx, Field, "greedy", "g5", now.Add(time.Minute)); err != nil {
				t.Fatalf("after a claim freed a place: %v", err)
			}
			now = now.Add(3 * time.Minute) // every seal expired
			for _, id := range []string{"g6", "g7", "g8"} {
				if err := o.Issue(ctx, Field, "greedy", id, now.Add(time.Minute)); err != nil {
					t.Fatalf("after its seals expired: %v", err)
				}
			}
		})
	}
}

// A claim is the claimant's: its retry reads true again (the reply of the
// first was lost), anyone else's false.
func TestClaimIsIdempotentPerClaimant(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	o := RedisOnce{Client: rdb, Now: time.Now}
	ctx := context.Background()
	exp := time.Now().Add(time.Minute)
	if err := o.Issue(ctx, Field, "acme", "id", exp); err != nil {
		t.Fatal(err)
	}
	me, other := NewClaimant(), NewClaimant()
	for i, tc := range []struct {
		who  string
		want bool
	}{{me, true}, {me, true}, {other, false}, {me, true}} {
		if ok, err := o.Claim(ctx, Field, "acme", "id", tc.who, exp); ok != tc.want || err != nil {
			t.Errorf("claim %d: %v %v, want %v", i, ok, err, tc.want)
		}
	}
	if ttl := rdb.PTTL(ctx, onceKey(Field, "acme", "id")).Val(); ttl <= 0 || ttl > claimedTTL {
		t.Errorf("the claim's mark lives %v, want at most %v", ttl, claimedTTL)
	}
}

// A slow Redis: the claim's reply is held past the client's read timeout
// (Redis ran the claim); the retry, under the same claimant, reads true.
// Held longer than every retry, the claim is uncertain (an error), never
// a false "replayed".
func TestClaimSurvivesSlowRedis(t *testing.T) {
	srv := redisserver.Start(t)
	proxy := slowproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 100 * time.Millisecond, MaxRetries: -1,
		Protocol: 2, DisableIdentity: true}) // no handshake: every reply is a command's
	t.Cleanup(func() { _ = rdb.Close() })
	o := RedisOnce{Client: rdb, Now: time.Now, Retry: Retry{Attempts: 3, PerAttempt: time.Second, Total: 5 * time.Second}}
	ctx := context.Background()
	exp := time.Now().Add(time.Minute)
	for _, id := range []string{"a", "b"} {
		if err := o.Issue(ctx, Field, "acme", id, exp); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Hold("ig:sealed:", 1, time.Second) // the first claim's reply, after Redis ran it
	if ok, err := o.Claim(ctx, Field, "acme", "a", NewClaimant(), exp); !ok || err != nil {
		t.Fatalf("a claim whose first reply was lost: %v %v", ok, err)
	}
	if proxy.Held() != 1 {
		t.Fatalf("%d replies held, want 1", proxy.Held())
	}
	if ok, err := o.Claim(ctx, Field, "acme", "a", NewClaimant(), exp); ok || err != nil {
		t.Errorf("another claimant after it: %v %v", ok, err)
	}
	proxy.HoldAll(time.Second)
	ok, err := o.Claim(ctx, Field, "acme", "b", NewClaimant(), exp)
	if ok || !errors.Is(err, ErrUncertain) {
		t.Errorf("a claim no reply came back for: %v %v, want ErrUncertain", ok, err)
	}
	proxy.Hold("", 0, 0)
}

// Keys rotate on schedule, in virtual time: two replicas sharing a store
// seal with the period's key and verify each other's seals across every
// rotation, a seal made before a rotation included, until it expires; a
// key is dropped once no seal of it can be live.
func TestKeyringRotates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &MemoryStore{}
		opts := Options{Rotation: time.Hour, Refresh: time.Minute, MaxAge: 3 * time.Hour}
		a, b := NewKeyring(store, opts), NewKeyring(store, opts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go a.Run(ctx)
		go b.Run(ctx)
		synctest.Wait()
		first := a.Seal(Reservation, "r", time.Now().Add(3*time.Hour))
		firstKey := keyOf(first)
		seen := map[string]bool{}
		for step := range 3 * 60 {
			time.Sleep(time.Minute)
			synctest.Wait()
			s := a.Seal(Reservation, "r", time.Now().Add(time.Hour))
			seen[keyOf(s)] = true
			if _, err := b.Open(Reservation, s); err != nil {
				t.Fatalf("minute %d: b cannot open a's seal: %v", step, err)
			}
			if _, err := b.Open(Reservation, first); err != nil && time.Now().Before(sealExpiry(t, first)) {
				t.Fatalf("minute %d: a seal made before the rotations: %v", step, err)
			}
		}
		if len(seen) < 3 {
			t.Errorf("%d keys over 3 hours of 1-hour rotations", len(seen))
		}
		time.Sleep(5 * time.Hour)
		synctest.Wait()
		if _, ok := b.lookup(firstKey); ok {
			t.Error("a key is kept after every seal it made expired")
		}
		if a.UnknownKeys()+b.UnknownKeys() != 0 || a.Changed()+b.Changed() != 0 {
			t.Errorf("replicas disagreed: unknown %d+%d, changed %d+%d", a.UnknownKeys(), b.UnknownKeys(), a.Changed(), b.Changed())
		}
		cancel()
	})
}

func keyOf(s string) string { k, _, _ := strings.Cut(s, "."); return k }

func sealExpiry(t *testing.T, s string) time.Time {
	_, _, _, _, exp, _, _, ok := parts(s)
	if !ok {
		t.Fatal("not a seal")
	}
	return time.UnixMilli(exp)
}

// Against a real Redis: replicas converge on one key per period; after a
// FLUSHALL the keys are created again and each replica adopts them at
// its next refresh (counted as replaced; the seals it made before still
// verify on it); a replica started while Redis was down seals with its
// own key, and adopts the shared one once Redis is back.
func TestKeyringSharedThroughRedis(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	store := RedisStore{Client: rdb}
	opts := Options{Rotation: time.Hour, Refresh: time.Minute, MaxAge: 2 * time.Hour}
	a, b := loaded(t, store, opts), loaded(t, store, opts)
	agree := func(from, to *Keyring) error {
		_, err := to.Open(Reservation, from.Seal(Reservation, "r", time.Now().Add(time.Hour)))
		return err
	}
	if err := agree(a, b); err != nil {
		t.Fatalf("two replicas: %v", err)
	}
	before := a.Seal(Reservation, "r", time.Now().Add(time.Hour))

	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Changed() == 0 {
		t.Error("a replica did not notice the keys were replaced")
	}
	if err := agree(a, b); !errors.Is(err, ErrUnknownKey) || b.UnknownKeys() == 0 {
		t.Errorf("before b re-reads: %v, %d unknown keys counted", err, b.UnknownKeys())
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := agree(a, b); err != nil {
		t.Errorf("after the re-read: %v", err)
	}
	if _, err := a.Open(Reservation, before); err != nil {
		t.Errorf("a seal made before the flush: %v", err)
	}

	// A replica that starts while Redis is down.
	srv.Stop()
	c := NewKeyring(store, opts)
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("refreshed with Redis down")
	}
	alone := c.Seal(Reservation, "r", time.Now().Add(time.Hour))
	if _, err := a.Open(Reservation, alone); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("a seal of a replica's own key: %v", err)
	}
	srv.Restart() // empty again: a re-reads too, as its next refresh would
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := agree(c, a); err != nil {
		t.Errorf("once Redis is back: %v", err)
	}
	if _, err := c.Open(Reservation, alone); err != nil {
		t.Errorf("its own seal from while Redis was down: %v", err)
	}
	if c.Failed() != 1 {
		t.Errorf("%d failed refreshes counted, want 1", c.Failed())
	}
}

// Settle once through Redis: a key per seal outstanding, with the seal's
// time left as its TTL, and the tenant's set of them; the one claim that
// counts leaves a short-lived mark of its claimant; Redis holds the seals
// in flight and the last minute's claims only.
func TestRedisOnce(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	o := RedisOnce{Client: rdb, Now: time.Now}
	exp := time.Now().Add(time.Minute)
	if ok, err := o.Claim(ctx, Reservation, "acme", "never-issued", "c", exp); ok || err != nil {
		t.Errorf("a seal never issued: %v %v", ok, err)
	}
	if err := o.Issue(ctx, Reservation, "acme", "id", exp); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{onceKey(Reservation, "acme", "id"), outstandingKey("acme")} {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > time.Minute {
			t.Errorf("%s: TTL %v", k, ttl)
		}
	}
	if n, _ := o.Outstanding(ctx, "acme"); n != 1 {
		t.Errorf("%d outstanding, want 1", n)
	}
	if ok, err := o.Claim(ctx, Field, "acme", "id", "c", exp); ok || err != nil {
		t.Errorf("the same id for another purpose: %v %v", ok, err)
	}
	if ok, err := o.Claim(ctx, Reservation, "globex", "id", "c", exp); ok || err != nil {
		t.Errorf("the same id for another tenant: %v %v", ok, err)
	}
	if ok, err := o.Claim(ctx, Reservation, "acme", "id", "c", exp); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := o.Claim(ctx, Reservation, "acme", "id", "d", exp); ok || err != nil {
		t.Errorf("a replay: %v %v", ok, err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 1 {
		t.Errorf("%d keys left once every seal was claimed, want 1 (the claim's mark)", n)
	}
	if err := o.Issue(ctx, Reservation, "acme", "late", time.Now().Add(-time.Second)); !errors.Is(err, ErrExpired) {
		t.Errorf("issuing an expired seal: %v", err)
	}
}

// What a seal costs the gate and the meter: one per reservation, one per
// field (a field of about 300 bytes).
func BenchmarkSealOpen(b *testing.B) {
	r := NewKeyring(&MemoryStore{}, Options{})
	if err := r.Refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("x", 300)
	exp := time.Now().Add(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Open(Field, r.Seal(Field, body, exp)); err != nil {
			b.Fatal(err)
		}
	}
}
