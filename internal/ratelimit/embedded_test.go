package ratelimit

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/infergate/infergate/internal/ledgerfile"
)

// openLedger opens a ledger file closed at the test's end.
func openLedger(t testing.TB, path string) *ledgerfile.DB {
	t.Helper()
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func newEmbedded(t testing.TB, db ledgerfile.Store, clock Clock) *Embedded {
	t.Helper()
	e, err := NewEmbedded(db, clock, EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestEmbeddedSurvivesReopen: what a closed (or killed) limiter admitted
// is charged when the file is opened again.
func TestEmbeddedSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := newFakeClock(t0.Add(5 * time.Second))
	limits := []Limit{tpm("tpm", "tenant=a", 1000)}
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := newEmbedded(t, db, clock.Now).Reserve(context.Background(), limits, req(100, 300))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	if _, err := ledgerfile.Open(path); err == nil {
		t.Fatal("a second Open of a file held open succeeded; want it refused (one process per file)")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := ledgerfile.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int64
	_ = ro.View(func(tx *bolt.Tx) error { got = Counters(tx, ""); return nil })
	ro.Close()
	if got[res.Reservation.Entries[0].Counter] != 400 {
		t.Errorf("counters read back = %v, want %s at 400", got, res.Reservation.Entries[0].Counter)
	}
	e := newEmbedded(t, openLedger(t, path), clock.Now)
	if err := e.Settle(context.Background(), res.Reservation, req(100, 50)); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, e, limits); got[0] != 850 {
		t.Errorf("remaining after the restart's settlement = %d, want 850", got[0])
	}
}

// TestEmbeddedDropsEndedCounters: the file keeps the counters of the
// windows in force, not every window it saw.
func TestEmbeddedDropsEndedCounters(t *testing.T) {
	clock := newFakeClock(t0)
	e := newEmbedded(t, openLedger(t, filepath.Join(t.TempDir(), "ledger.db")), clock.Now)
	for i := range 500 {
		clock.SetOffset(time.Duration(i) * time.Minute)
		limits := []Limit{rpm("rpm", "tenant=a", 10), tpm("tpm", "tenant=a", 1000)}
		if res, err := e.Reserve(context.Background(), limits, req(1, 1)); err != nil || !res.Allowed {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		if n := e.Len(); n > 2+2*sweepPerWrite {
			t.Fatalf("minute %d: %d counters held; want the current window's 2 (and a sweep's worth of ended ones)", i, n)
		}
	}
	if n := e.Len(); n != 2 {
		t.Errorf("%d counters held after 500 minutes, want 2", n)
	}
}

// TestEmbeddedSaturates: a counter charged beyond int64 holds at its
// maximum instead of wrapping into a refund.
func TestEmbeddedSaturates(t *testing.T) {
	clock := newFakeClock(t0)
	e := newEmbedded(t, openLedger(t, filepath.Join(t.TempDir(), "ledger.db")), clock.Now)
	limits := []Limit{{Name: "money", Key: "tenant=a", Unit: Money, Amount: math.MaxInt64, Window: time.Hour}}
	half := Cost{Requests: 1, Money: math.MaxInt64 / 2}
	res, err := e.Reserve(context.Background(), limits, half)
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	if res, err := e.Reserve(context.Background(), limits, half); err != nil || !res.Allowed {
		t.Fatalf("second Reserve = %+v, %v", res, err)
	}
	if res, err := e.Reserve(context.Background(), limits, Cost{Requests: 1, Money: 2}); err != nil || res.Allowed {
		t.Fatalf("Reserve past int64 = %+v, %v; want denied", res, err)
	}
	// Settling the first at int64's maximum adds more than the counter
	// has room for.
	if err := e.Settle(context.Background(), res.Reservation, Cost{Requests: 1, Money: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	var got map[string]int64
	_ = e.db.View(func(tx *bolt.Tx) error { got = Counters(tx, ""); return nil })
	if v := got[res.Reservation.Entries[0].Counter]; v != math.MaxInt64 {
		t.Errorf("counter after settling past int64 = %d, want %d (saturated)", v, int64(math.MaxInt64))
	}
	if r, err := e.Reserve(context.Background(), limits, Cost{Requests: 1}); err != nil || r.States[0].Remaining != 0 {
		t.Errorf("Reserve after saturation = %+v, %v; want 0 remaining", r, err)
	}
}
