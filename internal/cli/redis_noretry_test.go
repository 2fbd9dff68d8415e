package cli

import (
	"context"
	"io"
	"net"
	"sync"
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
// counters, so a client-side retry applies a settlement twice, and a
// second refund under-charges the tenant. go-redis retries such a command
// by default (on EOF and on a read timeout), so the shared client is
// built with no retries; a settlement that failed this way keeps its
// reservation, which is the accounting rule's side to err on.
func TestBudgetScriptsAreNeverResent(t *testing.T) {
	srv := redisserver.Start(t)
	proxy := newReplyCutter(t, srv.Addr())
	c, err := redisClient(config.Redis{Mode: "standalone", Address: proxy.addr, Timeout: 2 * time.Second})
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
	proxy.cutNextReply.Store(true)
	_ = lim.Settle(ctx, res.Reservation, ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 20})
	if proxy.cut.Load() != 1 {
		t.Fatalf("the proxy cut %d replies, want 1", proxy.cut.Load())
	}
	// Refunded once: 200 reserved, 80 back, 120 used. Resent, it would
	// read 40 (two refunds).
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer direct.Close()
	got, err := direct.Get(ctx, res.Reservation.Entries[0].Counter).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if got != 120 {
		t.Errorf("the counter reads %d after one settlement whose reply was lost, want 120 (the script ran once)", got)
	}
}

// replyCutter forwards Redis connections; armed, it lets the next command
// reach Redis, reads Redis' answer and closes the client's connection
// instead of passing the answer on.
type replyCutter struct {
	addr         string
	cutNextReply atomic.Bool
	cut          atomic.Int64
}

func newReplyCutter(t *testing.T, upstream string) *replyCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyCutter{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				client.Close()
				continue
			}
			wg.Go(func() { io.Copy(server, client); server.Close() })
			wg.Go(func() {
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && p.cutNextReply.CompareAndSwap(true, false) {
						p.cut.Add(1)
						server.Close()
						return
					}
					if n > 0 {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}
