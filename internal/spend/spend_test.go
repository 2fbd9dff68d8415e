package spend

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// clock is a virtual clock the tests set by hand.
type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

var (
	// monthStart is midnight UTC on the first of a month.
	monthStart = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	prices     = func() *price.Table {
		t := &price.Table{Currency: "USD"}
		t.Add("m1", price.Price{Input: 1_000_000, CachedInput: 100_000, Output: 2_000_000}, nil) // $1, $0.10, $2 per million
		t.Add("m2", price.Price{Input: 3_000_000, Output: 15_000_000}, map[string]price.Price{"cheap": {Input: 1, Output: 1}})
		return t
	}()
)

func settled(model string, prompt, completion int) (*request.Settlement, ratelimit.Cost) {
	return &request.Settlement{Principal: "key-a", Model: model, Pool: "p"},
		ratelimit.Cost{Requests: 1, InputTokens: int64(prompt), OutputTokens: int64(completion)}
}

// A charge lands in the hour of the settlement, and today and this month
// are calendar UTC: a second before midnight is yesterday and last month.
func TestReportBucketsAtMidnightAndMonthEdge(t *testing.T) {
	ctx := context.Background()
	c := &clock{}
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now}
	charge := func(at time.Time, prompt, completion int) {
		c.t = at
		s, cost := settled("m1", prompt, completion)
		l.Charged(ctx, "acme", s, cost, true)
	}
	charge(monthStart.Add(-25*time.Hour), 1_000_000, 0)    // Nov 29 23:00: outside a 24 h window
	charge(monthStart.Add(-time.Nanosecond), 1_000_000, 0) // Nov 30 23:59:59.999999999
	charge(monthStart, 0, 1_000_000)                       // Dec 1 00:00
	charge(monthStart.Add(59*time.Minute), 0, 1_000_000)   // the same hour
	c.t = monthStart.Add(90 * time.Minute)
	rep, err := l.Report(ctx, Query{Since: c.t.Add(-24 * time.Hour), Until: c.t, By: []Dimension{ByTenant, ByModel}})
	if err != nil {
		t.Fatal(err)
	}
	const dollar = 1_000_000_000_000
	want := []Row{{Key: Key{Tenant: "acme", Model: "m1"},
		Window: Amount{Requests: 3, InputTokens: 1_000_000, OutputTokens: 2_000_000, Cost: 5 * dollar},
		Today:  Amount{Requests: 2, OutputTokens: 2_000_000, Cost: 4 * dollar},
		Month:  Amount{Requests: 2, OutputTokens: 2_000_000, Cost: 4 * dollar}}}
	if !reflect.DeepEqual(want, rep.Rows) {
		t.Errorf("rows %+v, want %+v", rep.Rows, want)
	}
	if len(rep.Hours) != 25 || !rep.Hours[0].Hour.Equal(monthStart.Add(-23*time.Hour)) {
		t.Fatalf("hours: %d from %v, want 25 from Nov 30 01:00", len(rep.Hours), rep.Hours[0].Hour)
	}
	if got := rep.Hours[22].Cost; got != dollar { // Nov 30 23:00
		t.Errorf("Nov 30 23:00 cost %d, want $1", got)
	}
	if got := rep.Hours[23].Cost; got != 4*dollar { // Dec 1 00:00
		t.Errorf("Dec 1 00:00 cost %d, want $4", got)
	}
	if rep.Total != want[0].Window {
		t.Errorf("total %+v, want %+v", rep.Total, want[0].Window)
	}
	// A week's window: the Nov 29 charge too, still not this month's.
	rep, _ = l.Report(ctx, Query{Since: c.t.Add(-7 * 24 * time.Hour), Until: c.t, By: []Dimension{ByTenant}})
	if got := rep.Rows[0]; got.Window.Requests != 4 || got.Month.Requests != 2 || got.Window.Cost != 6*dollar {
		t.Errorf("a week: %+v", got)
	}
}

// The month's spend reaches back to the first of the month even when the
// window is shorter.
func TestReportMonthBeyondTheWindow(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: monthStart.Add(time.Hour)}
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now}
	s, cost := settled("m1", 0, 1_000_000)
	l.Charged(ctx, "acme", s, cost, true)
	c.t = monthStart.Add(10 * 24 * time.Hour)
	rep, _ := l.Report(ctx, Query{Since: c.t.Add(-time.Hour), Until: c.t, By: []Dimension{ByTenant}})
	if len(rep.Rows) != 1 || rep.Rows[0].Window != (Amount{}) || rep.Rows[0].Month.Requests != 1 || rep.Total != (Amount{}) {
		t.Errorf("rows %+v total %+v: want the month's request, nothing in the window", rep.Rows, rep.Total)
	}
}

// A charge proved by the pool's usage prices its cached input as cached; a
// reservation kept is all uncached input; the pool's price applies; what a
// money budget charged is the cost as it stands.
func TestChargedPricesWhatTheLimiterCharged(t *testing.T) {
	for name, c := range map[string]struct {
		s      request.Settlement
		cost   ratelimit.Cost
		proved bool
		want   Amount
	}{
		"proved, cached": {s: request.Settlement{Model: "m1", CachedTokens: 400_000}, proved: true,
			cost: ratelimit.Cost{Requests: 1, InputTokens: 1_000_000, OutputTokens: 500_000},
			want: Amount{Requests: 1, InputTokens: 1_000_000, CachedTokens: 400_000, OutputTokens: 500_000,
				Cost: 600_000*1_000_000 + 400_000*100_000 + 500_000*2_000_000}},
		"kept: the cache is not proved": {s: request.Settlement{Model: "m1", CachedTokens: 400_000},
			cost: ratelimit.Cost{Requests: 1, InputTokens: 1_000_000, OutputTokens: 500_000},
			want: Amount{Requests: 1, InputTokens: 1_000_000, OutputTokens: 500_000, Cost: 1_000_000*1_000_000 + 500_000*2_000_000}},
		"the pool's price": {s: request.Settlement{Model: "m2", Pool: "cheap"}, proved: true,
			cost: ratelimit.Cost{Requests: 1, InputTokens: 10, OutputTokens: 5},
			want: Amount{Requests: 1, InputTokens: 10, OutputTokens: 5, Cost: 15}},
		"no price: counted, at no cost": {s: request.Settlement{Model: "unpriced"}, proved: true,
			cost: ratelimit.Cost{Requests: 1, InputTokens: 10, OutputTokens: 5},
			want: Amount{Requests: 1, InputTokens: 10, OutputTokens: 5}},
		"a money budget's own charge: the worst case it kept": {s: request.Settlement{Model: "m1"},
			cost: ratelimit.Cost{Requests: 1, InputTokens: 1_000, OutputTokens: 500, Money: 7_777_777},
			want: Amount{Requests: 1, InputTokens: 1_000, OutputTokens: 500, Cost: 7_777_777}},
		"cached beyond the input is held to it": {s: request.Settlement{Model: "m1", CachedTokens: 50}, proved: true,
			cost: ratelimit.Cost{Requests: 1, InputTokens: 10},
			want: Amount{Requests: 1, InputTokens: 10, CachedTokens: 10, Cost: 10 * 100_000}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := amountOf(&c.s, c.cost, c.proved, prices); got != c.want {
				t.Errorf("amountOf = %+v, want %+v", got, c.want)
			}
		})
	}
}

// A bucket holds at most Shares.Total keys; the rest folds into OtherKey, and a
// key it holds keeps counting once it is full.
func TestMemoryCapsTheKeysOfABucket(t *testing.T) {
	ctx := context.Background()
	m := &Memory{Shares: Shares{Total: 3}}
	one := Amount{Requests: 1, Cost: 7}
	for _, model := range []string{"a", "b", "c", "d", "e", "a"} {
		if err := m.Add(ctx, 100, Key{Tenant: "t", Model: model}, one); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := m.Hours(ctx, 100, 100)
	want := Bucket{
		{Tenant: "t", Model: "a"}: {Requests: 2, Cost: 14},
		{Tenant: "t", Model: "b"}: one,
		{Tenant: "t", Model: "c"}: one,
		OtherKey:                  {Requests: 2, Cost: 14},
	}
	if !reflect.DeepEqual(want, got[100]) {
		t.Errorf("bucket %v, want %v", got[100], want)
	}
}

// Buckets older than Retention are dropped as newer hours arrive.
func TestMemoryRetention(t *testing.T) {
	ctx := context.Background()
	m := &Memory{}
	hours := int64(Retention / time.Hour)
	m.Add(ctx, 1000, Key{Tenant: "old"}, Amount{Requests: 1})
	m.Add(ctx, 1000+hours, Key{Tenant: "new"}, Amount{Requests: 1})
	m.Add(ctx, 999, Key{Tenant: "late"}, Amount{Requests: 1}) // past retention already
	got, _ := m.Hours(ctx, 0, 1<<40)
	if len(got) != 1 || got[1000+hours] == nil {
		t.Errorf("buckets %v, want only hour %d", got, 1000+hours)
	}
}

// What a client chooses (a model name) is bounded before it is stored.
func TestKeyBounded(t *testing.T) {
	k := Key{Tenant: "acme", Model: strings.Repeat("é", 100) + "\x1f\n"}.Bounded()
	if len(k.Model) > MaxField || strings.ContainsAny(k.Model, "\x1f\x1e\n") || !strings.HasPrefix(k.Model, "éé") {
		t.Errorf("bounded model %q (%d bytes)", k.Model, len(k.Model))
	}
	if k := (Key{Model: "ok\x1fx\xff"}).Bounded(); k.Model != "ok?x?" {
		t.Errorf("bounded %q, want ok?x?", k.Model)
	}
}

// Top models are the most costly, at most TopN.
func TestTopModels(t *testing.T) {
	b := Bucket{}
	for i := range TopN + 5 {
		b[Key{Tenant: "t", Model: string(rune('a' + i))}] = Amount{Requests: 1, Cost: int64(i)}
	}
	now := HourTime(10).Add(time.Minute)
	rep := Build(Query{Since: now.Add(-time.Hour), Until: now}, map[int64]Bucket{10: b})
	if len(rep.TopModels) != TopN || rep.TopModels[0].Model != string(rune('a'+TopN+4)) {
		t.Errorf("top models %+v", rep.TopModels)
	}
	if len(rep.Rows) != 1 || rep.Rows[0].Window.Requests != TopN+5 {
		t.Errorf("no dimensions: one row, the total; got %+v", rep.Rows)
	}
}

func TestParseQuery(t *testing.T) {
	for _, bad := range []string{"0s", "-1h", "63d", "x", ""} {
		if _, err := ParseSince(bad); err == nil {
			t.Errorf("ParseSince(%q) accepted", bad)
		}
	}
	if d, err := ParseSince("7d"); err != nil || d != 7*24*time.Hour {
		t.Errorf("ParseSince(7d) = %v, %v", d, err)
	}
	if by, err := ParseBy("model, tenant,model"); err != nil || !reflect.DeepEqual(by, []Dimension{ByTenant, ByModel}) {
		t.Errorf("ParseBy = %v, %v", by, err)
	}
	if _, err := ParseBy("tenant,pool"); err == nil {
		t.Error("ParseBy accepted pool")
	}
}

// The page and its JSON report the same ledger; a bad query is a 400.
func TestHandler(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: monthStart.Add(5 * time.Hour)}
	l := &Ledger{Store: &Memory{}, Prices: prices, Now: c.Now}
	s, cost := settled("m1", 1000, 2000)
	l.Charged(ctx, "acme", s, cost, true)
	h := Handler(l)
	get := func(url string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
		return w
	}
	w := get("/debug/spend?format=json&since=24h&by=tenant,key,model")
	var rep Report
	if err := json.Unmarshal(w.Body.Bytes(), &rep); w.Code != 200 || err != nil {
		t.Fatalf("json: %d %v %s", w.Code, err, w.Body)
	}
	want := Row{Key: Key{Tenant: "acme", KeyID: "key-a", Model: "m1"},
		Window: Amount{Requests: 1, InputTokens: 1000, OutputTokens: 2000, Cost: 1000*1_000_000 + 2000*2_000_000}}
	want.Today, want.Month = want.Window, want.Window
	if len(rep.Rows) != 1 || rep.Rows[0] != want || rep.Currency != "USD" {
		t.Errorf("report rows %+v currency %q, want %+v", rep.Rows, rep.Currency, want)
	}
	if !strings.Contains(w.Body.String(), `"cost": "0.005"`) {
		t.Errorf("no decimal cost in %s", w.Body)
	}
	w = get("/debug/spend")
	if body := w.Body.String(); w.Code != 200 || !strings.Contains(body, "<svg") || !strings.Contains(body, "0.005") || !strings.Contains(body, "acme") {
		t.Errorf("page: %d %s", w.Code, body)
	}
	for _, bad := range []string{"/debug/spend?since=1y", "/debug/spend?by=pool"} {
		if w := get(bad); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, w.Code)
		}
	}
}

// Budget left is the last state seen per (tenant, limit, key); once its
// window has ended, the budget is full again; a full table takes no new
// budget until one's window ends.
func TestBudgetLeft(t *testing.T) {
	c := &clock{t: monthStart.Add(30 * time.Second)}
	l := &Ledger{Store: &Memory{}, Now: c.Now}
	tpm := ratelimit.Limit{Name: "tpm", Key: "tenant=acme", Unit: ratelimit.TotalTokens, Amount: 1000, Window: time.Minute}
	l.Reserved("acme", []ratelimit.State{{Limit: tpm, Remaining: 900, Reset: 30 * time.Second}})
	l.Reserved("acme", []ratelimit.State{{Limit: tpm, Remaining: 700, Reset: 30 * time.Second}})
	rep, _ := l.Report(context.Background(), Query{Since: c.t.Add(-time.Hour), Until: c.t})
	want := BudgetLeft{Tenant: "acme", Name: "tpm", Key: "tenant=acme", Unit: "total_tokens", Amount: 1000, Window: time.Minute, Per: "per minute",
		Remaining: 700, Resets: monthStart.Add(time.Minute), Seen: c.t}
	if len(rep.Budgets) != 1 || rep.Budgets[0] != want {
		t.Errorf("budgets %+v, want %+v", rep.Budgets, want)
	}
	c.t = monthStart.Add(150 * time.Second) // two windows on
	rep, _ = l.Report(context.Background(), Query{Since: c.t.Add(-time.Hour), Until: c.t})
	want.Remaining, want.Resets = 1000, monthStart.Add(3*time.Minute)
	if len(rep.Budgets) != 1 || rep.Budgets[0] != want {
		t.Errorf("after its window: budgets %+v, want %+v", rep.Budgets, want)
	}

	for i := range MaxBudgets + 10 {
		l.Reserved("t", []ratelimit.State{{Limit: ratelimit.Limit{Name: "rpm", Key: strconv.Itoa(i), Amount: 5, Window: time.Minute},
			Remaining: 4, Reset: time.Second}})
	}
	if n := len(l.budgets.left(c.t)); n != MaxBudgets {
		t.Errorf("%d budgets remembered, want at most %d (the ended one made room)", n, MaxBudgets)
	}
}

// A report's rows are bounded: the smallest fold into one (other) row,
// and nothing is lost from the total.
func TestReportRowsBounded(t *testing.T) {
	b := Bucket{}
	for i := range MaxRows + 50 {
		b[Key{Tenant: "t", KeyID: strconv.Itoa(i)}] = Amount{Requests: 1, Cost: int64(i + 1)}
	}
	now := HourTime(10).Add(time.Minute)
	rep := Build(Query{Since: now.Add(-time.Hour), Until: now, By: []Dimension{ByTenant, ByKey}}, map[int64]Bucket{10: b})
	var sum Amount
	for _, r := range rep.Rows {
		sum = sum.Add(r.Window)
	}
	last := rep.Rows[len(rep.Rows)-1]
	if len(rep.Rows) != MaxRows || sum != rep.Total || last.Key != (Key{Tenant: Other, KeyID: Other}) || last.Window.Requests != 51 {
		t.Errorf("%d rows, last %+v, sum %+v, total %+v", len(rep.Rows), last, sum, rep.Total)
	}
}

// A store that fails loses the record, not the settlement, and the log
// says so at most every 10 s.
func TestMissedRecordsAreLoggedSparingly(t *testing.T) {
	var log strings.Builder
	c := &clock{t: monthStart}
	l := &Ledger{Store: failing{}, Now: c.Now, Log: slog.New(slog.NewTextHandler(&log, nil))}
	s, cost := settled("m1", 1, 1)
	for range 5 {
		l.Charged(context.Background(), "acme", s, cost, true)
	}
	c.t = c.t.Add(10 * time.Second)
	l.Charged(context.Background(), "acme", s, cost, true)
	if n := strings.Count(log.String(), "not recorded"); n != 2 || !strings.Contains(log.String(), "missed=5") {
		t.Errorf("log:\n%s\nwant two lines, the second counting 5", log.String())
	}
}

type failing struct{}

func (failing) Add(context.Context, int64, Key, Amount) error { return errors.New("down") }
func (failing) Hours(context.Context, int64, int64) (map[int64]Bucket, error) {
	return nil, errors.New("down")
}
