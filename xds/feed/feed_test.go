package feed

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/xds/controller"
)

func TestPublishSubscribe(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	testPublishSubscribe(t, rdb)
}

// The stream is one key: on a Redis Cluster it lives on one primary, and
// the publisher's pipelines and the subscribers' XREADs go there.
func TestPublishSubscribeCluster(t *testing.T) {
	c := redisserver.StartCluster(t, redisserver.ClusterOptions{NoReplicas: true})
	testPublishSubscribe(t, c.NewClient(t))
}

func testPublishSubscribe(t *testing.T, rdb redis.UniversalClient) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	var mu sync.Mutex
	var got []controller.Observation
	// Two controllers each see every observation.
	subscribed := make(chan struct{}, 2)
	for range 2 {
		go func() {
			subscribed <- struct{}{}
			Subscribe(ctx, rdb, "obs", func(o controller.Observation) {
				mu.Lock()
				got = append(got, o)
				mu.Unlock()
			}, log)
		}()
	}
	<-subscribed
	<-subscribed
	time.Sleep(100 * time.Millisecond) // XREAD from "$" must be in place before publishing

	pub := NewPublisher(rdb, "obs", log)
	go pub.Run(ctx)
	at := time.UnixMicro(time.Now().UnixMicro())
	want := controller.Observation{At: at, VirtualModel: "llama", Pool: "pool-a", PromptTokens: 42,
		TTFT: 123456 * time.Microsecond, ITLP95: 20 * time.Millisecond, Status: 503}
	for range 50 {
		pub.Publish(want)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d observations, want 100 (50 to each of two subscribers)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, o := range got {
		if o != want {
			t.Fatalf("got %+v, want %+v", o, want)
		}
	}
}

// Publishing never blocks, even with Redis gone.
func TestPublishNeverBlocks(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	pub := NewPublisher(rdb, "obs", slog.New(slog.DiscardHandler))
	start := time.Now()
	for range 20000 {
		pub.Publish(controller.Observation{VirtualModel: "m", Pool: "p", At: time.Now()})
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("publishing 20000 observations took %v", d)
	}
	if pub.Dropped() == 0 {
		t.Error("a full queue must drop, and count it")
	}
}

// Stopping the publisher flushes what is queued: observations made just
// before a shutdown still reach the controllers.
func TestRunFlushesQueueOnStop(t *testing.T) {
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
