package feed

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/xds/controller"
)

func TestPublishSubscribe(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	testPublishSubscribe(t, rdb)
}

// The stream is one key: on a Redis Cluster it lives on one primary, and
// the publisher's pipelines and the subscribers' XREADs go there.
func TestPublishSubscribeCluster(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{NoReplicas: true})
	testPublishSubscribe(t, c.NewClient(t))
}

func testPublishSubscribe(t *testing.T, rdb redis.UniversalClient) {
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	// Two controllers each see every observation. A subscriber reads from
	// "$", what is added after its first XREAD: it is known to be reading
	// once it has received a warm-up observation, published until both
	// have.
	got := make(chan controller.Observation, 200)
	var warmed [2]chan struct{}
	for i := range warmed {
		warmed[i] = make(chan struct{})
		var once sync.Once
		wg.Go(func() {
			Subscribe(ctx, rdb, "obs", func(o controller.Observation) {
				if o.VirtualModel == "warm-up" {
					once.Do(func() { close(warmed[i]) })
					return
				}
				got <- o
			}, log)
		})
	}
	pub := NewPublisher(rdb, "obs", log)
	wg.Go(func() { pub.Run(ctx) })
	warmUp := controller.Observation{At: time.UnixMicro(1), VirtualModel: "warm-up", Pool: "p"}
	again := time.NewTicker(10 * time.Millisecond)
	defer again.Stop()
	for _, w := range warmed {
		for ready := false; !ready; {
			pub.Publish(warmUp)
			select {
			case <-w:
				ready = true
			case <-again.C:
			}
		}
	}

	at := time.UnixMicro(time.Now().UnixMicro())
	want := controller.Observation{At: at, VirtualModel: "llama", Pool: "pool-a", PromptTokens: 42,
		TTFT: 123456 * time.Microsecond, ITLP95: 20 * time.Millisecond, Status: 503}
	for range 50 {
		pub.Publish(want)
	}
	// 50 to each of the two subscribers. The timeout only turns a hang
	// into a failure.
	timeout := time.After(10 * time.Second)
	for n := range 100 {
		select {
		case o := <-got:
			if o != want {
				t.Fatalf("got %+v, want %+v", o, want)
			}
		case <-timeout:
			t.Fatalf("received %d observations, want 100 (50 to each of two subscribers)", n)
		}
	}
}

// Publishing never blocks, even with nothing writing the queue out: in a
// synctest bubble a blocked Publish would deadlock the bubble and fail at
// once. What does not fit the queue is dropped and counted.
func TestPublishNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pub := NewPublisher(nil, "obs", slog.New(slog.DiscardHandler))
		for range 20000 {
			pub.Publish(controller.Observation{VirtualModel: "m", Pool: "p", At: time.Now()})
		}
		if got, want := pub.Dropped(), int64(20000-cap(pub.queue)); got != want {
			t.Errorf("dropped %d, want %d (all that did not fit the queue of %d)", got, want, cap(pub.queue))
		}
	})
}

// Subscribe retries a failing Redis after a pause, not in a tight loop:
// in virtual time (testing/synctest) the attempts are exactly 500 ms apart.
func TestSubscribeRetriesAfterAPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var attempts []time.Duration
		rdb := redis.NewClient(&redis.Options{MaxRetries: -1, DialerRetries: 1, Dialer: func(context.Context, string, string) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, time.Since(start))
			return nil, errors.New("redis down")
		}})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 2250*time.Millisecond)
		defer cancel()
		Subscribe(ctx, rdb, "obs", func(controller.Observation) { t.Error("observed from a Redis that is down") }, slog.New(slog.DiscardHandler))
		want := []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(attempts, want) {
			t.Errorf("reads attempted at %v, want %v", attempts, want)
		}
	})
}

// Stopping the publisher flushes what is queued: observations made just
// before a shutdown still reach the controllers.
func TestRunFlushesQueueOnStop(t *testing.T) {
	t.Parallel() // waits on its own Redis processes
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	pub := NewPublisher(rdb, "obs", slog.New(slog.DiscardHandler))
	o := controller.Observation{At: time.UnixMicro(1), VirtualModel: "llama", Pool: "pool-a", Status: 200}
	for range 1000 {
		pub.Publish(o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopped before it ever ran: everything is still queued
	pub.Run(ctx)
	n, err := rdb.XLen(context.Background(), "obs").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1000 || pub.Dropped() != 0 {
		t.Fatalf("stream holds %d observations, %d dropped; want 1000, 0", n, pub.Dropped())
	}
}
