package spend

import (
	"context"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
)

func newRedis(t testing.TB) *redis.Client {
	t.Helper()
	srv := redisserver.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Against a real Redis: what two replicas add reads back whole, a bucket
// lives Retention, and concurrent adds never take a bucket past
// Shares.Total+1 keys.
func TestRedisStore(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	a := &Redis{Client: rdb, Shares: Shares{Total: 4}}
	b := &Redis{Client: rdb, Shares: Shares{Total: 4}} // another replica
	k := Key{Tenant: "acme", Team: "search", KeyID: "k1", Model: "m1"}
	one := Amount{Requests: 1, InputTokens: 10, CachedTokens: 4, OutputTokens: 20, Cost: 123}
	if err := a.Add(ctx, 500, k, one); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(ctx, 500, k, one); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(ctx, 502, Key{Tenant: "x\x1fy", Model: "m2"}, one); err != nil {
		t.Fatal(err)
	}
	got, err := a.Hours(ctx, 499, 503)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]Bucket{500: {k: one.Add(one)}, 502: {{Tenant: "x?y", Model: "m2"}: one}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hours %v, want %v", got, want)
	}
	ttl, err := rdb.TTL(ctx, DefaultRedisPrefix+"500").Result()
	if err != nil || ttl <= Retention-time.Minute || ttl > Retention {
		t.Errorf("TTL %v, %v: want %v", ttl, err, Retention)
	}

	// Concurrent adds of 20 keys into a bucket capped at 4.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			s := []*Redis{a, b}[i%2]
			if err := s.Add(ctx, 600, Key{Tenant: "t", Model: string(rune('a' + i))}, Amount{Requests: 1}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, _ = a.Hours(ctx, 600, 600)
	var total int64
	for _, am := range got[600] {
		total += am.Requests
	}
	if len(got[600]) != 5 || got[600][OtherKey].Requests != 16 || total != 20 {
		t.Errorf("capped bucket %v: want 4 keys and (other) with 16 of 20 requests", got[600])
	}
}

// On a Redis Cluster the hours spread over slots: each Add touches one key,
// and a report's read is one pipeline across the nodes.
func TestRedisClusterStore(t *testing.T) {
	ctx := context.Background()
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{NoReplicas: true})
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	st := &Redis{Client: rdb}
	want := map[int64]Bucket{}
	for h := int64(1000); h < 1048; h++ { // 48 keys: every node holds some
		k := Key{Tenant: "acme", Model: "m" + strconv.FormatInt(h%3, 10)}
		a := Amount{Requests: h, Cost: 2 * h}
		if err := st.Add(ctx, h, k, a); err != nil {
			t.Fatal(err)
		}
		want[h] = Bucket{k: a}
	}
	got, err := st.Hours(ctx, 990, 1050)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("hours %v, %v: want %v", got, err, want)
	}
}
