package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// blockingProcessor holds every span until released, like an exporter
// whose collector hangs.
type blockingProcessor struct {
	release chan struct{}
	mu      sync.Mutex
	got     int
}

func (b *blockingProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (b *blockingProcessor) OnEnd(sdktrace.ReadOnlySpan) {
	<-b.release
	b.mu.Lock()
	b.got++
	b.mu.Unlock()
}
func (b *blockingProcessor) Shutdown(context.Context) error   { return nil }
func (b *blockingProcessor) ForceFlush(context.Context) error { return nil }

// A hung collector never blocks the span's caller: what does not fit in the
// queue is dropped and counted, the rest is delivered once it recovers, and
// spans ending after shutdown are ignored.
func TestDropQueueNeverBlocks(t *testing.T) {
	next := &blockingProcessor{release: make(chan struct{})}
	var dropped atomic.Int64
	q := newDropQueue(next, 4, func() { dropped.Add(1) })
	span := tracetest.SpanStub{Name: "s"}.Snapshot()
	for range 20 {
		q.OnEnd(span) // must return at once: the test would hang otherwise
	}
	// One span is held by the blocked forwarder, four wait in the queue.
	if d := dropped.Load(); d < 15 || d > 16 {
		t.Errorf("dropped %d of 20 with a queue of 4", d)
	}
	close(next.release)
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if int64(next.got)+dropped.Load() != 20 {
		t.Errorf("delivered %d + dropped %d != 20", next.got, dropped.Load())
	}
	q.OnEnd(span) // after shutdown: ignored, no panic
}
