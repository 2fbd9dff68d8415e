package spend

import (
	"context"
	"encoding/csv"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// A window is asked by name, by dates or times, or as a duration back,
// and always ends by now and starts within what the ledger keeps.
func TestParseWindow(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		query        string
		since, until time.Time
	}{
		{"", now.Add(-24 * time.Hour), now},
		{"since=7d", now.Add(-7 * 24 * time.Hour), now},
		{"range=today", time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), now},
		{"range=7d", time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), now},
		{"range=this-month", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), now},
		{"range=last-month", time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"from=2026-11-03&to=2026-11-05", time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 6, 0, 0, 0, 0, time.UTC)},
		{"from=2026-11-03T10:00:00%2B01:00&to=2026-11-03T12:00:00Z", time.Date(2026, 11, 3, 9, 0, 0, 0, time.UTC), time.Date(2026, 11, 3, 12, 0, 0, 0, time.UTC)},
		{"from=2026-12-01", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), now},
		{"from=2026-12-01&to=2027-01-31", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), now}, // ends by now
	} {
		v, _ := url.ParseQuery(c.query)
		w, err := ParseWindow(v, now)
		if err != nil || !w.Since.Equal(c.since) || !w.Until.Equal(c.until) {
			t.Errorf("%s: [%v, %v) %v, want [%v, %v)", c.query, w.Since, w.Until, err, c.since, c.until)
		}
	}
	// Last month on the last day of a 31-day month after another: all of
	// it is still kept.
	if _, err := ParseWindow(url.Values{"range": {"last-month"}}, time.Date(2026, 8, 31, 23, 59, 0, 0, time.UTC)); err != nil {
		t.Errorf("last month on Aug 31: %v", err)
	}
	for _, bad := range []string{"range=year", "range=today&since=1h", "from=2026-11-01&since=1h", "from=yesterday",
		"to=2026-11-05", "from=2026-11-05&to=2026-11-04", "from=2026-12-03", "from=2026-09-01", "since=63d"} {
		v, _ := url.ParseQuery(bad)
		if w, err := ParseWindow(v, now); err == nil {
			t.Errorf("%s: accepted as [%v, %v)", bad, w.Since, w.Until)
		}
	}
}

func TestPer(t *testing.T) {
	for w, want := range map[time.Duration]string{
		24 * time.Hour: "per day", 5 * time.Minute: "per 5 minutes", ratelimit.Month: "per month", time.Hour: "per hour",
		7 * 24 * time.Hour: "per week", 90 * time.Minute: "per 90 minutes", time.Second: "per second", 1500 * time.Millisecond: "per 1.5s",
	} {
		if got := Per(w); got != want {
			t.Errorf("Per(%v) = %q, want %q", w, got, want)
		}
	}
}

// Last month's report is last month's, its rows' today and this month
// are still today's and this month's.
func TestReportOfAPastWindowKeepsTodayAndMonthAsOfNow(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: monthStart.Add(-10 * 24 * time.Hour)} // Nov 21
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now}
	charge := func(at time.Time) {
		c.t = at
		s, cost := settled("m1", 0, 1_000_000)
		l.Charged(ctx, "acme", s, cost, true)
	}
	charge(monthStart.Add(-10 * 24 * time.Hour))
	charge(monthStart.Add(-time.Minute))   // Nov 30 23:59: last month's last hour
	charge(monthStart)                     // Dec 1 00:00: not last month's
	charge(monthStart.Add(33 * time.Hour)) // Dec 2 09:00: today
	now := monthStart.Add(33*time.Hour + 30*time.Minute)
	rep, err := l.Report(ctx, Query{Since: monthStart.AddDate(0, -1, 0), Until: monthStart, Now: now, By: []Dimension{ByTenant}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 || rep.Rows[0].Window.Requests != 2 || rep.Rows[0].Today.Requests != 1 || rep.Rows[0].Month.Requests != 2 ||
		rep.Total.Requests != 2 || len(rep.Hours) != 30*24 {
		t.Errorf("last month: rows %+v total %+v, %d hours", rep.Rows, rep.Total, len(rep.Hours))
	}
}

// The CSV is the page's rows: a header, the key's name and owner beside
// its id, exact decimal amounts, RFC 4180 quoting, and no cell a
// spreadsheet would run as a formula.
func TestCSV(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: monthStart.Add(5 * time.Hour)}
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now, KeyInfo: func(id string) (string, string) {
		return map[string][2]string{"key-a": {"search, \"prod\"", "alice"}}[id][0], map[string][2]string{"key-a": {"", "alice"}}[id][1]
	}}
	l.Charged(ctx, "acme", &request.Settlement{Principal: "key-a", Model: "=HYPERLINK(\"x\")"}, ratelimit.Cost{Requests: 1}, true)
	s, cost := settled("m1", 1000, 2000)
	l.Charged(ctx, "acme", s, cost, true)
	w := httptest.NewRecorder()
	Handler(l).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/spend?format=csv&range=today&by=tenant,key,model", nil))
	body := w.Body.String()
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/csv") || !strings.Contains(body, "\r\n") {
		t.Fatalf("csv: %d %q\n%s", w.Code, w.Header(), body)
	}
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"tenant", "key", "key_name", "key_owner", "model", "currency", "cost", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "cost_today", "cost_this_month"},
		{"acme", "key-a", `search, "prod"`, "alice", "m1", "USD", "0.005", "1", "1000", "0", "2000", "0.005", "0.005"},
		{"acme", "key-a", `search, "prod"`, "alice", `'=HYPERLINK("x")`, "USD", "0", "1", "0", "0", "0", "0", "0"},
	}
	if len(recs) != len(want) || strings.Join(recs[0], ",") != strings.Join(want[0], ",") ||
		strings.Join(recs[1], "|") != strings.Join(want[1], "|") || strings.Join(recs[2], "|") != strings.Join(want[2], "|") {
		t.Errorf("csv:\n%s\nwant %q", body, want)
	}
	for _, bad := range []string{"/debug/spend?format=xml", "/debug/spend?range=year"} {
		w := httptest.NewRecorder()
		Handler(l).ServeHTTP(w, httptest.NewRequest(http.MethodGet, bad, nil))
		if w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, w.Code)
		}
	}
}

// The page says money in the currency with its symbol, budgets in their
// unit and window as a person says them, and links its picks and exports
// with the grouping kept.
func TestPageSpeaksMoney(t *testing.T) {
	c := &clock{t: monthStart.Add(5 * time.Hour)}
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now}
	s, cost := settled("m1", 100, 50)
	l.Charged(context.Background(), "acme", s, cost, true)
	l.Reserved("acme", []ratelimit.State{{Limit: ratelimit.Limit{Name: "usd-day", Key: "tenant=acme", Unit: ratelimit.Money,
		Amount: 10_000_000_000, Window: 24 * time.Hour}, Remaining: 250_000_000, Reset: time.Hour}})
	w := httptest.NewRecorder()
	Handler(l).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/spend?range=this-month&by=tenant,key", nil))
	body := w.Body.String()
	for _, want := range []string{"$0.00025", "$0.01", "per day", "$0.0002", // 100 × $1/M + 50 × $2/M
		`href="?by=tenant%2Ckey&amp;format=csv&amp;range=this-month"`, `href="?by=tenant%2Ckey&amp;range=last-month"`,
		`class="on" aria-current="true">this month`} {
		if !strings.Contains(body, want) {
			t.Errorf("page has no %s", want)
		}
	}
	for _, not := range []string{"250000000", "24h0m0s"} {
		if strings.Contains(body, not) {
			t.Errorf("page shows %s", not)
		}
	}
}
