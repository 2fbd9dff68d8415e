package compose

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/seal"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

func TestRedisClientModes(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := RedisClient(config.Redis{Mode: "standalone", Address: "redis:6379", DB: 3, PasswordFile: pw, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s, ok := c.(*redis.Client); !ok || s.Options().Addr != "redis:6379" || s.Options().DB != 3 || s.Options().Password != "secret" {
		t.Errorf("standalone: %T %+v", c, c)
	}
	c, err = RedisClient(config.Redis{Mode: "cluster", Addresses: []string{"a:1", "b:2"}, PasswordFile: pw, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("cluster: %T", c)
	}
	if o := cc.Options(); len(o.Addrs) != 2 || o.Password != "secret" || o.ReadTimeout != time.Second || o.DialerRetries != 1 {
		t.Errorf("cluster options %+v", o)
	}
	if _, err := RedisClient(config.Redis{Mode: "cluster", PasswordFile: filepath.Join(t.TempDir(), "nope")}); err == nil {
		t.Error("a missing password file is not an error")
	}
}

// On a Redis Cluster the replicas share one reservation key, and the
// client follows a primary's crash as soon as its replica has taken over
// (go-redis alone would keep sending to the dead address until its next
// periodic reload): the reservation key and the rate-limit counters are
// served again. The periodic reload is an hour away here, so being served
// again within the test's time means the failover was followed.
func TestRedisClusterFollowsFailover(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{})
	cfg := config.Redis{Mode: "cluster", Addresses: c.Addrs(), Timeout: 250 * time.Millisecond}
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	var rings []*seal.Keyring
	var clients []redis.UniversalClient
	for range 2 {
		rdb, err := redisClientWith(cfg, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		clients = append(clients, rdb)
		ring, _, _ := newSeals(ctx, defaultConfig(t), rdb, nil, log, time.Now)
		rings = append(rings, ring)
	}
	agree := func(from, to *seal.Keyring) error {
		_, err := to.Open(seal.Reservation, from.Seal(seal.Reservation, "r", time.Now().Add(time.Hour)))
		return err
	}
	if err := agree(rings[0], rings[1]); err != nil {
		t.Fatalf("two replicas sealed with different keys: %v", err)
	}

	limits := []ratelimit.Limit{
		{Name: "rpm", Key: "tenant=a/principal=p", Unit: ratelimit.Requests, Amount: 1000, Window: time.Hour},
		{Name: "tpm", Key: "tenant=a", Unit: ratelimit.TotalTokens, Amount: 1_000_000, Window: time.Hour},
	}
	lim := ratelimit.NewRedis(clients[0], nil, ratelimit.RedisOptions{})
	cost := ratelimit.Cost{Requests: 1, InputTokens: 1, OutputTokens: 1}
	if res, err := lim.Reserve(ctx, limits, cost); err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	counters := c.PrimaryFor("{" + ratelimit.DefaultClusterHashTag + "}")
	victim := counters
	t.Logf("counters on %s", counters.Addr())

	promoted, took := c.KillPrimary(victim)
	t.Logf("killed %s: %s promoted after %v", victim.Addr(), promoted.Addr(), took)
	start := time.Now()
	for {
		_, rerr := lim.Reserve(ctx, limits, cost)
		gerr := rings[1].Refresh(ctx)
		if rerr == nil && gerr == nil {
			break
		}
		if time.Since(start) > 30*time.Second { // turns a client that never follows into a failure
			t.Fatalf("still failing %v after the promotion: reserve %v, reservation key %v", time.Since(start), rerr, gerr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("served again %v after the promotion", time.Since(start))
	if err := rings[0].Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := agree(rings[1], rings[0]); err != nil {
		t.Errorf("after the failover the replicas disagree: %v", err)
	}
}

// defaultConfig is the configuration serve runs with by default.
func defaultConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
