package compose

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// A budget script Redis ran but whose answer was lost (a connection cut,
// a reply past the timeout) must not be sent again: the scripts add to
// counters, so a resent settlement refunds twice and under-charges the
// tenant. go-redis resends such a command by default (on EOF and on a read
// timeout; a cluster client on the same node or the slot's next), so the
// shared client is built not to. A settlement that failed this way keeps
// its reservation, the accounting rule's side to err on; a reservation is
// sent once more (the limiter's own choice), since running twice can only
// over-charge.
func TestBudgetScriptsAreNeverResent(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redisserver.Start(t)
		direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer direct.Close()
		settleOnceWithItsAnswerLost(t, config.Redis{Mode: "standalone", Address: srv.Addr(), Timeout: 2 * time.Second}, direct)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel() // waits on its own Redis processes
		c := redisserver.StartCluster(t, redisserver.ClusterOptions{})
		settleOnceWithItsAnswerLost(t, config.Redis{Mode: "cluster", Addresses: c.Addrs(), Timeout: 2 * time.Second}, c.NewClient(t))
	})
}

func settleOnceWithItsAnswerLost(t *testing.T, cfg config.Redis, direct redis.UniversalClient) {
	t.Helper()
	var cutter replyCutter
	c, err := redisClientWith(cfg, time.Hour, cutter.dial)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := ratelimit.NewRedis(c, nil, ratelimit.RedisOptions{})
	ctx := context.Background()
	// A first round loads the scripts, so that the settlement below runs
	// its script at once (EVALSHA) rather than after a NOSCRIPT answer.
	warm := []ratelimit.Limit{{Name: "w", Key: "tenant=warm", Unit: ratelimit.TotalTokens, Amount: 1000, Window: time.Hour}}
	if res, err := lim.Reserve(ctx, warm, ratelimit.Cost{Requests: 1, InputTokens: 1}); err != nil || !res.Allowed {
		t.Fatalf("warm-up reserve: %+v %v", res, err)
	} else if err := lim.Settle(ctx, res.Reservation, ratelimit.Cost{Requests: 1}); err != nil {
		t.Fatalf("warm-up settle: %v", err)
	}
	limits := []ratelimit.Limit{{Name: "t", Key: "tenant=acme", Unit: ratelimit.TotalTokens, Amount: 1000, Window: time.Hour}}
	res, err := lim.Reserve(ctx, limits, ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 100})
	if err != nil || !res.Allowed {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	// The settlement reaches Redis, which runs it; its answer is cut.
	cutter.armed.Store(true)
	err = lim.Settle(ctx, res.Reservation, ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 20})
	if cutter.cut.Load() != 1 || err == nil {
		t.Fatalf("%d answers cut, settle error %v: want one answer cut and the settlement failed", cutter.cut.Load(), err)
	}
	// Refunded once: 200 reserved, 80 back, 120 used. Resent, it would
	// read 40 (two refunds).
	got, err := direct.Get(ctx, res.Reservation.Entries[0].Counter).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if got != 120 {
		t.Errorf("the counter reads %d after one settlement whose answer was lost, want 120 (the script ran once)", got)
	}

	// A reservation whose answer was lost is sent once more: the request
	// is admitted, and the first reservation stays charged (the rule's
	// side: an over-charge, never a refund).
	other := []ratelimit.Limit{{Name: "t", Key: "tenant=initech", Unit: ratelimit.TotalTokens, Amount: 1000, Window: time.Hour}}
	cutter.armed.Store(true)
	res, err = lim.Reserve(ctx, other, ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 100})
	if err != nil || !res.Allowed || cutter.cut.Load() != 2 {
		t.Fatalf("reserve with its answer cut: %+v %v (%d answers cut): want admitted on the resend", res, err, cutter.cut.Load())
	}
	if got, err := direct.Get(ctx, res.Reservation.Entries[0].Counter).Int64(); err != nil || got != 400 {
		t.Errorf("the counter reads %d (%v) after a reservation resent, want 400 (both ran; the first stays charged)", got, err)
	}
}

// replyCutter dials Redis; armed, it lets the next script reach Redis,
// reads Redis' answer and closes the connection instead of passing the
// answer on, once.
type replyCutter struct {
	armed atomic.Bool
	cut   atomic.Int64
}

func (r *replyCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cuttingConn{Conn: conn, r: r}, nil
}

type cuttingConn struct {
	net.Conn
	r      *replyCutter
	script atomic.Bool // the last command written was a script
}

func (c *cuttingConn) Write(b []byte) (int, error) {
	c.script.Store(bytes.Contains(bytes.ToLower(b), []byte("evalsha")))
	return c.Conn.Write(b)
}

func (c *cuttingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.script.Load() && c.r.armed.CompareAndSwap(true, false) {
		c.r.cut.Add(1)
		c.Conn.Close()
		return 0, io.EOF
	}
	return n, err
}
