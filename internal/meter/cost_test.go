package meter

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
)

// stampOf prices the stamp's tokens at its model's price on its pool,
// exactly: the pool's usage (its cached part at the cached price), or
// what the meter counted, marked as such.
func TestStampOfCost(t *testing.T) {
	prices := &price.Table{Currency: "USD"}
	mini := price.Price{Input: 150_000, CachedInput: 75_000, CacheWrite: 150_000, Output: 600_000} // $0.15, 0.075, 0.60 /M
	prices.Add("mini", mini, map[string]price.Price{"pool-premium": {Input: 300_000, CachedInput: 150_000, CacheWrite: 300_000, Output: 1_200_000}})
	prices.Add("claude", price.Price{Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 15_000_000}, nil)
	content := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	chatUsage := func(prompt, cached, completion int) string {
		return content + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" + itoa(prompt) + ",\"completion_tokens\":" + itoa(completion) +
			",\"prompt_tokens_details\":{\"cached_tokens\":" + itoa(cached) + "}}}\n\ndata: [DONE]\n\n"
	}
	for _, tc := range []struct {
		name           string
		model, pool    string
		api            openai.API
		stream         string
		nonSSE         string // a non-streamed body instead
		cached, write  int
		cost           string // in dollars; "" unpriced
		source         string
		counted        bool
		gateEstimate   int
		untrustedField bool
	}{
		{name: "one input token", model: "mini", pool: "standard", stream: chatUsage(1, 0, 0), cost: "0.00000015", source: "model"},
		{name: "cached at the cached price", model: "mini", pool: "standard", stream: chatUsage(2006, 1920, 300),
			cached: 1920, cost: "0.0003369", source: "model"}, // 86×0.15 + 1920×0.075 + 300×0.6 µ$
		{name: "the pool's price", model: "mini", pool: "premium", stream: chatUsage(2006, 1920, 300),
			cached: 1920, cost: "0.0006738", source: "pool"},
		{name: "cached beyond the prompt is priced as input", model: "mini", pool: "standard", stream: chatUsage(10, 11, 0),
			cost: "0.0000015", source: "model"},
		{name: "counted: the events and the gate's estimate", model: "mini", pool: "standard", stream: content + content + "data: [DONE]\n\n",
			gateEstimate: 9, cost: "0.00000255", source: "model", counted: true}, // 9×0.15 + 2×0.6 µ$
		{name: "Anthropic, cut after message_start: its input is the pool's, its output counted", model: "claude", pool: "standard", api: openai.APIMessages,
			stream: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\n\n",
			cached: 100, write: 20, cost: "0.000135", source: "model", counted: true}, // 5×3 + 100×0.3 + 20×3.75 + 1×15 µ$
		{name: "Anthropic, whole", model: "claude", pool: "standard", api: openai.APIMessages,
			stream: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			cached: 100, write: 20, cost: "0.000255", source: "model"}, // 5×3 + 100×0.3 + 20×3.75 + 9×15 µ$
		{name: "an unpriced model", model: "other", pool: "standard", stream: chatUsage(10, 0, 1)},
		{name: "count_tokens runs no model", model: "mini", pool: "standard", api: openai.APICountTokens, nonSSE: `{"input_tokens":1000}`},
		{name: "embeddings at the input price", model: "mini", pool: "standard", api: openai.APIEmbeddings,
			nonSSE: `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"mini","usage":{"prompt_tokens":10,"total_tokens":10}}`,
			cost:   "0.0000015", source: "model"},
		{name: "an untrusted field is still priced (no tenant: no metric)", model: "mini", pool: "standard", stream: chatUsage(1, 0, 0),
			cost: "0.00000015", source: "model", untrustedField: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := tc.api
			if api == "" {
				api = openai.APIChat
			}
			m := &meterRequest{seen: true, reservation: "r-1", origin: request.OriginPool}
			m.stamp = request.Stamp{Model: tc.model, Pool: tc.pool, Tenant: "acme", Status: 200, PromptTokens: tc.gateEstimate}
			m.tally.API, m.tally.MaxGaps, m.tally.SSE = api, 8, tc.nonSSE == ""
			m.tally.Parser.MaxLine = 1 << 16
			m.tally.Body([]byte(tc.stream+tc.nonSSE), time.Unix(1, 0))
			m.tally.End(time.Unix(2, 0))
			o := stampOf(m, meterEnd{at: time.Unix(2, 0), complete: true, trusted: !tc.untrustedField,
				poolName: func(p string) string { return "pool-" + p }, prices: prices})
			st := o.stamp
			cost := ""
			if st.Cost.Currency != "" {
				cost = price.FormatCost(st.Cost.Amount)
			}
			if cost != tc.cost || st.Cost.Price != tc.source || st.Cost.Counted != tc.counted ||
				st.CachedTokens != tc.cached || st.CacheWriteTokens != tc.write || cost != "" && st.Cost.Currency != "USD" {
				t.Errorf("cost %q (%+v), cached %d, written %d; want %q from %q (counted %v), cached %d, written %d",
					cost, st.Cost, st.CachedTokens, st.CacheWriteTokens, tc.cost, tc.source, tc.counted, tc.cached, tc.write)
			}
		})
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// infergate.cost sums the stamps' costs exactly, by tenant, model and
// pool, each label from a bounded set: tenants past the first 64 served
// are "other", as unknown models and pools are.
func TestCostMetric(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	inst, err := newInstruments(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("t"), "USD")
	if err != nil {
		t.Fatal(err)
	}
	ms := &meters{m: inst, models: newLabelSet([]string{"mini"}), pools: newLabelSet([]string{"p"}), tenants: newLabelSet(nil)}
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
