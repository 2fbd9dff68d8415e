// Package report renders an `infergate-bench bench` run (a result.Report) as a
// single self-contained HTML page: parameters, summary tables and inline SVG
// charts drawn in Go. The page loads nothing (no scripts, fonts or images
// from anywhere), so it can be attached to a CI run or mailed and still
// open offline, and it runs no JavaScript at all.
package report

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"time"

	"github.com/infergate/infergate/bench/result"
)

//go:embed page.html.tmpl
var pageSource string

var pageTemplate = template.Must(template.New("page").Parse(pageSource))

// WriteHTML writes r as an HTML page to w. Sections whose data the report
// lacks (sweep, comparison, baseline, timelines, CDFs) are left out.
func WriteHTML(w io.Writer, r *result.Report) error {
	if r == nil {
		return errors.New("report: nil report")
	}
	// Render into memory first so that a template error cannot leave half a
	// page behind in w.
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, buildPage(r)); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// page is the template's view of a report: strings already formatted,
// charts already laid out.
type page struct {
	Title    string
	Subtitle string
	Params   []kv
	Targets  []targetView
	Overview []overviewRow // one row per target, when there are several
	CDFs     []cdfPair
	Timeline []*chart
	Sweep    *sweepView
	Compare  *compareView
	Join     *joinView
	Baseline *baselineView
	Nav      []kv // section anchor → heading
}

type kv struct{ K, V string }

// palette holds the target colours: Okabe–Ito, distinguishable with the
// common forms of colour blindness and readable on white.
var palette = []string{"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"}

func targetColor(i int) string { return palette[i%len(palette)] }

// builder numbers the charts so that their title/desc ids are unique.
type builder struct {
	r      *result.Report
	charts int
}

func (b *builder) chartID() string {
	b.charts++
	return fmt.Sprintf("chart%d", b.charts)
}

func buildPage(r *result.Report) *page {
	b := &builder{r: r}
	p := &page{Title: "infergate bench report", Params: params(r)}
	p.Subtitle = subtitle(r)

	targets := r.Targets
	if len(targets) == 0 && r.Metrics.Requests.Sent > 0 {
		// A report with only the top-level metrics still has one target.
		name := "target"
		var url string
		if len(r.Parameters.Targets) > 0 {
			name, url = r.Parameters.Targets[0].Name, r.Parameters.Targets[0].URL
		}
		targets = []result.TargetResult{{Name: name, URL: url, Metrics: r.Metrics}}
	}
	for i, t := range targets {
		p.Targets = append(p.Targets, targetSummary(i, t))
	}
	if len(targets) > 1 {
		for i, t := range targets {
			p.Overview = append(p.Overview, overview(i, t))
		}
	}
	p.CDFs = b.cdfCharts(targets)
	p.Timeline = b.timelineCharts(targets)
	p.Sweep = b.sweep(r.Sweep, r.Parameters.SLO)
	p.Compare = b.compare(r.Compare, targets)
	p.Join = join(r.Join)
	p.Baseline = baseline(r.Baseline)

	p.Nav = append(p.Nav, kv{"parameters", "Parameters"})
	if len(p.Targets) > 0 {
		p.Nav = append(p.Nav, kv{"summary", "Summary"})
	}
	if len(p.CDFs) > 0 {
		p.Nav = append(p.Nav, kv{"latency", "Latency CDFs"})
	}
	if len(p.Timeline) > 0 {
		p.Nav = append(p.Nav, kv{"timeline", "Over time"})
	}
	if p.Sweep != nil {
		p.Nav = append(p.Nav, kv{"sweep", "Sweep"})
	}
	if p.Compare != nil {
		p.Nav = append(p.Nav, kv{"compare", "Overhead"})
	}
	if p.Join != nil {
		p.Nav = append(p.Nav, kv{"join", "Where the time went"})
	}
	if p.Baseline != nil {
		p.Nav = append(p.Nav, kv{"baseline", "Baseline"})
	}
	return p
}

func subtitle(r *result.Report) string {
	s := r.Tool
	if s == "" {
		s = "infergate bench"
	}
	if r.Version != "" {
		s += " " + r.Version
	}
	if !r.StartedAt.IsZero() {
		s += " · started " + r.StartedAt.UTC().Format(time.RFC3339) // UTC: the reader's zone is unknown
	}
	if r.DurationS > 0 {
		s += " · ran " + seconds(r.DurationS)
	}
	return s
}
