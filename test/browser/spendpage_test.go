package browser_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
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

// The spend page checked as a team lead reads it, in a real browser at
// 1280 and 800 px wide: money in dollars with the symbol, each amount the
// ledger's, the rows adding up to the total (as shown, within the
// rounding shown, and exactly), no cell cut off (each within the window or
// reachable by scrolling its table's own box; the page never scrolls
// sideways), the range picks showing what the ledger has for that range,
// the CSV export the same rows, the from/to form linkable, a budget in
// dollars per day, and nothing on the console. It writes a screenshot per
// width; UPDATE_SCREENSHOT=1 writes them to docs/images/spend-<width>.png.
func TestSpendPageInChromium(t *testing.T) {
	prices := &price.Table{Currency: "USD"}
	prices.Add("llama-3.1-70b", price.Price{Input: 590_000, CachedInput: 295_000, Output: 790_000}, nil)
	prices.Add("llama-3.1-8b", price.Price{Input: 50_000, Output: 80_000}, nil)
	prices.Add("gpt-4o", price.Price{Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000}, nil)
	now := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	at := now
	type info struct{ team, name, owner string }
	keyInfo := map[string]info{"acme-search": {"search", "search backend", "alice@acme.example"},
		"acme-chat": {"chat", "support chatbot", "bob@acme.example"}, "globex-app": {"app", "mobile app (prod)", "ops@globex.example"}}
	l := &spend.Ledger{Store: &spend.Memory{}, Prices: prices, Now: func() time.Time { return at },
		Team:    func(id string) string { return keyInfo[id].team },
		KeyInfo: func(id string) (string, string) { return keyInfo[id].name, keyInfo[id].owner }}
	keys := []struct{ tenant, key, model string }{
		{"acme", "acme-search", "llama-3.1-70b"}, {"acme", "acme-chat", "gpt-4o"}, {"acme", "acme-search", "llama-3.1-8b"},
		{"globex", "globex-app", "llama-3.1-70b"}, {"initech", "initech-dev", "llama-3.1-8b"},
	}
	charge := func(h int, scale int64) {
		for i, k := range keys {
			if (h+i)%4 == 3 {
				continue // quiet hours
			}
			at = now.Add(-time.Duration(h) * time.Hour)
			n := scale * int64(40_000+9_000*((h*7+i*3)%11))
			l.Charged(context.Background(), k.tenant, &request.Settlement{Principal: k.key, Model: k.model, CachedTokens: int(n / 4)},
				ratelimit.Cost{Requests: 20 + int64(h%5), InputTokens: n, OutputTokens: n / 3}, true)
		}
	}
	for h := range 24 * 8 { // the last 8 days, hourly
		charge(h, 1)
	}
	for h := 24 * 8; h < 24*31; h += 7 { // November, sparser, a few small requests
		charge(h, 1+int64(h%3))
	}
	at = now.Add(-40 * time.Second)
	l.Reserved("acme", []ratelimit.State{{Limit: ratelimit.Limit{Name: "tenant-usd-per-day", Key: "tenant=acme", Unit: ratelimit.Money,
		Amount: 10_000_000_000, Window: 24 * time.Hour}, Remaining: 250_000_000, Reset: 14*time.Hour + 30*time.Minute}})
	l.Reserved("globex", []ratelimit.State{{Limit: ratelimit.Limit{Name: "tenant-tokens-per-5m", Key: "tenant=globex", Unit: ratelimit.TotalTokens,
		Amount: 5_000_000, Window: 5 * time.Minute}, Remaining: 3_470_000, Reset: 4 * time.Minute}})
	l.Reserved("initech", []ratelimit.State{{Limit: ratelimit.Limit{Name: "key-usd-per-month", Key: "key=initech-dev", Unit: ratelimit.Money,
		Amount: 500_000_000_000_000, Window: ratelimit.Month}, Remaining: 123_456_780_000_000, Reset: 29 * 24 * time.Hour}})
	at = now
	srv := httptest.NewServer(spend.Handler(l))
	defer srv.Close()
	ledger := func(q spend.Query) spend.Report {
		t.Helper()
		q.Now = now
		rep, err := l.Report(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	month := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	byAll := []spend.Dimension{spend.ByTenant, spend.ByTeam, spend.ByKey, spend.ByModel}

	b := browser.Start(t, 1280, 900)
	ctx := b.Ctx
	for _, width := range []int64{1280, 800} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, 900)); err != nil {
				t.Fatal(err)
			}
			open := func(query string) {
				t.Helper()
				if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/debug/spend?"+query)); err != nil {
					t.Fatal(err)
				}
				waitJS(t, ctx, `document.readyState === "complete"`)
			}
			open("range=this-month&by=tenant,team,key,model")
			tab := readTable(t, ctx)
			want := ledger(spend.Query{Since: month, Until: now, By: byAll})
			tab.check(t, "this month", want)
			for _, r := range tab.rows {
				if id := r.cells[2]; keyInfo[id].name != "" && (r.cells[3] != keyInfo[id].name || r.cells[4] != keyInfo[id].owner) {
					t.Errorf("key %s: name %q owner %q, want %+v", id, r.cells[3], r.cells[4], keyInfo[id])
				}
			}
			noneCutOff(t, ctx)
			if width >= 1280 {
				// At 1280 px even the widest grouping needs no scrolling.
				wide, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll(".scroll")).filter(
					b => b.scrollWidth > b.clientWidth).map(b => b.querySelector("table").id + " " + b.scrollWidth + " > " + b.clientWidth)`))
				if err != nil || len(wide) > 0 {
					t.Errorf("at %d px these scroll (%v): %v", width, err, wide)
				}
			}
			// The today column's sum is what the "today" pick shows.
			var today int64
			for _, r := range tab.rows {
				today += r.today
			}

			shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if os.Getenv("UPDATE_SCREENSHOT") == "1" {
				dir = "../../docs/images"
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("spend-%d.png", width)), shot, 0o644); err != nil {
				t.Fatal(err)
			}
			if len(shot) > 200<<10 {
				t.Errorf("screenshot %d bytes, want under 200 KB", len(shot))
			}

			// The budgets as a person says them.
			left, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#budgets tr")).slice(1).map(
				tr => Array.from(tr.querySelectorAll("td")).map(td => td.textContent).filter((_, i) => [0, 3, 5, 6].includes(i)).join(" | "))`))
			if err != nil || strings.Join(left, "\n") != "acme | $0.00025 | $0.01 | per day\n"+
				"globex | 3,470,000 tokens | 5,000,000 tokens | per 5 minutes\n"+
				"initech | $123.46 | $500.00 | per month" {
				t.Errorf("budget left (%v):\n%s", err, strings.Join(left, "\n"))
			}

			// The CSV link exports the rows the page shows, exactly.
			text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch(document.getElementById("csv").href).then(r => r.text())`,
				chromedp.EvalAwaitPromise))
			if err != nil {
				t.Fatal(err)
			}
			recs, err := csv.NewReader(strings.NewReader(text)).ReadAll()
			if err != nil || len(recs) != len(tab.rows)+1 || strings.Join(recs[0][:6], ",") != "tenant,team,key,key_name,key_owner,model" {
				t.Fatalf("csv (%v): %d records for %d rows:\n%s", err, len(recs), len(tab.rows), text)
			}
			var csvTotal int64
			for i, rec := range recs[1:] {
				pico, err := price.ParseAmount(rec[7])
				if err != nil {
					// Costs have more than the 6 places ParseAmount reads.
					pico = picoOf(t, rec[7])
				}
				csvTotal += pico
				if rec[2] != tab.rows[i].cells[2] || pico != tab.rows[i].cost {
					t.Errorf("csv row %d %v, page row %v", i, rec, tab.rows[i].cells)
				}
			}
			if csvTotal != want.Total.Cost {
				t.Errorf("csv costs add to %d, the ledger's total is %d", csvTotal, want.Total.Cost)
			}

			// The picks, as a person clicks them.
			for _, p := range []struct {
				label, name string
				since       time.Time
				until       time.Time
				window      string
			}{
				{"last month", "last-month", month.AddDate(0, -1, 0), month, "From Nov 1 00:00 to Dec 1 00:00:00 UTC,"},
				{"last 7 days", "7d", month.AddDate(0, 0, -5), now, "From Nov 26 00:00 to Dec 2 09:30:00 UTC (now),"},
				{"today", "today", month.AddDate(0, 0, 1), now, "From Dec 2 00:00 to Dec 2 09:30:00 UTC (now),"},
			} {
				if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(
					`Array.from(document.querySelectorAll("nav.picks a")).find(a => a.textContent === %q).click()`, p.label))); err != nil {
					t.Fatal(err)
				}
				waitJS(t, ctx, fmt.Sprintf(`location.search.includes("range=%s") && document.readyState === "complete"`, p.name))
				tab := readTable(t, ctx)
				tab.check(t, p.label, ledger(spend.Query{Since: p.since, Until: p.until, By: byAll}))
				if !strings.HasPrefix(tab.window, p.window) || tab.active != p.label {
					t.Errorf("%s: window %q, pick %q highlighted", p.label, tab.window, tab.active)
				}
				if p.name == "today" && tab.total != today {
					t.Errorf("today's total %d, the today column added to %d", tab.total, today)
				}
				noneCutOff(t, ctx)
			}

			// From/to by the form: the link says it, the page shows it.
			if err := chromedp.Do(ctx, chromedp.SetValue(`input[name=from]`, "2026-11-10"), chromedp.SetValue(`input[name=to]`, "2026-11-20"),
				chromedp.Click(`button[type=submit]`)); err != nil {
				t.Fatal(err)
			}
			waitJS(t, ctx, `location.search.includes("from=2026-11-10&to=2026-11-20") && document.readyState === "complete"`)
			tab = readTable(t, ctx)
			tab.check(t, "Nov 10 to 20", ledger(spend.Query{Since: month.AddDate(0, -1, 9), Until: month.AddDate(0, -1, 20), By: byAll}))
			if !strings.HasPrefix(tab.window, "From Nov 10 00:00 to Nov 21 00:00:00 UTC,") {
				t.Errorf("from/to: window %q", tab.window)
			}
		})
	}
	for _, m := range b.Console(t) {
		t.Errorf("console: %s", m)
	}
}

// table is the spend table as the page shows it.
type table struct {
	rows                  []row
	total, totalShownPico int64
	totalShown, summary   string
	requests, totalReqs   int64
	window, active        string
	symbols               []string // every money cell's text
}

type row struct {
	cells       []string
	cost, today int64  // data-pico
	costShown   string // the text
}

func readTable(t *testing.T, ctx context.Context) table {
	t.Helper()
	type raw struct {
		Rows    [][]string `json:"rows"`
		Picos   [][]string `json:"picos"`
		Total   []string   `json:"total"`
		TPico   string     `json:"tpico"`
		Summary string     `json:"summary"`
		Window  string     `json:"window"`
		Active  string     `json:"active"`
		Money   []string   `json:"money"`
	}
	r, err := chromedp.Run(ctx, chromedp.Evaluate[raw](`(() => {
		const trs = Array.from(document.querySelectorAll("#spend tr")).slice(1, -1);
		const total = document.querySelector("#spend tr.total");
		return {
			rows: trs.map(tr => Array.from(tr.querySelectorAll("td")).map(td => td.textContent)),
			picos: trs.map(tr => Array.from(tr.querySelectorAll("td.money")).map(td => td.dataset.pico)),
			total: Array.from(total.querySelectorAll("td")).map(td => td.textContent),
			tpico: total.querySelector("td.money").dataset.pico,
			summary: document.querySelector("#summary b").textContent,
			window: document.getElementById("window").textContent,
			active: (document.querySelector("nav.picks a.on") || {}).textContent || "",
			money: Array.from(document.querySelectorAll("td.money, #summary b[data-pico], #budgets td:nth-child(4)")).map(td => td.textContent),
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	tab := table{window: r.Window, active: r.Active, summary: r.Summary, symbols: r.Money}
	const labels = 6 // tenant, team, key, name, owner, model
	for i, cells := range r.Rows {
		if len(cells) == 1 { // nothing charged
			break
		}
		p := r.Picos[i]
		tab.rows = append(tab.rows, row{cells: cells, cost: atoi(t, p[0]), today: atoi(t, p[1]), costShown: cells[labels]})
		tab.requests += atoi(t, cells[labels+1])
	}
	tab.total, tab.totalShown = atoi(t, r.TPico), r.Total[1]
	tab.totalReqs = atoi(t, r.Total[2])
	return tab
}

// check is what a person checks of the table: every amount in dollars;
// the rows' costs as shown add up to the total as shown, within the
// rounding shown; the requests add up; the summary says the total; and
// the amounts are the ledger's.
func (tab table) check(t *testing.T, what string, want spend.Report) {
	t.Helper()
	for _, m := range tab.symbols {
		if !strings.HasPrefix(m, "$") && !strings.Contains(m, "tokens") {
			t.Errorf("%s: an amount without its currency: %q", what, m)
		}
	}
	var sum, slack float64
	var exact int64
	for _, r := range tab.rows {
		v, half := dollars(t, r.costShown)
		sum, slack, exact = sum+v, slack+half, exact+r.cost
		if d := math.Abs(v - float64(r.cost)/1e12); d > half*1.000001 {
			t.Errorf("%s: %v shows %s for %d pico", what, r.cells[:6], r.costShown, r.cost)
		}
	}
	total, half := dollars(t, tab.totalShown)
	if math.Abs(sum-total) > slack+half {
		t.Errorf("%s: the rows add up to $%.6f, the total shows %s", what, sum, tab.totalShown)
	}
	if exact != tab.total || tab.total != want.Total.Cost || len(tab.rows) != len(want.Rows) || tab.requests != tab.totalReqs ||
		tab.totalReqs != want.Total.Requests || tab.summary != tab.totalShown {
		t.Errorf("%s: %d rows costing %d pico (%d requests), total %d (%d requests), summary %s; the ledger: %d rows, %d pico, %d requests",
			what, len(tab.rows), exact, tab.requests, tab.total, tab.totalReqs, tab.summary, len(want.Rows), want.Total.Cost, want.Total.Requests)
	}
	if len(want.Rows) == 0 {
		t.Errorf("%s: the ledger has nothing: the test checks nothing", what)
	}
}

// noneCutOff fails for an element the window cuts off: each is within
// the viewport, or in a table box that scrolls sideways and, scrolled to
// its end, shows it; the page itself never scrolls sideways.
func noneCutOff(t *testing.T, ctx context.Context) {
	t.Helper()
	bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const vw = document.documentElement.clientWidth, bad = [];
		if (document.documentElement.scrollWidth > vw) bad.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + vw);
		for (const box of document.querySelectorAll(".scroll")) box.scrollLeft = box.scrollWidth;
		for (const el of document.querySelectorAll("td, th, h1, h2, p, nav a, label, button, svg, .summary div, .axis span")) {
			const r = el.getBoundingClientRect();
			if (r.width === 0) continue;
			if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible") bad.push("clipped: " + el.textContent.slice(0, 40));
			if (r.right <= vw + 0.5 && r.left >= -0.5) continue;
			const box = el.closest(".scroll");
			if (box && getComputedStyle(box).overflowX === "auto" && box.scrollWidth > box.clientWidth) {
				const b = box.getBoundingClientRect();
				// Scrolled to its end, the box shows the last cells.
				if (b.right <= vw + 0.5 && (r.right <= b.right + 0.5 || r.left < b.left)) continue;
			}
			bad.push(el.tagName + " " + JSON.stringify(el.textContent.trim().slice(0, 40)) + " spans " + r.left + "-" + r.right + " of " + vw);
		}
		for (const box of document.querySelectorAll(".scroll")) box.scrollLeft = 0;
		return bad;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("cut off: %s", b)
	}
}

// dollars reads "$1,234.5678" and half its last shown digit.
func dollars(t *testing.T, s string) (v, half float64) {
	t.Helper()
	n := strings.ReplaceAll(strings.TrimPrefix(s, "$"), ",", "")
	v, err := strconv.ParseFloat(n, 64)
	if err != nil || !strings.HasPrefix(s, "$") {
		t.Fatalf("%q is no dollar amount", s)
	}
	places := 0
	if _, frac, ok := strings.Cut(n, "."); ok {
		places = len(frac)
	}
	return v, math.Pow10(-places) / 2
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// picoOf reads an exact decimal (up to 12 places) as pico-units.
func picoOf(t *testing.T, s string) int64 {
	t.Helper()
	whole, frac, _ := strings.Cut(s, ".")
	return atoi(t, whole)*1e12 + atoi(t, (frac + strings.Repeat("0", 12))[:12])
}
