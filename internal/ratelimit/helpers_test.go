package ratelimit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// t0 is midnight UTC, so it starts a minute, an hour and a day window.
var t0 = time.Unix(1_700_006_400, 0)

// fakeClock is a Clock tests move by hand; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(at time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(at.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time            { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Set(at time.Time)          { c.ns.Store(at.UnixNano()) }
func (c *fakeClock) Advance(d time.Duration)   { c.ns.Add(int64(d)) }
func (c *fakeClock) SetOffset(d time.Duration) { c.Set(t0.Add(d)) }

// newRedisClient returns a client of addr closed when the test ends.
// fast selects short timeouts and no retries, for fault-injection tests.
func newRedisClient(t testing.TB, addr string, fast bool) *redis.Client {
	t.Helper()
	opts := &redis.Options{Addr: addr}
	if fast {
		opts.DialTimeout = 200 * time.Millisecond
		opts.ReadTimeout = 200 * time.Millisecond
		opts.WriteTimeout = 200 * time.Millisecond
		opts.MaxRetries = -1
		opts.DialerRetries = 1
		opts.PoolTimeout = 200 * time.Millisecond
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrips counts the commands and pipelines c is asked to send: a
// limiter that fails fast against a Redis that is down sends one, it does
// not loop.
func roundTrips(c *redis.Client) *atomic.Int64 {
	n := new(atomic.Int64)
	c.AddHook(tripCounter{n})
	return n
}

type tripCounter struct{ n *atomic.Int64 }

func (h tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// startRedis starts a server and checks a client can talk to it.
func startRedis(t testing.TB) *redisserver.Server {
	t.Helper()
	srv := redisserver.Start(t)
	c := newRedisClient(t, srv.Addr(), false)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping %s: %v", srv.Addr(), err)
	}
	return srv
}
