package spend

import (
	"context"
	"testing"
	"time"
)

// What a settlement costs the settle path: one Charged, in memory and in
// a real Redis (one script call).
func BenchmarkCharged(b *testing.B) {
	s, cost := settled("m1", 1000, 200)
	for name, store := range map[string]func(b *testing.B) Store{
		"memory": func(*testing.B) Store { return &Memory{} },
		"redis":  func(b *testing.B) Store { return &Redis{Client: newRedis(b)} },
	} {
		b.Run(name, func(b *testing.B) {
			now := monthStart
			l := &Ledger{Store: store(b), Prices: prices, Now: func() time.Time { return now }}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l.Charged(ctx, "acme", s, cost, true)
			}
		})
	}
}
