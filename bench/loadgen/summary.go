package loadgen

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/infergate/infergate/bench/result"
)

// WriteReport writes r for a terminal: the targets side by side (one row
// per metric, one column per target and, for exactly two targets, a
// "delta" column, second minus first), then the paired comparison, the
// sweep and the baseline check, when present. A "-" marks a metric with no
// data (every request failed).
func WriteReport(w io.Writer, r *result.Report) {
	if r.Sweep != nil {
		writeSweep(w, r)
	} else {
		writeTargets(w, r)
	}
	if r.Compare != nil {
		writeCompare(w, r.Compare)
	}
	if r.Join != nil {
		writeJoin(w, r.Join)
	}
	if r.Baseline != nil {
		writeBaseline(w, r.Baseline)
	}
}

type row struct {
	label string
	cell  func(m *result.Metrics) (float64, bool)
	fmt   func(v float64, signed bool) string
}

func fmtMs(v float64, signed bool) string   { return num(v, 2, signed) + "ms" }
func fmtRate(v float64, signed bool) string { return num(v, 1, signed) }
func fmtInt(v float64, signed bool) string  { return num(v, 0, signed) }

func dist(label string, pick func(*result.Metrics) *result.Dist, at func(*result.Dist) float64) row {
	return row{label, func(m *result.Metrics) (float64, bool) { d := pick(m); return at(d), d.N > 0 }, fmtMs}
}

func always(label string, get func(*result.Metrics) float64, f func(float64, bool) string) row {
	return row{label, func(m *result.Metrics) (float64, bool) { return get(m), true }, f}
}

func writeTargets(w io.Writer, r *result.Report) {
	ttft := func(m *result.Metrics) *result.Dist { return &m.TTFTMs }
	itl := func(m *result.Metrics) *result.Dist { return &m.ITLMs }
	tpot := func(m *result.Metrics) *result.Dist { return &m.TPOTMs }
	e2e := func(m *result.Metrics) *result.Dist { return &m.E2EMs }
	p50 := func(d *result.Dist) float64 { return d.P50 }
	p90 := func(d *result.Dist) float64 { return d.P90 }
	p99 := func(d *result.Dist) float64 { return d.P99 }
	p999 := func(d *result.Dist) float64 { return d.P999 }
	rows := []row{
		dist("TTFT p50", ttft, p50), dist("TTFT p90", ttft, p90), dist("TTFT p99", ttft, p99), dist("TTFT p99.9", ttft, p999),
		dist("ITL p50", itl, p50), dist("ITL p99", itl, p99),
		dist("TPOT p50", tpot, p50), dist("TPOT p99", tpot, p99),
		dist("E2E p50", e2e, p50), dist("E2E p99", e2e, p99),
		dist("max stall p99", func(m *result.Metrics) *result.Dist { return &m.MaxStallMs }, p99),
	}
	if r.Parameters.Mode == "open" || lagNotable(r.Targets) {
		rows = append(rows,
			dist("TTFT p99 (from intended)", func(m *result.Metrics) *result.Dist { return &m.TTFTIntendedMs }, p99),
			dist("E2E p99 (from intended)", func(m *result.Metrics) *result.Dist { return &m.E2EIntendedMs }, p99),
			dist("schedule lag p99", func(m *result.Metrics) *result.Dist { return &m.ScheduleLagMs }, p99))
	}
	if r.Parameters.Mode == "open" {
		rows = append(rows, always("sent req/s (asked "+num(r.Parameters.RatePerS, 1, false)+")",
			func(m *result.Metrics) float64 { return m.Throughput.SentPerS }, fmtRate))
	}
	tokens := always("output tok/s", func(m *result.Metrics) float64 { return m.Throughput.OutputTokensPerS }, fmtRate)
	if !slices.ContainsFunc(r.Targets, func(t result.TargetResult) bool { return t.Metrics.OutputTokens > 0 }) {
		// Embeddings: no tokens out, the prompt tokens are the work.
		tokens = always("input tok/s", func(m *result.Metrics) float64 { return m.Throughput.TotalTokensPerS }, fmtRate)
	}
	rows = append(rows,
		always("req/s", func(m *result.Metrics) float64 { return m.Throughput.RequestsPerS }, fmtRate),
		tokens,
		always("peak in flight", func(m *result.Metrics) float64 { return float64(m.Throughput.PeakConcurrency) }, fmtInt))
	slo := r.Parameters.SLO
	if slo.TTFTMs > 0 || slo.ITLMs > 0 || slo.E2EMs > 0 {
		rows = append(rows,
			always("goodput req/s", func(m *result.Metrics) float64 { return m.Goodput.RequestsPerS }, fmtRate),
			always("goodput %", func(m *result.Metrics) float64 { return 100 * m.Goodput.Fraction }, fmtRate))
	}

	delta := len(r.Targets) == 2
	header := []string{"metric"}
	for _, t := range r.Targets {
		header = append(header, t.Name)
	}
	if delta {
		header = append(header, "delta")
	}
	table := [][]string{header}
	for _, rw := range rows {
		line := []string{rw.label}
		var vals [2]float64
		var have [2]bool
		for i := range r.Targets {
			v, ok := rw.cell(&r.Targets[i].Metrics)
			if i < 2 {
				vals[i], have[i] = v, ok
			}
			if !ok {
				line = append(line, "-")
				continue
			}
			line = append(line, rw.fmt(v, false))
		}
		if delta {
			d := "-"
			if have[0] && have[1] {
				d = rw.fmt(vals[1]-vals[0], true)
			}
			line = append(line, d)
		}
		table = append(table, line)
	}
	errRow := []string{"errors"}
	for _, t := range r.Targets {
		errRow = append(errRow, fmt.Sprintf("%d/%d", t.Metrics.Requests.Failed, t.Metrics.Requests.Sent))
	}
	if delta {
		errRow = append(errRow, fmt.Sprintf("%+d", r.Targets[1].Metrics.Requests.Failed-r.Targets[0].Metrics.Requests.Failed))
	}
	table = append(table, errRow)
	writeAligned(w, table)

	for _, t := range r.Targets {
		e := t.Metrics.Errors
		for _, class := range slices.Sorted(maps.Keys(e.ByClass)) {
			fmt.Fprintf(w, "  %s: %d %s, e.g. %s\n", t.Name, e.ByClass[class], class, e.Examples[class])
		}
		if src := t.Metrics.TokenSource; src != "" && src != "usage" {
			fmt.Fprintf(w, "  %s: output tokens counted from %s (no usage in the responses)\n", t.Name, src)
		}
	}
}

// lagNotable reports whether any target's generator lag reached 5 ms,
// which a closed loop shows only when the client machine is starved.
func lagNotable(ts []result.TargetResult) bool {
	for _, t := range ts {
		if t.Metrics.ScheduleLagMs.P99 >= 5 {
			return true
		}
	}
	return false
}

func writeCompare(w io.Writer, c *result.Compare) {
	fmt.Fprintf(w, "\npaired %s − %s over %d requests sent to both:\n", c.B, c.A, c.Pairs)
	table := [][]string{{"", "mean", "95% CI", "median", "95% CI"}}
	for _, d := range []struct {
		label string
		d     result.Delta
	}{{"ΔTTFT", c.DeltaTTFTMs}, {"ΔITL (mean gap)", c.DeltaITLMs}, {"ΔE2E", c.DeltaE2EMs}} {
		if d.d.N == 0 {
			table = append(table, []string{"  " + d.label, "-", "", "-", ""})
			continue
		}
		table = append(table, []string{"  " + d.label,
			fmtMs(d.d.Mean, true), ci(d.d.MeanCI95),
			fmtMs(d.d.P50, true), ci(d.d.P50CI95)})
	}
	writeAligned(w, table)
}

func ci(c [2]float64) string { return "[" + num(c[0], 2, true) + ", " + num(c[1], 2, true) + "]" }

func writeSweep(w io.Writer, r *result.Report) {
	sw := r.Sweep
	name := ""
	if len(r.Targets) > 0 {
		name = " of " + r.Targets[0].Name
	}
	fmt.Fprintf(w, "sweep%s over %s, SLO %s\n", name, sw.Variable, describeSLO(r.Parameters.SLO))
	table := [][]string{{sw.Variable, "req/s", "TTFT p50", "TTFT p99", "TPOT p99", "E2E p99", "lag p99", "errors", "SLO"}}
	for _, p := range sw.Points {
		m := &p.Metrics
		verdict := "ok"
		if !p.MeetsSLO {
			verdict = "missed: " + p.Why
		}
		cell := func(d result.Dist, v float64) string {
			if d.N == 0 {
				return "-"
			}
			return fmtMs(v, false)
		}
		table = append(table, []string{
			strconv.FormatFloat(p.Load, 'f', -1, 64), fmtRate(m.Throughput.RequestsPerS, false),
			cell(m.TTFTMs, m.TTFTMs.P50), cell(m.TTFTMs, m.TTFTMs.P99), cell(m.TPOTMs, m.TPOTMs.P99),
			cell(m.E2EMs, m.E2EMs.P99), cell(m.ScheduleLagMs, m.ScheduleLagMs.P99),
			fmt.Sprintf("%d/%d", m.Requests.Failed, m.Requests.Sent), verdict,
		})
	}
	writeAligned(w, table)
	if sw.Knee < 0 {
		fmt.Fprintf(w, "knee: none (no level met the SLO)\n")
		return
	}
	fmt.Fprintf(w, "knee: %s %s (the highest level meeting the SLO)\n", sw.Variable, strconv.FormatFloat(sw.KneeLoad, 'f', -1, 64))
}

func describeSLO(s result.SLO) string {
	var parts []string
	if s.TTFTMs > 0 {
		parts = append(parts, fmt.Sprintf("TTFT ≤ %gms", s.TTFTMs))
	}
	if s.ITLMs > 0 {
		parts = append(parts, fmt.Sprintf("TPOT ≤ %gms", s.ITLMs))
	}
	if s.E2EMs > 0 {
		parts = append(parts, fmt.Sprintf("E2E ≤ %gms", s.E2EMs))
	}
	p := s.Percentile
	if p == 0 {
		p = 99
	}
	if len(parts) == 0 {
		return fmt.Sprintf("none (p%g of requests must succeed)", p)
	}
	return fmt.Sprintf("p%g %s", p, strings.Join(parts, ", "))
}

func writeBaseline(w io.Writer, b *result.BaselineCheck) {
	verdict := "passed"
	if !b.Passed {
		verdict = "REGRESSION"
	}
	fmt.Fprintf(w, "\nbaseline %s: %s\n", b.File, verdict)
	table := [][]string{}
	for _, c := range b.Checks {
		change := "-"
		if c.Baseline != 0 {
			change = num(100*(c.Current-c.Baseline)/c.Baseline, 1, true) + "%"
		}
		status := "ok"
		if !c.Passed {
			status = "REGRESSED"
		}
		table = append(table, []string{"  " + c.Target + " " + c.Metric,
			num(c.Baseline, 2, false) + " → " + num(c.Current, 2, false), change,
			"tolerance " + num(100*c.Tolerance, 1, false) + "%", status})
	}
	writeAligned(w, table)
}

// writeAligned writes rows with the first column left-aligned and the rest
// right-aligned, two spaces apart.
func writeAligned(w io.Writer, rows [][]string) {
	var widths []int
	for _, r := range rows {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.Reset()
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-displayWidth(c))
			if i == 0 {
				b.WriteString(c + pad)
				continue
			}
			b.WriteString("  " + pad + c)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// displayWidth counts runes: the table uses a few non-ASCII symbols (Δ, →).
func displayWidth(s string) int { return len([]rune(s)) }

func num(v float64, prec int, signed bool) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Trim(s, "-0.") == "" {
		s = strings.TrimPrefix(s, "-") // no "-0.0"
	}
	if signed && !strings.HasPrefix(s, "-") {
		s = "+" + s
	}
	return s
}
