package spend

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
)

// stores are the Stores whose buckets must keep the shares: each function
// returns an empty store with shares s (Redis: a real server, a prefix per
// store).
func stores(t *testing.T) map[string]func(s Shares) Store {
	rdb := newRedis(t)
	n := 0
	return map[string]func(Shares) Store{
		"memory": func(s Shares) Store { return &Memory{Shares: s} },
		"redis": func(s Shares) Store {
			n++
			return &Redis{Client: rdb, Prefix: fmt.Sprintf("shares%d:", n), Shares: s}
		},
		"embedded": func(s Shares) Store {
			return &Embedded{DB: openLedger(t, filepath.Join(t.TempDir(), "ledger.db")), Shares: s}
		},
	}
}

// rowsOf is bucket b's rows of tenant.
func rowsOf(b Bucket, tenant string) Bucket {
	out := Bucket{}
	for k, a := range b {
		if k.Tenant == tenant {
			out[k] = a
		}
	}
	return out
}

// One tenant flooding an hour's bucket with fresh model names, over
// several keys, folds only its own rows: another tenant's rows read back
// exactly as in a bucket where the flood never happened; the flooding
// key keeps PerKey models and a fold row, its tenant PerTenant rows and a
// fold row, and nothing is lost. Only many tenants filling their shares
// at once reach the bucket's Total, past which new rows go to OtherKey.
func TestSharesBoundEachTenant(t *testing.T) {
	ctx := context.Background()
	shares := Shares{PerKey: 3, PerTenant: 5, Total: 12}
	one := Amount{Requests: 1, InputTokens: 10, Cost: 7}
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			victim := func(s Store) {
				for _, m := range []string{"gpt", "llama", "gpt"} {
					if err := s.Add(ctx, 100, Key{Tenant: "b", Team: "search", KeyID: "kb", Model: m}, one); err != nil {
						t.Fatal(err)
					}
				}
			}
			quiet := newStore(shares)
			victim(quiet)
			before, _ := quiet.Hours(ctx, 100, 100)

			s := newStore(shares)
			for i := range 40 {
				k := Key{Tenant: "a", KeyID: []string{"k1", "k2"}[i/20], Model: fmt.Sprint("fresh-", i)}
				if err := s.Add(ctx, 100, k, one); err != nil {
					t.Fatal(err)
				}
			}
			victim(s)
			got, _ := s.Hours(ctx, 100, 100)
			if b := rowsOf(got[100], "b"); !reflect.DeepEqual(b, before[100]) {
				t.Errorf("tenant b's rows %v, want %v as without the flood", b, before[100])
			}
			flood := rowsOf(got[100], "a")
			want := Bucket{
				{Tenant: "a", KeyID: "k1", Model: "fresh-0"}:           one,
				{Tenant: "a", KeyID: "k1", Model: "fresh-1"}:           one,
				{Tenant: "a", KeyID: "k1", Model: "fresh-2"}:           one,
				{Tenant: "a", KeyID: "k1", Model: Other}:               one.times(17), // k1's models past PerKey
				{Tenant: "a", KeyID: "k2", Model: "fresh-20"}:          one,           // the tenant's fifth row
				{Tenant: "a", Team: Other, KeyID: Other, Model: Other}: one.times(19),
			}
			if !reflect.DeepEqual(flood, want) {
				t.Errorf("tenant a's rows %v, want %v", flood, want)
			}

			// Tenants filling their shares at once reach the bucket's
			// Total: past it, new rows go to OtherKey, and never more
			// than Total+1 rows are kept.
			for i := range 30 {
				k := Key{Tenant: fmt.Sprint("t", i%6), KeyID: fmt.Sprint("k", i), Model: "m"}
				if err := s.Add(ctx, 100, k, one); err != nil {
					t.Fatal(err)
				}
			}
			got, _ = s.Hours(ctx, 100, 100)
			var requests int64
			for _, a := range got[100] {
				requests += a.Requests
			}
			if len(got[100]) != shares.Total+1 || got[100][OtherKey].Requests == 0 || requests != 40+3+30 {
				t.Errorf("%d rows (OtherKey %v), %d requests; want %d rows, some in OtherKey, 73 requests",
					len(got[100]), got[100][OtherKey], requests, shares.Total+1)
			}
		})
	}
}

func (a Amount) times(n int64) Amount {
	var out Amount
	for range n {
		out = out.Add(a)
	}
	return out
}

// Every Store places keys as the pure rule does: the same seeded random
// sequence of adds (few tenants, keys and models, so that every share
// fills) gives the same bucket in memory, in Redis, and in a plain Bucket
// placed with Bucket.Slot; the bounds hold after every add.
func TestStoresPlaceAsSharesSlot(t *testing.T) {
	ctx := context.Background()
	shares := Shares{PerKey: 2, PerTenant: 4, Total: 10}
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(32, 6))
			s, ref := newStore(shares), Bucket{}
			for i := range 400 {
				k := Key{Tenant: fmt.Sprint("t", r.IntN(5)), Team: fmt.Sprint("team", r.IntN(2)), KeyID: fmt.Sprint("k", r.IntN(3)), Model: fmt.Sprint("m", r.IntN(6))}
				a := Amount{Requests: 1, Cost: r.Int64N(100)}
				if err := s.Add(ctx, 7, k, a); err != nil {
					t.Fatal(err)
				}
				slot := ref.Slot(k, shares)
				ref[slot] = ref[slot].Add(a)
				if i%50 == 49 {
					got, _ := s.Hours(ctx, 7, 7)
					if !reflect.DeepEqual(got[7], ref) {
						t.Fatalf("after %d adds: bucket %v, want %v", i+1, got[7], ref)
					}
				}
			}
			checkShares(t, ref, shares)
		})
	}
}

// checkShares fails unless b keeps the bounds Shares promises.
func checkShares(t *testing.T, b Bucket, s Shares) {
	t.Helper()
	tenants, keys := map[string]int{}, map[Key]int{}
	for k := range b {
		if k != OtherKey {
			tenants[k.Tenant]++
			keys[Key{Tenant: k.Tenant, Team: k.Team, KeyID: k.KeyID}]++
		}
	}
	if len(b) > s.Total+1 {
		t.Errorf("%d rows, want at most %d", len(b), s.Total+1)
	}
	for tn, n := range tenants {
		if n > s.PerTenant+1 {
			t.Errorf("tenant %s has %d rows, want at most %d", tn, n, s.PerTenant+1)
		}
	}
	for k, n := range keys {
		if n > s.PerKey+1 && k.KeyID != Other {
			t.Errorf("key %+v has %d rows, want at most %d", k, n, s.PerKey+1)
		}
	}
}

// Parts saturate at math.MaxInt64 in every Store instead of wrapping (or,
// in Redis, failing the add and losing it); negative parts count as 0.
func TestStoresSaturate(t *testing.T) {
	ctx := context.Background()
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newStore(Shares{})
			k := Key{Tenant: "acme", Model: "m"}
			for _, a := range []Amount{
				{Requests: 1, Cost: math.MaxInt64 - 5, OutputTokens: 1 << 53},
				{Requests: 1, Cost: 6, OutputTokens: 1<<53 + 1},
				{Requests: 1, Cost: math.MaxInt64, InputTokens: -4},
			} {
				if err := s.Add(ctx, 9, k, a); err != nil {
					t.Fatal(err)
				}
			}
			got, _ := s.Hours(ctx, 9, 9)
			want := Amount{Requests: 3, Cost: math.MaxInt64, OutputTokens: 1<<54 + 1}
			if got[9][k] != want {
				t.Errorf("row %+v, want %+v", got[9][k], want)
			}
		})
	}
}

// A Tally places keys and counts rows as a Bucket scanned each time does.
func TestTallyCountsAsBucket(t *testing.T) {
	shares := Shares{PerKey: 2, PerTenant: 3, Total: 8}
	r := rand.New(rand.NewPCG(32, 7))
	var tally Tally
	ref := Bucket{}
	for range 500 {
		k := Key{Tenant: fmt.Sprint("t", r.IntN(4)), KeyID: fmt.Sprint("k", r.IntN(3)), Model: fmt.Sprint("m", r.IntN(5))}
		a := Amount{Requests: 1}
		slot := tally.Add(k, a, shares)
		if want := ref.Slot(k, shares); slot != want {
			t.Fatalf("Tally placed %+v at %+v, Bucket at %+v", k, slot, want)
		}
		ref[slot] = ref[slot].Add(a)
		for k := range maps.Keys(ref) {
			if a1, a2, a3 := tally.Count(k); true {
				b1, b2, b3 := ref.Count(k)
				if a1 != b1 || a2 != b2 || a3 != b3 {
					t.Fatalf("Count(%+v): tally %d %d %d, bucket %d %d %d", k, a1, a2, a3, b1, b2, b3)
				}
			}
		}
	}
	if !reflect.DeepEqual(tally.Bucket(), ref) {
		t.Errorf("tally %v, want %v", tally.Bucket(), ref)
	}
	checkShares(t, ref, shares)
}
