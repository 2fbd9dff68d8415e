package seal

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/ledgerfile"
)

func openLedger(t *testing.T, path string) *ledgerfile.DB {
	t.Helper()
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestEmbeddedOnce has MemoryOnce's behaviour, and keeps it across a
// restart: a seal issued before is claimed once after.
func TestEmbeddedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewEmbeddedOnce(db, "", 2, 2, clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	issue := func(id string, exp time.Duration) error { return o.Issue(ctx, Reservation, "acme", id, now.Add(exp)) }
	claim := func(id string, exp time.Duration) (bool, error) {
		return o.Claim(ctx, Reservation, "acme", id, "c1", now.Add(exp))
	}
	if err := issue("a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Claim(ctx, Field, "acme", "a", "c1", now.Add(time.Minute)); ok || err != nil {
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
	if err := issue("d", time.Hour); !errors.Is(err, ErrTenantFull) {
		t.Errorf("full: %v", err)
	}
	if ok, _ := claim("d", time.Hour); ok {
		t.Error("a seal issued while full settles")
	}
	if ok, err := claim("c", -time.Second); ok || !errors.Is(err, ErrExpired) {
		t.Errorf("expired: %v %v", ok, err)
	}

	// A restart: the outstanding seals are still there, once.
	db.Close()
	o, err = NewEmbeddedOnce(openLedger(t, path), "", 2, 2, clock)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(4 * time.Minute) // c has expired: its room is free
	if err := issue("e", time.Hour); err != nil {
		t.Errorf("after a seal expired: %v", err)
	}
	if ok, _ := o.Claim(ctx, Reservation, "acme", "b", "c1", now.Add(-4*time.Minute+time.Hour)); !ok {
		t.Error("a seal issued before the restart no longer claims")
	}
	if ok, _ := o.Claim(ctx, Reservation, "acme", "b", "c1", now.Add(-4*time.Minute+time.Hour)); ok {
		t.Error("a seal claimed twice")
	}
	if n := o.Len(); n != 1 {
		t.Errorf("%d outstanding, want 1", n)
	}
}

// Each tenant holds at most its share of the file's seals, across a
// restart; a full share refuses that tenant only, and the whole table's
// bound is the last resort.
func TestEmbeddedOnceTenantShares(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	ctx := context.Background()
	o, err := NewEmbeddedOnce(openLedger(t, path), "", 3, 2, clock)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(tenant, id string) error { return o.Issue(ctx, Reservation, tenant, id, now.Add(time.Hour)) }
	if err := errors.Join(issue("greedy", "g1"), issue("greedy", "g2")); err != nil {
		t.Fatal(err)
	}
	if err := issue("greedy", "g3"); !errors.Is(err, ErrTenantFull) {
		t.Errorf("greedy's third seal: %v, want ErrTenantFull", err)
	}
	if err := issue("", "m1"); err != nil {
		t.Errorf("another tenant (the anonymous one, \"\") is refused: %v", err)
	}
	if err := issue("third", "t1"); !errors.Is(err, ErrFull) {
		t.Errorf("past the whole table: %v, want ErrFull", err)
	}
	if got := o.Outstanding("greedy"); got != 2 {
		t.Errorf("greedy holds %d, want 2", got)
	}
	if ok, err := o.Claim(ctx, Reservation, "greedy", "g1", "c", now.Add(time.Hour)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := issue("greedy", "g3"); err != nil {
		t.Errorf("a claimed seal's room is not given back: %v", err)
	}
	now = now.Add(2 * time.Hour) // every seal expired: dropped by the next write
	if err := issue("greedy", "g4"); err != nil {
		t.Errorf("after expiry: %v", err)
	}
	if got := o.Outstanding("greedy"); got != 1 {
		t.Errorf("greedy holds %d after its seals expired and one more, want 1", got)
	}
}

// TestEmbeddedStore: a period's key is the first one stored, also after a
// restart, and is dropped once its time is up.
func TestEmbeddedStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	now := time.Unix(1_700_000_000, 0)
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s := EmbeddedStore{DB: db, Now: func() time.Time { return now }}
	ctx := context.Background()
	first := Key{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}
	got, err := s.Key(ctx, 7, first, time.Hour)
	if err != nil || got.ID != "k1" {
		t.Fatalf("Key = %+v, %v", got, err)
	}
	db.Close()
	s.DB = openLedger(t, path)
	got, err = s.Key(ctx, 7, Key{ID: "k2", Secret: []byte("other")}, time.Hour)
	if err != nil || got.ID != "k1" || !bytes.Equal(got.Secret, first.Secret) {
		t.Fatalf("after a restart: Key = %+v, %v; want the first one", got, err)
	}
	now = now.Add(2 * time.Hour)
	if got, _ := s.Key(ctx, 7, Key{ID: "k3", Secret: []byte("x")}, time.Hour); got.ID != "k3" {
		t.Errorf("an expired key was kept: %+v", got)
	}
}
