// Package telemetry wires infergate's metrics: OpenTelemetry instruments
// (GenAI semantic-convention names) exported in Prometheus format on the
// admin port. Nothing here is global; callers hold a *Metrics.
package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Metrics is infergate's meter provider and the Prometheus registry it
// exports to; packages register their own instruments on Meter().
type Metrics struct {
	Registry *prometheus.Registry
	provider *sdkmetric.MeterProvider
}

// New builds the provider on a private Prometheus registry.
func New() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	return &Metrics{Registry: reg, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))}, nil
}

// Meter is where other packages register their instruments.
func (m *Metrics) Meter() metric.Meter { return m.provider.Meter("github.com/infergate/infergate") }

// Handler serves the registry in Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// Shutdown flushes and stops the meter provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }
