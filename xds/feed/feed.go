// Package feed carries the meter's observations from any number of ext_proc
// replicas to any number of controllers through a Redis stream, so that
// replicas are interchangeable and controllers need no leader: every
// controller reads every observation and reaches the same decision.
package feed

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/xds/controller"
)

// DefaultStream is the Redis stream observations go to.
const DefaultStream = "ig:observations"

// maxLen bounds the stream (approximately): far more than a window needs.
const maxLen = 200_000

// Publisher sends observations to Redis without ever blocking the caller:
// they are queued and written in pipelined batches; when the queue is full
// (Redis slow or away) they are dropped and counted.
type Publisher struct {
	rdb     redis.UniversalClient
	stream  string
	queue   chan controller.Observation
	log     *slog.Logger
	dropped atomic.Int64
}

// NewPublisher returns a publisher; call Run to start writing.
func NewPublisher(rdb redis.UniversalClient, stream string, log *slog.Logger) *Publisher {
	return &Publisher{rdb: rdb, stream: stream, queue: make(chan controller.Observation, 8192), log: log}
}

// Publish queues one observation.
func (p *Publisher) Publish(o controller.Observation) {
	select {
	case p.queue <- o:
	default:
		p.dropped.Add(1)
	}
}

// Dropped is how many observations were dropped because the queue was full.
func (p *Publisher) Dropped() int64 { return p.dropped.Load() }

// flushTimeout bounds writing what is still queued when Run is told to
// stop; writeTimeout bounds one batch.
const (
	flushTimeout = 2 * time.Second
	writeTimeout = 5 * time.Second
)

// Run writes queued observations until ctx is done, then flushes what is
// still queued (for at most flushTimeout) and returns. A batch taken from
// the queue is written whole even if ctx ends meanwhile: stopping never
// loses an observation silently (a failed write is dropped and counted).
func (p *Publisher) Run(ctx context.Context) {
	batch := make([]controller.Observation, 0, 256)
	for {
		select {
		case <-ctx.Done():
			p.flush(batch)
			return
		case o := <-p.queue:
			batch = p.take(append(batch[:0], o))
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
			p.write(wctx, batch)
			cancel()
		}
	}
}

// take appends queued observations to batch, up to its capacity, without
// waiting.
func (p *Publisher) take(batch []controller.Observation) []controller.Observation {
	for len(batch) < cap(batch) {
		select {
		case o := <-p.queue:
			batch = append(batch, o)
		default:
			return batch
		}
	}
	return batch
}

// flush writes what is queued, in batches, within flushTimeout.
func (p *Publisher) flush(batch []controller.Observation) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	for ctx.Err() == nil {
		if batch = p.take(batch[:0]); len(batch) == 0 {
			return
		}
		p.write(ctx, batch)
	}
	if n := len(p.queue); n > 0 {
		p.dropped.Add(int64(n))
		p.log.Warn("observations still queued at shutdown; dropped", "n", n)
	}
}

// write sends one batch in a pipeline; a failed batch is dropped and counted.
func (p *Publisher) write(ctx context.Context, batch []controller.Observation) {
	pipe := p.rdb.Pipeline()
	for _, o := range batch {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: p.stream, MaxLen: maxLen, Approx: true, Values: encode(o)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		p.dropped.Add(int64(len(batch)))
		p.log.Warn("publishing observations failed; dropped", "n", len(batch), "err", err)
	}
}

func encode(o controller.Observation) []string {
	return []string{
		"v", o.VirtualModel, "p", o.Pool,
		"n", strconv.Itoa(o.PromptTokens),
		"t", strconv.FormatInt(o.TTFT.Microseconds(), 10),
		"i", strconv.FormatInt(o.ITLP95.Microseconds(), 10),
		"s", strconv.Itoa(o.Status),
		"a", strconv.FormatInt(o.At.UnixMicro(), 10),
	}
}

var errBadEntry = errors.New("malformed observation")

func decode(v map[string]any) (controller.Observation, error) {
	str := func(k string) string { s, _ := v[k].(string); return s }
	num := func(k string) int64 { n, _ := strconv.ParseInt(str(k), 10, 64); return n }
	o := controller.Observation{
		VirtualModel: str("v"), Pool: str("p"),
		PromptTokens: int(num("n")),
		TTFT:         time.Duration(num("t")) * time.Microsecond,
		ITLP95:       time.Duration(num("i")) * time.Microsecond,
		Status:       int(num("s")),
		At:           time.UnixMicro(num("a")),
	}
	if o.VirtualModel == "" || o.Pool == "" || o.At.IsZero() {
		return o, errBadEntry
	}
	return o, nil
}

// Subscribe reads new observations (those added after it starts) and hands
// each to observe, until ctx is done. Redis errors are logged and retried;
// the controller meanwhile keeps its weights.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, stream string, observe func(controller.Observation), log *slog.Logger) {
	last := "$"
	for ctx.Err() == nil {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1000, Block: time.Second}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("reading observations failed; retrying", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
			continue
		}
		for _, s := range res {
			for _, m := range s.Messages {
				last = m.ID
				if o, err := decode(m.Values); err == nil {
					observe(o)
				}
			}
		}
	}
}
