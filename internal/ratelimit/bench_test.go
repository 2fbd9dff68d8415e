package ratelimit

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// benchLimits are the usual pair: requests and total tokens per tenant,
// with amounts no benchmark reaches.
var benchLimits = []Limit{
	{Name: "tenant-requests", Key: "tenant=acme", Unit: Requests, Amount: math.MaxInt64 / 4, Window: time.Minute},
	{Name: "tenant-tokens", Key: "tenant=acme", Unit: TotalTokens, Amount: math.MaxInt64 / 4, Window: time.Minute},
}

var benchCost = Cost{Requests: 1, InputTokens: 120, OutputTokens: 512}

func benchReserve(b *testing.B, l Limiter) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, err := l.Reserve(ctx, benchLimits, benchCost)
		if err != nil || !res.Allowed {
			b.Fatalf("Reserve = %+v, %v", res, err)
		}
	}
}

func BenchmarkMemoryReserve(b *testing.B) {
	benchReserve(b, NewMemory(time.Now))
}

func BenchmarkMemoryReserveParallel(b *testing.B) {
	l := NewMemory(time.Now)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Reserve(ctx, benchLimits, benchCost); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkMemorySettle(b *testing.B) {
	l := NewMemory(time.Now)
	ctx := context.Background()
	res, err := l.Reserve(ctx, benchLimits, benchCost)
	if err != nil {
		b.Fatal(err)
	}
	actual := Cost{Requests: 1, InputTokens: 120, OutputTokens: 300}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Settle(ctx, res.Reservation, actual); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRedisReserve(b *testing.B) {
	srv := startRedis(b)
	benchReserve(b, NewRedis(newRedisClient(b, srv.Addr(), false), time.Now, RedisOptions{}))
}

func BenchmarkRedisReserveParallel(b *testing.B) {
	srv := startRedis(b)
	l := NewRedis(newRedisClient(b, srv.Addr(), false), time.Now, RedisOptions{})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Reserve(ctx, benchLimits, benchCost); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkRedisSettle(b *testing.B) {
	srv := startRedis(b)
	l := NewRedis(newRedisClient(b, srv.Addr(), false), time.Now, RedisOptions{})
	ctx := context.Background()
	res, err := l.Reserve(ctx, benchLimits, benchCost)
	if err != nil {
		b.Fatal(err)
	}
	actual := Cost{Requests: 1, InputTokens: 120, OutputTokens: 300}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Settle(ctx, res.Reservation, actual); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReserveSettle is the gate's and the meter's work per request,
// reserve then settle, from 64 goroutines per core (requests in flight
// on a gate), over tenants of their own.
func benchReserveSettle(b *testing.B, l Limiter) {
	ctx := context.Background()
	actual := Cost{Requests: 1, InputTokens: 120, OutputTokens: 300}
	b.ReportAllocs()
	b.SetParallelism(64)
	var tenant atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		limits := slices.Clone(benchLimits)
		key := fmt.Sprintf("tenant=%d", tenant.Add(1)%16)
		for i := range limits {
			limits[i].Key = key
		}
		for pb.Next() {
			res, err := l.Reserve(ctx, limits, benchCost)
			if err != nil || !res.Allowed {
				b.Errorf("Reserve = %+v, %v", res, err)
				return
			}
			if err := l.Settle(ctx, res.Reservation, actual); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkReserveSettle(b *testing.B) {
	b.Run("memory", func(b *testing.B) { benchReserveSettle(b, NewMemory(time.Now)) })
	b.Run("embedded", func(b *testing.B) {
		db := openLedger(b, filepath.Join(b.TempDir(), "ledger.db"))
		benchReserveSettle(b, newEmbedded(b, db, time.Now))
	})
	b.Run("embedded-bbolt-batch", func(b *testing.B) {
		// bbolt's own Batch (which waits up to 10 ms for company), for
		// comparison with ledgerfile's.
		db, err := bolt.Open(filepath.Join(b.TempDir(), "ledger.db"), 0o600, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		benchReserveSettle(b, newEmbedded(b, db, time.Now))
	})
}
