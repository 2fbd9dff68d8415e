package spend

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/price"
)

//go:embed page.html.tmpl
var pageSource string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"cost":   price.FormatCost,
	"n":      func(n int64) string { return strconv.FormatInt(n, 10) },
	"dash":   func(s string) string { return cmp.Or(s, "-") },
	"has":    func(by []Dimension, d string) bool { return slices.Contains(by, Dimension(d)) },
	"hour":   func(t time.Time) string { return t.UTC().Format("Jan 2 15:04") },
	"hms":    func(t time.Time) string { return t.UTC().Format("Jan 2 15:04:05") },
	"joinBy": joinBy,
}).Parse(pageSource))

// Handler serves GET /debug/spend: the ledger's report as a page, or as
// JSON with ?format=json; ?since=24h (up to 40d) and ?by=tenant,model
// (any of tenant, team, key, model) choose the window and the grouping.
func Handler(l *Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := parseQuery(r, l.now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rep, err := l.Report(r.Context(), q)
		if err != nil {
			http.Error(w, "the spend ledger cannot be read: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Get("format") == "json" {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(rep)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := page.Execute(w, pageView{Report: rep, SinceText: r.URL.Query().Get("since"), Chart: chartOf(rep.Hours)}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}

// parseQuery reads since (default 24h) and by (default tenant,model).
func parseQuery(r *http.Request, now time.Time) (Query, error) {
	v := r.URL.Query()
	since := 24 * time.Hour
	if s := v.Get("since"); s != "" {
		var err error
		if since, err = ParseSince(s); err != nil {
			return Query{}, err
		}
	}
	by := []Dimension{ByTenant, ByModel}
	if s, ok := v["by"]; ok {
		var err error
		if by, err = ParseBy(strings.Join(s, ",")); err != nil {
			return Query{}, err
		}
	}
	return Query{Since: now.Add(-since), Until: now, By: by}, nil
}

type pageView struct {
	Report
	SinceText string
	Chart     chart
}

// chart is the hourly cost as SVG bars, laid out here (the template only
// draws): Width × Height user units, a bar per hour.
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int64
	From, To      string
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

func chartOf(hours []HourSpend) chart {
	c := chart{Width: 960, Height: 160}
	if len(hours) == 0 {
		return c
	}
	for _, h := range hours {
		c.Max = max(c.Max, h.Cost)
	}
	w := float64(c.Width) / float64(len(hours))
	for i, h := range hours {
		height := 0.0
		if c.Max > 0 {
			height = float64(c.Height) * float64(h.Cost) / float64(c.Max)
		}
		c.Bars = append(c.Bars, bar{X: float64(i) * w, Y: float64(c.Height) - height, W: max(w-1, 1), H: height,
			Title: h.Hour.Format("Jan 2 15:04") + " UTC: " + price.FormatCost(h.Cost) + ", " +
				strconv.FormatInt(h.Requests, 10) + " requests"})
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
