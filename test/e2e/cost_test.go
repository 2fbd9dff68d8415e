package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/price"
)

// costConfig prices the demo's two models apart: pool-a at its model's
// price, pool-b at its price on the pool-b pool (a hosted tier).
const costConfig = testConfig + `
prices:
  currency: USD
  models:
    pool-a: {input: 0.15, cachedInput: 0.075, output: 0.60}
    pool-b:
      input: 3
      cachedInput: 0.3
      output: 15
      pools:
        pool-b: {input: 2.5, cachedInput: 0.25, output: 10}
`

// costStamp is what a request-log line says of a request's tokens and cost.
type costStamp struct {
	RequestID        string      `json:"request_id"`
	Tenant           string      `json:"tenant"`
	Model            string      `json:"model"`
	Pool             string      `json:"pool"`
	PromptTokens     int         `json:"prompt_tokens"`
	CachedTokens     int         `json:"cached_tokens"`
	CompletionTokens int         `json:"completion_tokens"`
	TokenSource      string      `json:"token_source"`
	Cost             json.Number `json:"cost"`
	Currency         string      `json:"currency"`
	PriceSource      string      `json:"price_source"`
	CostCounted      bool        `json:"cost_counted"`
}

func (g *gateway) costStamp(t *testing.T, requestID string) costStamp {
	t.Helper()
	g.stamp(t, requestID) // waits for its line
	sc := bufio.NewScanner(strings.NewReader(g.requests.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s costStamp
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.RequestID == requestID {
			return s
		}
	}
	t.Fatalf("no request-log line for %s", requestID)
	return costStamp{}
}

// Two tenants, two models at different prices through real Envoy,
// streamed and not, with and without cached prompt tokens, in each API:
// the stamp's cost and infergate.cost (by tenant, model and pool) equal
// the pool's reported usage × the price exactly, the cached tokens at the
// cached price.
func TestCostIsUsageTimesPrice(t *testing.T) {
	s := startStackWith(t, costConfig+"auth: {keys: "+writeKeys(t)+"}\n", 1)
	prices := map[string]struct {
		in, cached, out int64 // micro-dollars per million tokens = pico-dollars per token
		source          string
	}{
		"pool-a": {150_000, 75_000, 600_000, "model"},
		"pool-b": {2_500_000, 250_000, 10_000_000, "pool"},
	}
	prompt := `"one two three four five six seven eight nine ten eleven twelve"`
	bodies := map[string]string{ // by path: %q the model, %v stream
		"/v1/chat/completions": `{"model":%q,"stream":%v,"max_tokens":7,"messages":[{"role":"user","content":` + prompt + `}]}`,
		"/v1/responses":        `{"model":%q,"stream":%v,"max_output_tokens":7,"input":` + prompt + `}`,
		"/v1/messages":         `{"model":%q,"stream":%v,"max_tokens":7,"messages":[{"role":"user","content":` + prompt + `}]}`,
	}
	want := map[string]int64{} // the metric's series, by labels
	for i, tc := range []struct {
		path, model string
		stream      bool
		cached      int
	}{
		{"/v1/chat/completions", "pool-a", true, 0}, {"/v1/chat/completions", "pool-a", true, 8}, {"/v1/chat/completions", "pool-a", false, 5},
		{"/v1/chat/completions", "pool-b", true, 0}, {"/v1/chat/completions", "pool-b", true, 10}, {"/v1/chat/completions", "pool-b", false, 3},
		{"/v1/responses", "pool-a", true, 6}, {"/v1/messages", "pool-b", true, 9},
	} {
		t.Run(fmt.Sprintf("%s/%s/stream=%v/cached=%d", tc.path, tc.model, tc.stream, tc.cached), func(t *testing.T) {
			pool := s.PoolA
			if tc.model == "pool-b" {
				pool = s.PoolB
			}
			key, tenant := "sk-acme-0001", "acme" // two tenants, each series its own
			if i%2 == 1 {
				key, tenant = "sk-globex-0001", "globex"
			}
			hdr := map[string]string{"authorization": "Bearer " + key,
				"x-mock-ttft-ms": "0", "x-mock-itl-ms": "0", "x-mock-cached-tokens": strconv.Itoa(tc.cached)}
			before := pool.Usage()
			got := stream(t, s.Envoy.URL+tc.path, fmt.Sprintf(bodies[tc.path], tc.model, tc.stream), hdr)
			if got.Status != 200 {
				t.Fatalf("status %d: %s", got.Status, got.Body)
			}
			st := s.Gateway.costStamp(t, got.RequestID)
			after := pool.Usage() // the pool's usage, as it billed it
			prompt, completion := int(after.PromptTokens-before.PromptTokens), int(after.CompletionTokens-before.CompletionTokens)
			if st.Tenant != tenant || st.TokenSource != "usage" || st.PromptTokens != prompt || st.CompletionTokens != completion || st.CachedTokens != tc.cached {
				t.Fatalf("stamp %+v; the pool billed %d + %d, %d cached", st, prompt, completion, tc.cached)
			}
			p := prices[tc.model]
			pico := int64(prompt-tc.cached)*p.in + int64(tc.cached)*p.cached + int64(completion)*p.out
			if st.Cost.String() != price.FormatCost(pico) || st.Currency != "USD" || st.PriceSource != p.source || st.CostCounted {
				t.Errorf("cost %s %s from %q (counted %v); want %s USD from %q: (%d-%d)×%d + %d×%d + %d×%d pico",
					st.Cost, st.Currency, st.PriceSource, st.CostCounted, price.FormatCost(pico), p.source,
					prompt, tc.cached, p.in, tc.cached, p.cached, completion, p.out)
			}
			want[fmt.Sprintf(`infergate_cost_total{gen_ai_request_model=%q,infergate_pool=%q,infergate_tenant=%q}`, st.Model, st.Pool, st.Tenant)] += pico
		})
	}
	if len(want) != 4 {
		t.Fatalf("series %v: want one per tenant and model", want)
	}
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	for series, pico := range want {
		line := grep(metrics, series)
		_, value, _ := strings.Cut(strings.TrimSpace(line), "} ")
		got, err := strconv.ParseFloat(value, 64)
		if strings.Count(line, "\n") > 0 || err != nil || got != float64(pico) {
			t.Errorf("%s... = %q; want %d (pico-dollars)\n%s", series, value, pico, grep(metrics, "infergate_cost"))
		}
	}
}
