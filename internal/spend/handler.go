package spend

import (
	"cmp"
	_ "embed"
	"encoding/csv"
	"encoding/json"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
)

//go:embed page.html.tmpl
var pageSource string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"exact":  price.FormatCost,
	"n":      func(n int64) string { return thousands(n) },
	"dash":   func(s string) string { return cmp.Or(s, "-") },
	"has":    func(by []Dimension, d string) bool { return slices.Contains(by, Dimension(d)) },
	"hour":   func(t time.Time) string { return t.UTC().Format("Jan 2 15:04") },
	"hms":    func(t time.Time) string { return t.UTC().Format("Jan 2 15:04:05") },
	"date":   func(t time.Time) string { return t.UTC().Format(time.DateOnly) },
	"per":    Per,
	"joinBy": joinBy,
	"labelCols": func(by []Dimension) int {
		if slices.Contains(by, ByKey) {
			return len(by) + 2 // the key's name and owner
		}
		return len(by)
	},
}).Parse(pageSource))

// Handler serves GET /debug/spend: the ledger's report as a page, or with
// ?format=json or ?format=csv the same as JSON or CSV (WriteCSV). The
// window is ParseWindow's (range, from/to or since; default the last 24
// hours), the grouping ?by=tenant,model (any of tenant, team, key, model).
func Handler(l *Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := l.now()
		win, by, err := parseQuery(r.URL.Query(), now)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rep, err := l.Report(r.Context(), Query{Since: win.Since, Until: win.Until, Now: now, By: by})
		if err != nil {
			http.Error(w, "the spend ledger cannot be read: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch f := r.URL.Query().Get("format"); f {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(rep)
		case "csv":
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
			w.Header().Set("Content-Disposition", `attachment; filename="spend-`+rep.Since.Format("20060102T15")+"-"+
				rep.Until.Format("20060102T1504")+`.csv"`)
			WriteCSV(w, rep)
		case "", "html":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			if err := page.Execute(w, newPageView(rep, win, now)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		default:
			http.Error(w, "format: "+strconv.Quote(f)+" is not one of html, json, csv", http.StatusBadRequest)
		}
	})
}

// parseQuery reads the window (ParseWindow) and by (default tenant,model).
func parseQuery(v url.Values, now time.Time) (Window, []Dimension, error) {
	win, err := ParseWindow(v, now)
	if err != nil {
		return Window{}, nil, err
	}
	by := []Dimension{ByTenant, ByModel}
	if s, ok := v["by"]; ok {
		if by, err = ParseBy(strings.Join(s, ",")); err != nil {
			return Window{}, nil, err
		}
	}
	return win, by, nil
}

// CSVHeader is the columns WriteCSV writes after the report's dimensions
// (and, grouped by key, the key's name and owner).
var CSVHeader = []string{"currency", "cost", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "cost_today", "cost_this_month"}

// WriteCSV writes rep's rows as CSV (RFC 4180: CRLF, quoted as needed): a
// header row, then a row per group; amounts are exact decimals of the
// currency. The total is not a row (a spreadsheet's sum would count it
// twice): it is the JSON's.
func WriteCSV(w io.Writer, rep Report) error {
	c := csv.NewWriter(w)
	c.UseCRLF = true
	head := []string{}
	for _, d := range rep.By {
		head = append(head, string(d))
		if d == ByKey {
			head = append(head, "key_name", "key_owner")
		}
	}
	c.Write(append(head, CSVHeader...))
	for _, r := range rep.Rows {
		rec := []string{}
		for _, d := range rep.By {
			rec = append(rec, cell(r.Field(d)))
			if d == ByKey {
				rec = append(rec, cell(r.KeyName), cell(r.KeyOwner))
			}
		}
		a := r.Window
		c.Write(append(rec, rep.Currency, price.FormatCost(a.Cost), strconv.FormatInt(a.Requests, 10),
			strconv.FormatInt(a.InputTokens, 10), strconv.FormatInt(a.CachedTokens, 10), strconv.FormatInt(a.OutputTokens, 10),
			price.FormatCost(r.Today.Cost), price.FormatCost(r.Month.Cost)))
	}
	c.Flush()
	return c.Error()
}

// cell is a text field as a spreadsheet may read it: one that would start
// a formula (=, +, -, @; a model name is the client's to choose) gets a
// leading apostrophe.
func cell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// Field is k's value of dimension d.
func (k Key) Field(d Dimension) string {
	switch d {
	case ByTenant:
		return k.Tenant
	case ByTeam:
		return k.Team
	case ByKey:
		return k.KeyID
	case ByModel:
		return k.Model
	}
	return ""
}

// pageView is what the page template draws.
type pageView struct {
	Report
	Chart chart
	// From and To are the window's first and last day, for the date
	// inputs; Range the pick it was asked as, if one.
	From, To, Range string
	Picks           []link
	CSV, JSON       string
	Live            bool // the window ends now
}

type link struct {
	Label, URL string
	Active     bool
}

func newPageView(rep Report, win Window, now time.Time) pageView {
	v := pageView{Report: rep, Chart: chartOf(rep.Hours, rep.Currency), From: rep.Since.Format(time.DateOnly),
		To: rep.Until.Add(-time.Nanosecond).Format(time.DateOnly), Range: win.Values.Get("range"), Live: !rep.Until.Before(now)}
	by := joinBy(rep.By)
	with := func(q url.Values, extra ...string) string {
		q = cloneValues(q)
		q.Set("by", by)
		for i := 0; i+1 < len(extra); i += 2 {
			q.Set(extra[i], extra[i+1])
		}
		return "?" + q.Encode()
	}
	for _, p := range Picks {
		v.Picks = append(v.Picks, link{Label: p.Label, URL: with(url.Values{"range": {p.Name}}), Active: p.Name == v.Range})
	}
	v.CSV, v.JSON = with(win.Values, "format", "csv"), with(win.Values, "format", "json")
	return v
}

func cloneValues(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}

// Money is pico as a person reads it, in the report's currency.
func (v pageView) Money(pico int64) string { return price.Money(pico, v.Currency) }

// Left is a budget's amount in its unit: money in the currency, else a
// count ("12,840,000 tokens").
func (v pageView) Left(n int64, unit string) string {
	switch ratelimit.Unit(unit) {
	case ratelimit.Money:
		return v.Money(n)
	case ratelimit.Requests:
		return thousands(n) + " requests"
	case ratelimit.InputTokens:
		return thousands(n) + " input tokens"
	case ratelimit.OutputTokens:
		return thousands(n) + " output tokens"
	case ratelimit.TotalTokens:
		return thousands(n) + " tokens"
	}
	return thousands(n) + " " + unit
}

// Percent is what part of amount n is, in whole percent, for a bar.
func (v pageView) Percent(n, amount int64) int {
	if amount <= 0 || n <= 0 {
		return 0
	}
	return int(min(100, float64(n)/float64(amount)*100+0.5))
}

// thousands writes n with its thousands separated: 12,840,000.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// chart is the hourly cost as SVG bars, laid out here (the template only
// draws): Width × Height user units, a bar per hour.
type chart struct {
	Width, Height int
	Bars          []bar
	Peak          string
	From, To      string
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

func chartOf(hours []HourSpend, currency string) chart {
	c := chart{Width: 960, Height: 160}
	if len(hours) == 0 {
		return c
	}
	var peak int64
	for _, h := range hours {
		peak = max(peak, h.Cost)
	}
	c.Peak = price.Money(peak, currency)
	w := float64(c.Width) / float64(len(hours))
	for i, h := range hours {
		height := 0.0
		if peak > 0 {
			height = float64(c.Height) * float64(h.Cost) / float64(peak)
		}
		c.Bars = append(c.Bars, bar{X: float64(i) * w, Y: float64(c.Height) - height, W: max(w-1, 1), H: height,
			Title: h.Hour.Format("Jan 2 15:04") + " UTC: " + price.Money(h.Cost, currency) + ", " +
				thousands(h.Requests) + " requests"})
	}
	c.From, c.To = hours[0].Hour.Format("Jan 2 15:04"), hours[len(hours)-1].Hour.Format("Jan 2 15:04")
	return c
}

func joinBy(by []Dimension) string {
	s := make([]string, len(by))
	for i, d := range by {
		s[i] = string(d)
	}
	return strings.Join(s, ",")
}
