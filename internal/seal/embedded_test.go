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
	o, err := NewEmbeddedOnce(db, "", 2, clock)
	if err != nil {
		t.Fatal(err)
	}
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

	// A restart: the outstanding seals are still there, once.
	db.Close()
	o, err = NewEmbeddedOnce(openLedger(t, path), "", 2, clock)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(4 * time.Minute) // c has expired: its room is free
	if err := issue("e", time.Hour); err != nil {
		t.Errorf("after a seal expired: %v", err)
	}
	if ok, _ := o.Claim(ctx, Reservation, "b", now.Add(-4*time.Minute+time.Hour)); !ok {
		t.Error("a seal issued before the restart no longer claims")
	}
	if ok, _ := o.Claim(ctx, Reservation, "b", now.Add(-4*time.Minute+time.Hour)); ok {
		t.Error("a seal claimed twice")
	}
	if n := o.Len(); n != 1 {
		t.Errorf("%d outstanding, want 1", n)
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
