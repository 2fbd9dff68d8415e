package meter

import (
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
)

// StampOf prices the stamp's tokens at its model's price on its pool,
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
			m := &Request{Reservation: "r-1", Origin: request.OriginPool}
			m.Stamp = request.Stamp{Model: tc.model, Pool: tc.pool, Tenant: "acme", Status: 200, PromptTokens: tc.gateEstimate}
			m.Tally.API, m.Tally.MaxGaps, m.Tally.SSE = api, 8, tc.nonSSE == ""
			m.Tally.Parser.MaxLine = 1 << 16
			m.Tally.Body([]byte(tc.stream+tc.nonSSE), time.Unix(1, 0))
			m.Tally.End(time.Unix(2, 0))
			o := StampOf(m, End{At: time.Unix(2, 0), Complete: true, Trusted: !tc.untrustedField,
				PoolName: func(p string) string { return "pool-" + p }, Prices: prices})
			st := o.Stamp
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
