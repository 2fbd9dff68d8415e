package ratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// The slot proof against the real thing: Redis computes the same slot as
// keySlot for every key the limiter's scripts use (and for each limit
// key's own tag, as the standalone layout has it); the shipped policy's
// limits in the standalone layout are refused with CROSSSLOT, while the
// limiter charges them on the cluster, all on the primary of its tag.
func TestRedisClusterSlotsMatchRedis(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{NoReplicas: true})
	ctx := context.Background()

	keys := map[string]bool{}
	for _, cluster := range []bool{true, false} {
		clock := newFakeClock(t0)
		l, rec := recordingLimiter(t, cluster, clock.Now, RedisOptions{})
		for _, limits := range limitSets() {
			exercise(t, l, clock, limits)
			for _, call := range rec.take() {
				for _, k := range call.keys {
					keys[k] = true
				}
			}
		}
	}
	node := redis.NewClient(&redis.Options{Addr: c.Addrs()[0]})
	defer node.Close()
	pipe := node.Pipeline()
	cmds := map[string]*redis.IntCmd{}
	for k := range keys {
		cmds[k] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for k, cmd := range cmds {
		if got := int(cmd.Val()); got != keySlot(k) {
			t.Errorf("CLUSTER KEYSLOT %q = %d, keySlot = %d", k, got, keySlot(k))
		}
	}
	t.Logf("%d distinct keys: CLUSTER KEYSLOT agrees with keySlot on every one", len(cmds))

	rdb := c.NewClient(t)
	limits := shippedLimits("acme", "acme-prod", "llama-3.1-8b-instruct")
	ids, ends := make([]string, len(limits)), make([]int64, len(limits))
	counterIDs(DefaultCounterPrefix, "", limits, t0.UnixMilli(), ids, ends)
	args := make([]any, 0, 3*len(limits))
	for range limits {
		args = append(args, 1, 100, 60000)
	}
	if err := reserveScript.Run(ctx, rdb, ids, args...).Err(); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Errorf("the reserve script over %q = %v, want CROSSSLOT", ids, err)
	}

	l := NewRedis(rdb, newFakeClock(t0).Now, RedisOptions{})
	res, err := l.Reserve(ctx, limits, req(10, 20))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve on the cluster = %+v, %v", res, err)
	}
	primary := redis.NewClient(&redis.Options{Addr: c.PrimaryFor("{" + DefaultClusterHashTag + "}").Addr()})
	defer primary.Close()
	for _, e := range res.Reservation.Entries {
		if v, err := primary.Get(ctx, e.Counter).Int64(); err != nil || v != e.Reserved {
			t.Errorf("GET %s on the tag's primary = %d, %v; want %d", e.Counter, v, err, e.Reserved)
		}
	}
}
