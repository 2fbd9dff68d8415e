package browser_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/infergate/infergate/bench/browser"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/spend"
)

// The spend page works for a person in a real browser: the hourly chart
// draws a bar for each hour that spent, the table has a row per tenant and
// model, the form regroups it by key, and nothing reaches the console.
// UPDATE_SCREENSHOT=1 also writes its screenshot to docs/spend.png.
func TestSpendPageInChromium(t *testing.T) {
	prices := &price.Table{Currency: "USD"}
	prices.Add("llama-3.1-70b", price.Price{Input: 590_000, CachedInput: 295_000, Output: 790_000}, nil)
	prices.Add("llama-3.1-8b", price.Price{Input: 50_000, Output: 80_000}, nil)
	prices.Add("gpt-4o", price.Price{Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000}, nil)
	now := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	at := now
	l := &spend.Ledger{Store: &spend.Memory{}, Prices: prices, Now: func() time.Time { return at },
		Team: func(id string) string {
			return map[string]string{"acme-search": "search", "acme-chat": "chat", "globex-app": "app"}[id]
		}}
	keys := []struct{ tenant, key, model string }{
		{"acme", "acme-search", "llama-3.1-70b"}, {"acme", "acme-chat", "gpt-4o"}, {"acme", "acme-search", "llama-3.1-8b"},
		{"globex", "globex-app", "llama-3.1-70b"}, {"initech", "initech-dev", "llama-3.1-8b"},
	}
	spent := map[int]bool{} // hours ago that spent
	for h := range 24 {
		for i, k := range keys {
			if (h+i)%4 == 3 {
				continue // quiet hours
			}
			spent[h] = true
			at = now.Add(-time.Duration(h) * time.Hour)
			n := int64(40_000 + 9_000*((h*7+i*3)%11))
			l.Charged(context.Background(), k.tenant, &request.Settlement{Principal: k.key, Model: k.model, CachedTokens: int(n / 4)},
				ratelimit.Cost{Requests: 20 + int64(h%5), InputTokens: n, OutputTokens: n / 3}, true)
		}
	}
	at = now.Add(-40 * time.Second)
	day := func(name, key string, amount, left int64) []ratelimit.State {
		return []ratelimit.State{{Limit: ratelimit.Limit{Name: name, Key: key, Unit: ratelimit.TotalTokens, Amount: amount, Window: 24 * time.Hour},
			Remaining: left, Reset: 14*time.Hour + 30*time.Minute + 40*time.Second}}
	}
	l.Reserved("acme", day("tenant-tokens-per-day", "tenant=acme", 20_000_000, 12_840_000))
	l.Reserved("globex", day("tenant-tokens-per-day", "tenant=globex", 5_000_000, 3_470_000))
	l.Reserved("initech", day("tenant-tokens-per-day", "tenant=initech", 2_000_000, 425_000))
	at = now
	srv := httptest.NewServer(spend.Handler(l))
	defer srv.Close()
	b := browser.Start(t, 1200, 900)
	ctx := b.Ctx

	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/debug/spend?since=24h&by=tenant,model")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `document.readyState === "complete"`)
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](
		`Array.from(document.querySelectorAll("svg.chart rect")).map(r => r.getBoundingClientRect().height)`))
	if err != nil {
		t.Fatal(err)
	}
	drawn := 0
	for _, h := range bars {
		if h > 0 {
			drawn++
		}
	}
	if len(bars) != 25 || drawn != len(spent) {
		t.Errorf("chart: %d bars, %d drawn; want 25 hours, %d that spent", len(bars), drawn, len(spent))
	}
	rows := func() [][]string {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[][]string](`Array.from(document.querySelectorAll("#spend tr")).slice(1, -1).map(
			tr => Array.from(tr.querySelectorAll("td")).map(td => td.textContent))`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := rows(); len(got) != len(keys) || got[0][0] == "" || !strings.Contains(got[0][2], ".") {
		t.Errorf("by tenant,model: rows %v, want %d with a cost", got, len(keys))
	}

	// Regroup by key with the form, as a person would.
	if err := chromedp.Do(ctx, chromedp.SetValue(`input[name=by]`, "tenant,team,key"), chromedp.Click(`button[type=submit]`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `location.search.includes("by=tenant%2Cteam%2Ckey") && document.readyState === "complete"`)
	got := rows()
	var keyCol []string
	for _, r := range got {
		keyCol = append(keyCol, r[0]+"/"+r[1]+"/"+r[2])
	}
	if want := 4; len(got) != want || !strings.Contains(strings.Join(keyCol, ","), "acme/search/acme-search") ||
		!strings.Contains(strings.Join(keyCol, ","), "initech/-/initech-dev") {
		t.Errorf("by tenant,team,key: rows %v, want %d (a team where the key has one)", keyCol, want)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/debug/spend?since=24h&by=tenant,model")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `document.readyState === "complete"`)
	left, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#budgets tr")).slice(1).map(
		tr => tr.querySelector("td").textContent + " " + tr.querySelector("td:nth-child(4)").textContent)`))
	if err != nil || strings.Join(left, ",") != "acme 12840000,globex 3470000,initech 425000" {
		t.Errorf("budget left %v (%v)", left, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range b.Console(t) {
		t.Errorf("console: %s", m)
	}
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		if err := os.WriteFile("../../docs/spend.png", shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
