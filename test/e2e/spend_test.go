package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/cli"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// spendPrices are costConfig's prices, beside a policy with budgets.
const spendPrices = `
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
admin:
  debug: {enabled: true}
`

// spendGroup is a row of a spend report.
type spendGroup struct{ tenant, key, model string }

// Two tenants, two models, streamed and not, cached tokens or not, through
// real Envoy under budgets: /debug/spend's JSON (from every replica: with
// Redis the ledger is shared) and `infergate spend` report, per tenant and
// model and per key, exactly the tokens and cost the meter settled, as the
// request log's stamps show them.
func TestSpendAgreesWithTheLedger(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			extra, replicas := spendPrices, 1
			if backend == "redis" {
				srv := redisserver.Start(t)
				extra += "ratelimit: {backend: redis, redis: {address: " + srv.Addr() + "}}\n"
				replicas = 2
			}
			s := startStackWith(t, policyConfig(writeKeys(t), loadPolicies(t, 1_000_000), extra), replicas)
			want := map[spendGroup]spend.Amount{}
			for i, tc := range []struct {
				key, model string
				stream     bool
				cached     int
			}{
				{"sk-acme-0001", "pool-a", true, 0}, {"sk-acme-0001", "pool-a", false, 4}, {"sk-acme-0001", "pool-b", true, 6},
				{"sk-load-0001", "pool-a", true, 3}, {"sk-load-0001", "pool-b", false, 0}, {"sk-load-0001", "pool-b", true, 0},
				{"sk-acme-0001", "pool-b", false, 0}, {"sk-load-0001", "pool-a", false, 0},
			} {
				hdr := map[string]string{"authorization": "Bearer " + tc.key, "x-mock-ttft-ms": "0", "x-mock-itl-ms": "0",
					"x-mock-cached-tokens": strconv.Itoa(tc.cached)}
				got := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody(tc.model, 5+i, tc.stream, ""), hdr)
				if got.Status != 200 {
					t.Fatalf("request %d: status %d: %s", i, got.Status, got.Body)
				}
				st := spendStamp(t, s.Replicas, got.RequestID)
				if st.TokenSource != "usage" || st.CachedTokens != tc.cached || st.Cost == "" {
					t.Fatalf("request %d: stamp %+v: want the pool's usage, %d cached, a cost", i, st, tc.cached)
				}
				g := spendGroup{st.Tenant, st.Principal, st.Model}
				want[g] = want[g].Add(spend.Amount{Requests: 1, InputTokens: int64(st.PromptTokens), CachedTokens: int64(st.CachedTokens),
					OutputTokens: int64(st.CompletionTokens), Cost: pico(t, st.Cost.String())})
			}
			if len(want) != 4 {
				t.Fatalf("groups %v: want two tenants × two models", want)
			}
			byTenantModel := map[spendGroup]spend.Amount{}
			for g, a := range want {
				byTenantModel[spendGroup{g.tenant, "", g.model}] = a // one key per tenant
			}
			for _, g := range s.Replicas {
				rep := spendReport(t, g.AdminURL+"/debug/spend?format=json&since=2h&by=tenant,key,model")
				checkSpend(t, "the page of "+g.AdminURL+" by tenant,key,model", rep, want)
			}
			// Budget left: the tenants' budgets as the gate last reserved against them.
			left := map[string]bool{}
			for _, g := range s.Replicas {
				for _, b := range spendReport(t, g.AdminURL+"/debug/spend?format=json").Budgets {
					if b.Remaining < b.Amount && b.Amount > 0 {
						left[b.Tenant] = true
					}
				}
			}
			if !left["acme"] || !left["loadtest"] {
				t.Errorf("budget left known for %v, want acme and loadtest", left)
			}
			// The command line reads the same report.
			var out bytes.Buffer
			args := []string{"spend", "--admin", s.Gateway.AdminURL, "--since", "2h", "--by", "model,tenant"}
			if err := cli.Run(context.Background(), append(args, "--json"), &out, &out); err != nil {
				t.Fatalf("infergate spend: %v\n%s", err, out.String())
			}
			var rep spend.Report
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("infergate spend --json: %v\n%s", err, out.String())
			}
			checkSpend(t, "infergate spend --json by tenant,model", rep, byTenantModel)
			out.Reset()
			if err := cli.Run(context.Background(), args, &out, &out); err != nil {
				t.Fatalf("infergate spend: %v\n%s", err, out.String())
			}
			rows := map[string]bool{}
			for line := range strings.Lines(out.String()) {
				if f := strings.Fields(line); len(f) >= 7 {
					rows[strings.Join(f[:7], " ")] = true
				}
			}
			for g, a := range byTenantModel {
				row := fmt.Sprintf("%s %s %s %d %d %d %d", g.tenant, g.model, price.Money(a.Cost, rep.Currency), a.Requests, a.InputTokens, a.CachedTokens, a.OutputTokens)
				if !rows[row] {
					t.Errorf("infergate spend's table has no row %q:\n%s", row, out.String())
				}
			}
		})
	}
}

// checkSpend compares a report's rows with want, and its total with theirs.
func checkSpend(t *testing.T, what string, rep spend.Report, want map[spendGroup]spend.Amount) {
	t.Helper()
	got := map[spendGroup]spend.Amount{}
	var total spend.Amount
	for _, r := range rep.Rows {
		got[spendGroup{r.Tenant, r.KeyID, r.Model}] = r.Window
		total = total.Add(r.Window)
	}
	if !maps.Equal(got, want) || rep.Total != total || rep.Currency != "USD" {
		t.Errorf("%s: rows %v total %+v (%s), want %v", what, got, rep.Total, rep.Currency, want)
	}
}

// spendStamp waits for a request's stamp in the request log of whichever
// replica metered it.
func spendStamp(t *testing.T, replicas []*gateway, requestID string) spendLine {
	t.Helper()
	var found spendLine
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, g := range replicas {
			sc := bufio.NewScanner(strings.NewReader(g.requests.String()))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if json.Unmarshal(sc.Bytes(), &found) == nil && found.RequestID == requestID {
					return true
				}
			}
		}
		return false
	}, "the stamp of "+requestID)
	return found
}

// spendLine is what a request-log line says of a request's charge.
type spendLine struct {
	RequestID        string      `json:"request_id"`
	Tenant           string      `json:"tenant"`
	Principal        string      `json:"principal"`
	Model            string      `json:"model"`
	PromptTokens     int         `json:"prompt_tokens"`
	CachedTokens     int         `json:"cached_tokens"`
	CompletionTokens int         `json:"completion_tokens"`
	TokenSource      string      `json:"token_source"`
	Cost             json.Number `json:"cost"`
}

// pico reads a decimal cost ("0.0000012") as pico-units.
func pico(t *testing.T, s string) int64 {
	t.Helper()
	whole, frac, _ := strings.Cut(s, ".")
	n, err := strconv.ParseInt(whole+frac+strings.Repeat("0", 12-len(frac)), 10, 64)
	if err != nil || len(frac) > 12 {
		t.Fatalf("cost %q: %v", s, err)
	}
	return n
}

func spendReport(t *testing.T, url string) spend.Report {
	t.Helper()
	var rep spend.Report
	if err := json.Unmarshal([]byte(get(t, url)), &rep); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return rep
}
