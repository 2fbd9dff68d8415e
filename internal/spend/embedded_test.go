package spend

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/ledgerfile"
)

// The embedded store reads back whole what was added, after a restart
// too; caps an hour's keys as Memory does under concurrent adds; drops
// hours past Retention; saturates.
func TestEmbeddedStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	e := &Embedded{DB: db, Shares: Shares{Total: 4}}
	k := Key{Tenant: "acme", Team: "search", KeyID: "k1", Model: "m1"}
	one := Amount{Requests: 1, InputTokens: 10, CachedTokens: 4, OutputTokens: 20, Cost: 123}
	for _, add := range []struct {
		hour int64
		k    Key
	}{{500, k}, {500, k}, {502, Key{Tenant: "x\x1fy", Model: "m2"}}} {
		if err := e.Add(ctx, add.hour, add.k, one); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := e.Add(ctx, 600, Key{Tenant: "t", Model: string(rune('a' + i))}, Amount{Requests: 1}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := e.Add(ctx, 601, k, Amount{Cost: math.MaxInt64 - 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(ctx, 601, k, Amount{Cost: 5}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	e = &Embedded{DB: openLedger(t, path), Shares: Shares{Total: 4}}
	got, err := e.Hours(ctx, 499, 503)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]Bucket{500: {k: one.Add(one)}, 502: {{Tenant: "x?y", Model: "m2"}: one}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hours after a restart %v, want %v", got, want)
	}
	got, _ = e.Hours(ctx, 600, 601)
	var total int64
	for _, am := range got[600] {
		total += am.Requests
	}
	if len(got[600]) != 5 || got[600][OtherKey].Requests != 16 || total != 20 {
		t.Errorf("capped bucket %v: want 4 keys and (other) with 16 of 20 requests", got[600])
	}
	if c := got[601][k].Cost; c != math.MaxInt64 {
		t.Errorf("cost past int64 = %d, want it saturated", c)
	}

	hours := int64(Retention / time.Hour)
	if err := e.Add(ctx, 500+hours, Key{Tenant: "new"}, Amount{Requests: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(ctx, 499, Key{Tenant: "late"}, Amount{Requests: 1}); err != nil { // past retention already
		t.Fatal(err)
	}
	got, _ = e.Hours(ctx, 0, 1<<40)
	if len(got) != 4 || got[500] != nil || got[499] != nil || got[500+hours] == nil {
		t.Errorf("hours %v: want 502, 600, 601 and %d only", keysOf(got), 500+hours)
	}
}

func keysOf(m map[int64]Bucket) []int64 {
	var out []int64
	for h := range m {
		out = append(out, h)
	}
	return out
}

func openLedger(t *testing.T, path string) *ledgerfile.DB {
	t.Helper()
	db, err := ledgerfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
