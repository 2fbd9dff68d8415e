package requestlog

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

//go:embed page.html.tmpl
var pageSource string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"ms":  func(d time.Duration) string { return strconv.FormatFloat(stats.Ms(d), 'f', 1, 64) },
	"f1":  func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"pct": func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "%" },
	"hms": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Format("15:04:05.000")
	},
	"statusClass": func(code int) string {
		switch {
		case code >= 500 || code == 0:
			return "s5"
		case code >= 400:
			return "s4"
		}
		return "s2"
	},
	"join": strings.Join,
}).Parse(pageSource))

// maxList bounds how many requests the list page shows.
const maxList = 200

// Handler serves the pages. traceURL, if set, links trace ids (its
// "{trace_id}" is replaced).
func Handler(r *Ring, traceURL string) http.Handler {
	h := &handler{ring: r, traceURL: traceURL}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/requests", h.list)
	mux.HandleFunc("GET /debug/requests/{id}", h.detail)
	return mux
}

type handler struct {
	ring     *Ring
	traceURL string
}

type listView struct {
	Filter   Filter
	SlowMs   string
	Requests []request.Stamp
	Shown    int
	Matched  int
	TraceURL func(string) string
}

type detailView struct {
	Stamp    request.Stamp
	Phases   []Phase
	Bins     []Bin
	BinsTo   float64
	TraceURL func(string) string
}

func (h *handler) link(traceID string) string {
	if h.traceURL == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(h.traceURL, "{trace_id}", traceID)
}

func (h *handler) list(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	f := Filter{Model: q.Get("model"), Pool: q.Get("pool"), Tenant: q.Get("tenant"),
		Decision: q.Get("decision"), Status: q.Get("status")}
	if v := q.Get("slow_ms"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0 {
			http.Error(w, "slow_ms must be a non-negative number of milliseconds", http.StatusBadRequest)
			return
		}
		f.Slow = time.Duration(n * float64(time.Millisecond))
	}
	matched := h.ring.Recent(f.Match)
	if q.Get("format") == "json" {
		out := make([]Record, len(matched))
		for i := range matched {
			out[i] = NewRecord(&matched[i], false)
		}
		writeJSON(w, out)
		return
	}
	view := listView{Filter: f, SlowMs: q.Get("slow_ms"), Matched: len(matched), TraceURL: h.link}
	view.Requests = matched[:min(len(matched), maxList)]
	view.Shown = len(view.Requests)
	render(w, "list", view)
}

func (h *handler) detail(w http.ResponseWriter, req *http.Request) {
	s, ok := h.ring.Find(req.PathValue("id"))
	if !ok {
		http.Error(w, "no such request among the recent ones", http.StatusNotFound)
		return
	}
	if req.URL.Query().Get("format") == "json" {
		writeJSON(w, NewRecord(&s, true))
		return
	}
	view := detailView{Stamp: s, Phases: Phases(&s), Bins: Histogram(s.Gaps, 24), TraceURL: h.link}
	if n := len(view.Bins); n > 0 {
		view.BinsTo = view.Bins[n-1].ToMs
	}
	render(w, "detail", view)
}

func render(w http.ResponseWriter, name string, view any) {
	w.Header().Set("content-type", "text/html; charset=utf-8")
	if err := page.ExecuteTemplate(w, name, view); err != nil {
		http.Error(w, fmt.Sprintf("rendering %s: %v", name, err), http.StatusInternalServerError)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("content-type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
