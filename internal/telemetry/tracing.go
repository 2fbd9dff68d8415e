package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Propagator reads and writes W3C traceparent/tracestate: what Envoy's
// OpenTelemetry tracer sends on its ext_proc calls.
var Propagator = propagation.TraceContext{}

// Tracing is infergate's tracer provider: OTLP export when configured,
// no-op otherwise. Nothing here is global.
type Tracing struct {
	Provider trace.TracerProvider
	shutdown func(context.Context) error
}

// Tracer is the tracer every infergate span comes from.
func (t *Tracing) Tracer() trace.Tracer {
	return t.Provider.Tracer("github.com/infergate/infergate")
}

// Shutdown flushes queued spans (bounded by ctx) and stops exporting.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// TracingOptions say where and how spans are exported.
type TracingOptions struct {
	Endpoint    string  // the OTLP collector, host:port; "" turns tracing off
	Protocol    string  // grpc (the default) or http (http/protobuf)
	Insecure    bool    // send without TLS
	SampleRatio float64 // of the traces that have no sampling decision yet
	QueueSize   int     // spans waiting for export; beyond it they are dropped
}

// NewTracing builds the provider for cfg. With no endpoint it is a no-op
// whose spans cost nothing. Spans wait for export in a bounded queue; when
// it is full they are dropped and counted (infergate.trace.spans.dropped):
// the data path never waits on a collector.
func NewTracing(ctx context.Context, cfg TracingOptions, version string, m *Metrics) (*Tracing, error) {
	if cfg.Endpoint == "" {
		return &Tracing{Provider: noop.NewTracerProvider()}, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch cfg.Protocol {
	case "http":
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(cfg.Endpoint)}
		if cfg.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.Endpoint)}
		if cfg.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("infergate"), semconv.ServiceVersion(version)))
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	dropped, err := m.Meter().Int64Counter("infergate.trace.spans.dropped",
		metric.WithDescription("Spans dropped because the export queue was full."))
	if err != nil {
		return nil, err
	}
	// The batcher blocks when its own queue is full; the bounded queue in
	// front of it absorbs bursts and drops (counted) instead, so only the
	// forwarding goroutine ever waits on the exporter.
	batcher := sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBlocking())
	q := newDropQueue(batcher, cfg.QueueSize, func() { dropped.Add(context.Background(), 1) })
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
		sdktrace.WithSpanProcessor(q),
	)
	return &Tracing{Provider: tp, shutdown: tp.Shutdown}, nil
}

// dropQueue is a span processor that hands ended spans to next through a
// bounded queue, dropping (and counting) what does not fit.
type dropQueue struct {
	next    sdktrace.SpanProcessor
	queue   chan sdktrace.ReadOnlySpan
	dropped func()
	done    chan struct{}
	mu      sync.RWMutex // closed and the queue's closing
	closed  bool
}

func newDropQueue(next sdktrace.SpanProcessor, size int, dropped func()) *dropQueue {
	q := &dropQueue{next: next, queue: make(chan sdktrace.ReadOnlySpan, size), dropped: dropped, done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for s := range q.queue {
			q.next.OnEnd(s)
		}
	}()
	return q
}

func (q *dropQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (q *dropQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return
	}
	select {
	case q.queue <- s:
	default:
		q.dropped()
	}
}

func (q *dropQueue) Shutdown(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.queue)
	}
	q.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.next.Shutdown(ctx)
}

func (q *dropQueue) ForceFlush(ctx context.Context) error {
	// Spans still in the queue are flushed by Shutdown; this flushes what
	// the batcher holds.
	return q.next.ForceFlush(ctx)
}
