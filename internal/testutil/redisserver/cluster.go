package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil"
)

// ClusterOptions shapes the cluster StartCluster runs; the zero value is
// three primaries with one replica each and a one-second node timeout.
type ClusterOptions struct {
	// Primaries is the number of primaries, which split the 16384 slots
	// evenly (default 3, the fewest a cluster can fail over with: a
	// failover needs the votes of a majority of the primaries).
	Primaries int
	// NoReplicas starts primaries only: cheaper, but no failover.
	NoReplicas bool
	// NodeTimeout is cluster-node-timeout: how long a primary may be
	// unreachable before the others mark it failed and its replica takes
	// over (default 1s).
	NodeTimeout time.Duration
}

// ClusterStartTimeout bounds StartCluster: processes up, slots assigned,
// nodes met, replicas in sync, cluster_state:ok on every node.
const ClusterStartTimeout = 30 * time.Second

// Cluster is a Redis Cluster of redis-server processes on loopback, built
// by hand (CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH, MEET, REPLICATE: what
// redis-cli --cluster create does, without needing redis-cli), stopped by
// t.Cleanup.
type Cluster struct {
	t     testing.TB
	bin   string
	opts  ClusterOptions
	nodes []*Node // the primaries as created, then their replicas
}

// Node is one redis-server of a Cluster. Its role may change (Failover,
// KillPrimary); ask the Cluster who is what.
type Node struct {
	c       *Cluster
	port    int
	busPort int
	dir     string
	id      string
	log     *testutil.Buffer
	admin   *redis.Client // for the harness' own commands

	mu   sync.Mutex
	proc *testutil.Proc // nil while killed
}

// StartCluster runs a Redis Cluster on free loopback ports and waits until
// every node says cluster_state:ok and every replica is in sync. Every
// process is killed when the test ends; the nodes' logs are printed if it
// failed.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.Primaries == 0 {
		opts.Primaries = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = time.Second
	}
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bin: bin, opts: opts}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Kill()
			_ = n.admin.Close()
		}
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("redis-server %s (cluster node %s) log:\n%s", n.Addr(), n.id, n.log.String())
			}
		}
	})
	total := opts.Primaries
	if !opts.NoReplicas {
		total *= 2
	}
	for range total {
		n := &Node{c: c, dir: t.TempDir(), log: &testutil.Buffer{}}
		var lastErr error
		for range 5 { // a free port may be taken before redis-server binds it
			if n.port, err = freePort(); err != nil {
				t.Fatalf("redisserver: finding a free port: %v", err)
			}
			if n.busPort, err = freePort(); err != nil {
				t.Fatalf("redisserver: finding a free port: %v", err)
			}
			if n.port == n.busPort {
				continue
			}
			if lastErr = n.start(); lastErr == nil {
				break
			}
		}
		if lastErr != nil {
			t.Fatalf("redisserver: cluster node: %v", lastErr)
		}
		n.admin = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1,
			DialTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, PoolSize: 2})
		c.nodes = append(c.nodes, n)
	}
	if err := c.create(); err != nil {
		t.Fatalf("redisserver: creating the cluster: %v", err)
	}
	return c
}

// create assigns the slots, introduces the nodes to each other, attaches
// the replicas and waits for the cluster to be whole.
func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), ClusterStartTimeout)
	defer cancel()
	for _, n := range c.nodes {
		id, err := n.admin.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", n.Addr(), err)
		}
		n.id = id
	}
	p := c.opts.Primaries
	for i, n := range c.nodes[:p] {
		lo, hi := i*16384/p, (i+1)*16384/p-1
		// Distinct config epochs, as redis-cli sets them: otherwise the
		// nodes first resolve their collisions, which takes a while.
		if err := n.admin.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", n.Addr(), err)
		}
		if err := n.admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", n.Addr(), lo, hi, err)
		}
	}
	for _, n := range c.nodes[1:] {
		if err := c.nodes[0].admin.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.port, n.busPort).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", n.Addr(), err)
		}
	}
	if err := c.poll(ctx, "every node to know every other", func() error {
		for _, n := range c.nodes {
			view, err := n.view(ctx)
			if err != nil {
				return err
			}
			if len(view) != len(c.nodes) {
				return fmt.Errorf("%s knows %d nodes of %d", n.Addr(), len(view), len(c.nodes))
			}
			for _, v := range view {
				if v.has("handshake") || v.has("noaddr") {
					return fmt.Errorf("%s sees %s as %v", n.Addr(), v.addr, v.flags)
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i, r := range c.nodes[p:] {
		if err := c.poll(ctx, "CLUSTER REPLICATE", func() error {
			return r.admin.Do(ctx, "CLUSTER", "REPLICATE", c.nodes[i].id).Err()
		}); err != nil {
			return fmt.Errorf("%s: %w", r.Addr(), err)
		}
	}
	return c.poll(ctx, "the cluster to be whole", func() error {
		for i, n := range c.nodes {
			if err := n.clusterOK(ctx); err != nil {
				return err
			}
			view, err := n.view(ctx)
			if err != nil {
				return err
			}
			for j, m := range c.nodes {
				v, ok := view.byID(m.id)
				if !ok {
					return fmt.Errorf("%s does not know %s", n.Addr(), m.Addr())
				}
				if j < p && (!v.has("master") || len(v.slots) == 0) {
					return fmt.Errorf("%s sees primary %s as %v with slots %v", n.Addr(), m.Addr(), v.flags, v.slots)
				}
				if j >= p && (!v.has("slave") || v.master != c.nodes[j-p].id) {
					return fmt.Errorf("%s sees replica %s as %v of %s", n.Addr(), m.Addr(), v.flags, v.master)
				}
				if !v.has("myself") && v.link != "connected" {
					return fmt.Errorf("%s: link to %s %s", n.Addr(), m.Addr(), v.link)
				}
			}
			if i >= p {
				if err := n.replicaInSync(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Addrs are every node's host:port, the seeds to give a cluster client.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Nodes are the cluster's nodes: the primaries as created, then their
// replicas in the same order.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// NewClient returns a cluster client of c, closed when the test ends.
func (c *Cluster) NewClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Slot asks the cluster which slot key hashes to (CLUSTER KEYSLOT).
func (c *Cluster) Slot(key string) int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := c.live()
	slot, err := n.admin.Do(ctx, "CLUSTER", "KEYSLOT", key).Int()
	if err != nil {
		c.t.Fatalf("redisserver: %s: CLUSTER KEYSLOT %q: %v", n.Addr(), key, err)
	}
	return slot
}

// PrimaryFor is the node serving key's slot now, as a live node sees it.
func (c *Cluster) PrimaryFor(key string) *Node {
	c.t.Helper()
	slot := c.Slot(key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	view, err := c.live().view(ctx)
	if err != nil {
		c.t.Fatalf("redisserver: %v", err)
	}
	for _, v := range view {
		if v.has("master") && !v.failed() && v.serves(slot) {
			return c.node(v.id)
		}
	}
	c.t.Fatalf("redisserver: no live primary serves slot %d (key %q)", slot, key)
	return nil
}

// ReplicaOf is primary's replica, as a live node sees it.
func (c *Cluster) ReplicaOf(primary *Node) *Node {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	view, err := c.live().view(ctx)
	if err != nil {
		c.t.Fatalf("redisserver: %v", err)
	}
	for _, v := range view {
		if v.has("slave") && !v.failed() && v.master == primary.id {
			return c.node(v.id)
		}
	}
	c.t.Fatalf("redisserver: primary %s has no live replica", primary.Addr())
	return nil
}

// FailoverTimeout bounds Failover and KillPrimary.
func (c *Cluster) FailoverTimeout() time.Duration { return 10*c.opts.NodeTimeout + 15*time.Second }

// Failover hands primary's slots to its replica the planned way (CLUSTER
// FAILOVER on the replica: the primary stops writes, the replica catches
// up, then takes over; nothing acknowledged is lost) and waits until every
// node agrees. The old primary becomes the new one's replica. It returns
// the new primary.
func (c *Cluster) Failover(primary *Node) *Node {
	c.t.Helper()
	replica := c.ReplicaOf(primary)
	ctx, cancel := context.WithTimeout(context.Background(), c.FailoverTimeout())
	defer cancel()
	if err := replica.admin.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		c.t.Fatalf("redisserver: %s: CLUSTER FAILOVER: %v", replica.Addr(), err)
	}
	if err := c.waitPromoted(ctx, replica, primary); err != nil {
		c.t.Fatalf("redisserver: failover of %s to %s: %v", primary.Addr(), replica.Addr(), err)
	}
	return replica
}

// KillPrimary kills primary (SIGKILL: writes it acknowledged but had not
// yet sent to its replica are lost, as in a crash) and waits until its
// replica has been elected in its place and every live node says
// cluster_state:ok. It returns the new primary and how long that took
// from the kill: NodeTimeout to detect the failure, then the replica's
// election (0.5 to 1 s of delay, then the vote).
func (c *Cluster) KillPrimary(primary *Node) (*Node, time.Duration) {
	c.t.Helper()
	replica := c.ReplicaOf(primary)
	start := time.Now()
	primary.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), c.FailoverTimeout())
	defer cancel()
	if err := c.waitPromoted(ctx, replica, primary); err != nil {
		c.t.Fatalf("redisserver: promotion of %s after killing %s: %v", replica.Addr(), primary.Addr(), err)
	}
	return replica, time.Since(start)
}

// WaitHealthy waits until every running node says cluster_state:ok and
// knows every running node as connected, and every running replica is in
// sync with its primary: after Restart, for instance.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.FailoverTimeout())
	defer cancel()
	err := c.poll(ctx, "the running nodes to be healthy", func() error {
		for _, n := range c.nodes {
			if !n.running() {
				continue
			}
			if err := n.clusterOK(ctx); err != nil {
				return err
			}
			view, err := n.view(ctx)
			if err != nil {
				return err
			}
			for _, m := range c.nodes {
				v, ok := view.byID(m.id)
				if m.running() && (!ok || v.failed() || (!v.has("myself") && v.link != "connected")) {
					return fmt.Errorf("%s sees %s as %v, link %s", n.Addr(), m.Addr(), v.flags, v.link)
				}
				// A restarted primary whose slots were taken is a primary
				// without slots until it turns into the new primary's
				// replica: not yet where it belongs.
				if m.running() && v.has("master") && len(v.slots) == 0 {
					return fmt.Errorf("%s sees %s as a primary with no slots (rejoining)", n.Addr(), m.Addr())
				}
			}
			if me, _ := view.byID(n.id); me.has("slave") {
				if err := n.replicaInSync(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("redisserver: %v", err)
	}
}

// waitPromoted waits until every live node sees replica as a primary with
// slots and old as failed or as a replica, and says cluster_state:ok.
func (c *Cluster) waitPromoted(ctx context.Context, replica, old *Node) error {
	return c.poll(ctx, "the replica's promotion", func() error {
		for _, n := range c.nodes {
			if !n.running() {
				continue
			}
			view, err := n.view(ctx)
			if err != nil {
				return err
			}
			r, _ := view.byID(replica.id)
			if !r.has("master") || r.failed() || len(r.slots) == 0 {
				return fmt.Errorf("%s sees %s as %v with slots %v", n.Addr(), replica.Addr(), r.flags, r.slots)
			}
			if o, _ := view.byID(old.id); o.has("master") && len(o.slots) > 0 {
				return fmt.Errorf("%s still sees %s as a primary with slots %v", n.Addr(), old.Addr(), o.slots)
			}
			if err := n.clusterOK(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// live is some running node.
func (c *Cluster) live() *Node {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.running() {
			return n
		}
	}
	c.t.Fatal("redisserver: no cluster node is running")
	return nil
}

func (c *Cluster) node(id string) *Node {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	c.t.Fatalf("redisserver: node %s is not one of this cluster's", id)
	return nil
}

// poll calls check every 20 ms until it returns nil or ctx ends.
func (c *Cluster) poll(ctx context.Context, what string, check func() error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Addr is the node's host:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// ID is the node's cluster id.
func (n *Node) ID() string { return n.id }

// Kill kills the node (SIGKILL, as a crash would) and waits for it to
// exit. Killing a stopped node does nothing.
func (n *Node) Kill() {
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart starts a killed node again on its ports with its nodes.conf: it
// rejoins the cluster, as the replica of whoever took its slots. Its data
// set starts empty and is copied from its new primary. Call
// Cluster.WaitHealthy to wait until it is in sync.
func (n *Node) Restart() {
	n.c.t.Helper()
	n.Kill()
	if err := retry(n.start); err != nil {
		n.c.t.Fatalf("redisserver: restarting cluster node on port %d: %v", n.port, err)
	}
}

func (n *Node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil
}

// start runs redis-server in cluster mode on n's ports and waits for PING.
func (n *Node) start() error {
	p, err := run(n.c.bin, n.port, n.log,
		"--cluster-enabled", "yes",
		"--cluster-port", strconv.Itoa(n.busPort),
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(n.c.opts.NodeTimeout.Milliseconds(), 10),
		// A replica may always stand in for its dead primary, however
		// long their link has been down: tests on a loaded machine must
		// not find the failover refused.
		"--cluster-replica-validity-factor", "0",
		// Replicas copy their primary at once (the default waits 5 s for
		// more replicas to share the transfer).
		"--repl-diskless-sync-delay", "0",
		"--save", "",
		"--appendonly", "no",
		"--dir", n.dir,
	)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	return nil
}

// clusterOK checks the node says cluster_state:ok with every slot served.
func (n *Node) clusterOK(ctx context.Context) error {
	info, err := n.admin.Do(ctx, "CLUSTER", "INFO").Text()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr(), err)
	}
	if !strings.Contains(info, "cluster_state:ok\r\n") || !strings.Contains(info, "cluster_slots_ok:16384\r\n") {
		return fmt.Errorf("%s: cluster not ok:\n%s", n.Addr(), info)
	}
	return nil
}

// replicaInSync checks a replica's link to its primary is up and the
// initial copy done.
func (n *Node) replicaInSync(ctx context.Context) error {
	info, err := n.admin.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("%s: INFO replication: %w", n.Addr(), err)
	}
	if !strings.Contains(info, "role:slave\r\n") || !strings.Contains(info, "master_link_status:up\r\n") ||
		strings.Contains(info, "master_sync_in_progress:1\r\n") {
		return fmt.Errorf("%s: replica not in sync:\n%s", n.Addr(), info)
	}
	return nil
}

// nodeView is one line of CLUSTER NODES.
type nodeView struct {
	id, addr string
	flags    []string
	master   string // the primary's id, for a replica
	link     string // connected or disconnected
	slots    []string
}

func (v nodeView) has(flag string) bool { return slices.Contains(v.flags, flag) }

func (v nodeView) failed() bool { return v.has("fail") || v.has("fail?") }

// serves reports whether one of v's slot ranges holds slot.
func (v nodeView) serves(slot int) bool {
	for _, r := range v.slots {
		if strings.HasPrefix(r, "[") { // a slot being migrated
			continue
		}
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && l <= slot && slot <= h {
			return true
		}
	}
	return false
}

type clusterView []nodeView

func (cv clusterView) byID(id string) (nodeView, bool) {
	for _, v := range cv {
		if v.id == id {
			return v, true
		}
	}
	return nodeView{}, false
}

// view is the node's CLUSTER NODES.
func (n *Node) view(ctx context.Context) (clusterView, error) {
	text, err := n.admin.Do(ctx, "CLUSTER", "NODES").Text()
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER NODES: %w", n.Addr(), err)
	}
	var out clusterView
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, errors.New(n.Addr() + ": CLUSTER NODES line " + strconv.Quote(line))
		}
		v := nodeView{id: f[0], addr: f[1], flags: strings.Split(f[2], ","), link: f[7], slots: f[8:]}
		if f[3] != "-" {
			v.master = f[3]
		}
		out = append(out, v)
	}
	return out, nil
}
