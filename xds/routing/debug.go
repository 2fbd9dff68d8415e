package routing

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/infergate/infergate/internal/stats"
	"github.com/infergate/infergate/xds/controller"
)

// The controller's page (/debug/controller on the admin port).

var debugPage = template.Must(template.New("controller").Funcs(template.FuncMap{
	"ms":  func(d time.Duration) string { return fmt.Sprintf("%.1f ms", stats.Ms(d)) },
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"sorted": func(m map[string]uint32) []string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return keys
	},
}).Parse(`<!doctype html><html><head><meta charset="utf-8"><title>infergate controller</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:600}.ok{color:#070}</style></head><body>
<h1>SLA controller</h1>
{{range $m := .}}<h2>{{.Name}}</h2>
<p>SLA: excess TTFT p95 &le; {{ms .SLA.TTFTP95}}, ITL p95 &le; {{ms .SLA.ITLP95}}, error rate &le; {{pct .SLA.ErrorRate}}, queue depth &le; {{.SLA.QueueDepth}} (0 = off)</p>
<table><tr><th class="l">pool</th><th>weight</th><th>samples</th><th>excess TTFT p95</th><th>TTFT p95</th><th>ITL p95</th><th>errors</th><th>queue</th><th>KV cache</th><th>slope/token</th><th class="l">state</th></tr>
{{$pools := .Pools}}{{range $p := sorted .Weights}}{{$s := index $pools $p}}<tr><td class="l">{{$p}}</td><td>{{index $m.Weights $p}}</td>
<td>{{$s.Samples}}</td><td>{{ms $s.ExcessTTFTP95}}</td><td>{{ms $s.TTFTP95}}</td><td>{{ms $s.ITLP95}}</td><td>{{pct $s.ErrorRate}}</td><td>{{if ge $s.QueueDepth 0.0}}{{$s.QueueDepth}}{{else}}-{{end}}</td><td>{{if ge $s.KVCacheUsage 0.0}}{{pct $s.KVCacheUsage}}{{else}}-{{end}}</td><td>{{ms $s.Slope}}</td>
<td class="l {{if $s.Breached}}bad{{else if $s.Healthy}}ok{{end}}">{{if $s.Breached}}breached{{else if $s.Healthy}}healthy{{else}}unknown{{end}} {{$s.Why}}</td></tr>{{end}}</table>
<table><tr><th class="l">time</th><th class="l">weights</th><th class="l">why</th></tr>
{{range .History}}<tr><td class="l">{{.At.Format "15:04:05"}}</td><td class="l">{{.From}} &rarr; {{.To}}</td><td class="l">{{.Reason}}</td></tr>{{else}}<tr><td class="l" colspan="3">no changes yet</td></tr>{{end}}</table>
{{else}}<p>No virtual models configured.</p>{{end}}</body></html>`))

// debugHandler renders /debug/controller; ?format=json gives the same
// state as JSON (durations in nanoseconds).
// Safe on a nil Service (no virtual models).
func (r *Service) DebugHandler(w http.ResponseWriter, req *http.Request) {
	states := []controller.ModelState{}
	if r != nil {
		states = r.ctrl.State()
	}
	if req.URL.Query().Get("format") == "json" {
		w.Header().Set("content-type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(states)
		return
	}
	w.Header().Set("content-type", "text/html; charset=utf-8")
	if err := debugPage.Execute(w, states); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
