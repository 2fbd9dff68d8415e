package observe

import (
	"context"
	"fmt"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// infergate.cost sums the stamps' costs exactly, by tenant, model and
// pool, each label from a bounded set: tenants past the first 64 served
// are "other", as unknown models and pools are.
func TestCostMetric(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	inst, err := NewInstruments(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("t"), "USD")
	if err != nil {
		t.Fatal(err)
	}
	ms := NewMeters(inst, []string{"mini"}, []string{"p"}, nil)
	stamp := func(tenant, model string, amount int64) *request.Stamp {
		return &request.Stamp{Tenant: tenant, Model: model, Pool: "p", Status: 200, Decision: "allow", Complete: true,
			API: openai.APIChat, Cost: request.Cost{Amount: amount, Currency: "USD", Price: "model"}}
	}
	ctx := context.Background()
	for i := range maxLearnedLabels + 10 {
		ms.Record(ctx, stamp(fmt.Sprintf("t%d", i), "mini", 150_000))
	}
	ms.Record(ctx, stamp("t0", "mini", 1))
	ms.Record(ctx, stamp("t0", "client-named", 7))
	ms.Record(ctx, &request.Stamp{Tenant: "t0", Model: "mini", Pool: "p", Status: 200, Decision: "deny", Cost: request.Cost{Amount: 1 << 40, Currency: "USD"}})
	ms.Record(ctx, &request.Stamp{Model: "mini", Pool: "p", Status: 200, Unverified: true, Cost: request.Cost{Amount: 1 << 40, Currency: "USD"}})
	ms.Record(ctx, stamp("t1", "mini", 0)) // unpriced: no currency
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "infergate.cost" {
				continue
			}
			if m.Unit != "{picoUSD}" {
				t.Errorf("unit %q", m.Unit)
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				tenant, _ := dp.Attributes.Value("infergate.tenant")
				model, _ := dp.Attributes.Value("gen_ai.request.model")
				got[tenant.AsString()+"/"+model.AsString()] += dp.Value
			}
		}
	}
	if len(got) != maxLearnedLabels+2 || got["t0/mini"] != 150_001 || got["t0/other"] != 7 || got["t1/mini"] != 150_000 ||
		got["other/mini"] != 10*150_000 {
		t.Errorf("cost by tenant/model: %v", got)
	}
}
