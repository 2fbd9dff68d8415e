package ratelimit

import (
	"context"
	"math"
	"testing"
	"time"
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
