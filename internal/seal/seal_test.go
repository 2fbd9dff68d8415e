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
	issue := func(id string, exp time.Duration) error { return o.Issue(ctx, Reservation, id, now.Add(exp)) }
	claim := func(id string, exp time.Duration) (bool, error) { return o.Claim(ctx, Reservation, id, now.Add(exp)) }
	if err := issue("a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Claim(ctx, Field, "a", now.Add(time.Minute)); ok || err != nil {
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
	if ok, _ := o.Claim(ctx, Reservation, "b", now.Add(-4*time.Minute+time.Hour)); !ok {
		t.Error("an outstanding seal no longer claims")
	}
	if o.n != 1 {
		t.Errorf("%d outstanding, want 1", o.n)
	}
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
// time left as its TTL, deleted by the one claim that counts; Redis holds
// the seals in flight only.
func TestRedisOnce(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	o := RedisOnce{Client: rdb, Now: time.Now}
	exp := time.Now().Add(time.Minute)
	if ok, err := o.Claim(ctx, Reservation, "never-issued", exp); ok || err != nil {
		t.Errorf("a seal never issued: %v %v", ok, err)
	}
	if err := o.Issue(ctx, Reservation, "id", exp); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, "ig:sealed:reservation:id").Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("TTL %v", ttl)
	}
	if ok, err := o.Claim(ctx, Field, "id", exp); ok || err != nil {
		t.Errorf("the same id for another purpose: %v %v", ok, err)
	}
	if ok, err := o.Claim(ctx, Reservation, "id", exp); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := o.Claim(ctx, Reservation, "id", exp); ok || err != nil {
		t.Errorf("a replay: %v %v", ok, err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Errorf("%d keys left once every seal was claimed, want 0", n)
	}
	if err := o.Issue(ctx, Reservation, "late", time.Now().Add(-time.Second)); !errors.Is(err, ErrExpired) {
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
