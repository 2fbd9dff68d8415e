package redisserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil"
)

// A cluster starts whole, serves keys on every primary, survives a
// primary's crash (its replica takes over with what it had), takes the
// crashed node back as a replica, and hands the slots back by a planned
// failover.
func TestCluster(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	start := time.Now()
	c := StartCluster(t, ClusterOptions{})
	t.Logf("3 primaries + 3 replicas up in %v", time.Since(start))
	if n := len(c.Nodes()); n != 6 || len(c.Addrs()) != 6 {
		t.Fatalf("%d nodes, %d addresses; want 6", n, len(c.Addrs()))
	}
	ctx := context.Background()
	rdb := c.NewClient(t)

	// Keys land on every primary.
	primaries := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if err := rdb.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		primaries[c.PrimaryFor(key).Addr()] = true
	}
	if len(primaries) != 3 {
		t.Errorf("30 keys on %d primaries, want 3", len(primaries))
	}
	if got, want := c.Slot("{user1000}.following"), c.Slot("{user1000}.followers"); got != want {
		t.Errorf("one hash tag, two slots: %d, %d", got, want)
	}

	// Crash the primary of "k0" once its replica has the key.
	old := c.PrimaryFor("k0")
	if old != c.Nodes()[0] && old != c.Nodes()[1] && old != c.Nodes()[2] {
		t.Fatalf("k0's primary %s is not one of the created primaries", old.Addr())
	}
	direct := redis.NewClient(&redis.Options{Addr: old.Addr()})
	defer direct.Close()
	conn := direct.Conn()
	if err := conn.Set(ctx, "{k0}acked", "yes", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	conn.Close()
	replica := c.ReplicaOf(old)
	promoted, took := c.KillPrimary(old)
	t.Logf("primary %s killed: %s promoted after %v", old.Addr(), promoted.Addr(), took)
	if promoted != replica || c.PrimaryFor("k0") != promoted {
		t.Fatalf("promoted %s, k0 served by %s; want the replica %s", promoted.Addr(), c.PrimaryFor("k0").Addr(), replica.Addr())
	}
	rdb.ReloadState(ctx) // the client learns of the failover on its own only from MOVED or its reload interval
	testutil.Eventually(t, 5*time.Second, func() bool { v, err := rdb.Get(ctx, "{k0}acked").Result(); return err == nil && v == "yes" }, "the acknowledged write, read from the promoted replica")

	// The crashed node comes back as the new primary's replica...
	old.Restart()
	c.WaitHealthy()
	if r := c.ReplicaOf(promoted); r != old {
		t.Fatalf("restarted %s, but %s's replica is %s", old.Addr(), promoted.Addr(), r.Addr())
	}
	// ...and takes its slots back by a planned failover.
	start = time.Now()
	if back := c.Failover(promoted); back != old {
		t.Fatalf("Failover promoted %s, want %s", back.Addr(), old.Addr())
	}
	t.Logf("planned failover back to %s in %v", old.Addr(), time.Since(start))
	testutil.Eventually(t, 5*time.Second, func() bool { v, err := rdb.Get(ctx, "{k0}acked").Result(); return err == nil && v == "yes" }, "the acknowledged write, after the failover back")
	if err := rdb.Set(ctx, "k0", "after", 0).Err(); err != nil {
		t.Errorf("SET after the failovers: %v", err)
	}
}

// A cluster without replicas starts too, and a client's cross-slot script
// is refused the way the rate limiter's must never be.
func TestClusterNoReplicas(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	c := StartCluster(t, ClusterOptions{Primaries: 3, NoReplicas: true})
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("%d nodes, want 3", n)
	}
	rdb := c.NewClient(t)
	ctx := context.Background()
	err := rdb.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"a", "b"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Errorf("cross-slot script = %v, want CROSSSLOT", err)
	}
	if err := rdb.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"{t}a", "{t}b"}).Err(); err != nil {
		t.Errorf("one-slot script = %v", err)
	}
}
