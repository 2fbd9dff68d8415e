// Package module is infergate's second adapter: the gate and the meter as
// an HTTP filter of a dynamic module running inside Envoy's process
// (cmd/infergate-module, built -buildmode=c-shared). It calls the same
// cores as the ext_proc adapter (internal/gate: the request's Admission
// and its Plan; internal/meter: the tally, stamp and settlement) through
// Envoy's Go SDK, with direct access to headers and body buffers: no gRPC,
// no copies of a response chunk. In one process the gate and the meter
// are one object per request, so the reservation reaches the meter as a
// value: nothing is sealed between them.
//
// Configured through its own Options (mapped from the configuration file
// by internal/cli); it imports neither internal/config nor extproc.
package module

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/observe"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
)

// FilterName is the name the filter is registered under (filter_name in
// Envoy's dynamic_modules filter config).
const FilterName = "infergate"

// Options configure the filter; Policy is required.
type Options struct {
	Intake gate.Intake // what the gate parses, and its body limit
	Rules  gate.Rules  // what PlanOf follows
	// Catalog is what the gate lists on GET /v1/models itself (empty: the
	// path is the policy's and the pools', like any other).
	Catalog gate.Catalog
	// Policy identifies, decides, settles and releases: the admission
	// controller serve builds, from the same configuration file.
	Policy request.Policy
	Sinks  []request.Sink // where stamps go besides Meters (the request log, /debug/requests, the SLA feed)
	// Meters records the per-request metrics, as the ext_proc adapter
	// does (internal/observe); nil records none.
	Meters *observe.Meters
	Tracer trace.Tracer // the gate's and the meter's spans; nil: none
	// Stalls notes when the process did not run (its watch runs as long as
	// the options live): a meter read after a stall is marked late_read.
	// Nil: reads are trusted.
	Stalls *meter.StallWatch
	Prices *price.Table // the models' prices; nil prices nothing
	// MaxTrackedGaps and MaxEventBytes bound the meter per request.
	MaxTrackedGaps, MaxEventBytes int
	Logger                        *slog.Logger
}

// settleTimeout bounds settling (or releasing) a reservation once its
// request is over, off Envoy's worker thread.
const settleTimeout = 2 * time.Second

// decideTimeout bounds the policy's decision (Redis, Rego, external
// checks) of one request: past it the request fails closed.
const decideTimeout = 30 * time.Second

// ConfigFactory builds the filter's factory from Envoy's filter config: the
// path of an infergate configuration file, which load maps to Options.
type ConfigFactory struct {
	shared.EmptyHttpFilterConfigFactory
	load func(config []byte) (*Options, error)
}

// NewConfigFactory is the config factory to register under FilterName.
func NewConfigFactory(load func(config []byte) (*Options, error)) *ConfigFactory {
	return &ConfigFactory{load: load}
}

// Create loads the options; an error refuses the filter config (Envoy
// refuses the listener), a panic too: never Envoy's process.
func (c *ConfigFactory) Create(h shared.HttpFilterConfigHandle, config []byte) (f shared.HttpFilterFactory, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = nil, panicError{r}
		}
	}()
	o, err := c.load(config)
	if err != nil {
		return nil, err
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	return &Factory{opts: o}, nil
}

// defaults fills what Options left zero.
func (o *Options) defaults() error {
	o.Logger = cmp.Or(o.Logger, slog.Default())
	if o.Meters == nil {
		inst, err := observe.NewInstruments(metricnoop.NewMeterProvider().Meter(""), "USD")
		if err != nil {
			return err
		}
		o.Meters = observe.NewMeters(inst, nil, nil, nil)
	}
	if o.Tracer == nil {
		o.Tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	if o.Intake.MaxBodyBytes == 0 {
		o.Intake.MaxBodyBytes = 1 << 20
	}
	return nil
}

// Factory makes one filter per request.
type Factory struct {
	shared.EmptyHttpFilterFactory
	opts *Options
}

// Create is a request's filter.
func (f *Factory) Create(h shared.HttpFilterHandle) shared.HttpFilter {
	return &filter{opts: f.opts, h: h}
}

type panicError struct{ v any }

func (p panicError) Error() string { return "panic: " + slog.AnyValue(p.v).String() }
