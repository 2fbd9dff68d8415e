package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/infergate/infergate/bench/result"
)

// The charts of the page, built from the report with the geometry of
// svg.go. Each builder returns nil (or nothing) when the report has no data
// for it, and the template then leaves the chart out.

// Colours of things that are not targets.
const (
	missColor = "#b2182b" // a sweep level that misses the SLO
)

// cdfPair is one latency CDF drawn twice, on a linear and on a log x axis;
// the page shows one of them at a time, the log one first when the tail is
// long enough to squash everything else against the y axis.
type cdfPair struct {
	Lin, Log *chart
	LogFirst bool
}

// longTail is how far beyond the median the largest value must reach for a
// CDF to open on a log axis.
const longTail = 8

var cdfMetrics = []struct {
	key, name string
	points    func(result.CDFs) [][2]float64
	dist      func(result.Metrics) result.Dist
}{
	{"ttft", "TTFT", func(c result.CDFs) [][2]float64 { return c.TTFTMs }, func(m result.Metrics) result.Dist { return m.TTFTMs }},
	{"itl", "ITL", func(c result.CDFs) [][2]float64 { return c.ITLMs }, func(m result.Metrics) result.Dist { return m.ITLMs }},
	{"e2e", "E2E", func(c result.CDFs) [][2]float64 { return c.E2EMs }, func(m result.Metrics) result.Dist { return m.E2EMs }},
}

func (b *builder) cdfCharts(targets []result.TargetResult) []cdfPair {
	var out []cdfPair
	for _, m := range cdfMetrics {
		lo, hi, minPos := math.Inf(1), math.Inf(-1), math.Inf(1)
		for _, t := range targets {
			for _, p := range m.points(t.CDF) {
				if !finite(p[0]) || !finite(p[1]) {
					continue
				}
				lo, hi = min(lo, p[0]), max(hi, p[0])
				if p[0] > 0 {
					minPos = min(minPos, p[0])
				}
			}
		}
		if lo > hi {
			continue // no target has this CDF
		}
		var desc []string
		for i, t := range targets {
			if d := m.dist(t.Metrics); d.N > 0 {
				desc = append(desc, fmt.Sprintf("%s: p50 %s ms, p99 %s ms", name(i, t), num(d.P50), num(d.P99)))
			}
		}
		draw := func(x axis) *chart {
			xLabel := m.name + " (ms)"
			if x.log {
				xLabel = m.name + " (ms, log scale)"
			}
			c := newChart(b.chartID(), "cdf-"+m.key, m.name+" distribution (CDF)",
				xLabel, "Share of samples ≤ x (%)", x, linearAxis(0, 100, 6, true))
			c.Desc = "Cumulative distribution of " + m.name + " per target. " + strings.Join(desc, "; ")
			c.addHRule(50, "guide", "p50")
			c.addHRule(99, "guide", "p99")
			for i, t := range targets {
				pts := make([][2]float64, 0, len(m.points(t.CDF)))
				for _, p := range m.points(t.CDF) {
					pts = append(pts, [2]float64{p[0], p[1] * 100})
				}
				if len(pts) > 0 {
					c.addLine(pts, targetColor(i), "", name(i, t))
				}
			}
			return c.finish()
		}
		pair := cdfPair{Lin: draw(linearAxis(lo, hi, 7, false))}
		if finite(minPos) {
			pair.Log = draw(logAxis(minPos, hi))
			pair.Lin.Scale, pair.Log.Scale = "lin", "log"
			for _, t := range targets {
				if d := m.dist(t.Metrics); d.N > 0 && d.P50 > 0 && d.Max/d.P50 > longTail {
					pair.LogFirst = true
				}
			}
		}
		out = append(out, pair)
	}
	return out
}

// name is a target's display name.
func name(i int, t result.TargetResult) string {
	if t.Name == "" {
		return fmt.Sprintf("target %d", i+1)
	}
	return t.Name
}

// bucketWidth is the length of bucket i of a timeline: the distance to the
// next bucket (nominally one second).
func bucketWidth(tl []result.Bucket, i int) float64 {
	if i+1 < len(tl) {
		if w := tl[i+1].TS - tl[i].TS; w > 0 && finite(w) {
			return w
		}
	}
	if i > 0 {
		if w := tl[i].TS - tl[i-1].TS; w > 0 && finite(w) {
			return w
		}
	}
	return 1
}

func (b *builder) timelineCharts(targets []result.TargetResult) []*chart {
	end, maxTTFT, maxTok := 0.0, 0.0, 0.0
	var phases []result.Bucket // the first timeline: warm-up and cool-down are the same for every target
	for _, t := range targets {
		if len(t.Timeline) > 0 && phases == nil {
			phases = t.Timeline
		}
		for i, bk := range t.Timeline {
			if e := bk.TS + bucketWidth(t.Timeline, i); finite(e) {
				end = max(end, e)
			}
			maxTTFT = max(maxTTFT, finiteOr0(bk.TTFTP50Ms), finiteOr0(bk.TTFTP99Ms))
			maxTok = max(maxTok, finiteOr0(bk.OutputTokensPerS))
		}
	}
	if phases == nil {
		return nil
	}
	x := linearAxis(0, end, 8, true)
	const xLabel = "Time since start (s)"

	ttft := newChart(b.chartID(), "timeline-ttft", "TTFT over time (p50 and p99 per second)",
		xLabel, "TTFT (ms)", x, linearAxis(0, maxTTFT, 6, true))
	tput := newChart(b.chartID(), "timeline-throughput", "Output throughput over time",
		xLabel, "Output tokens/s", x, linearAxis(0, maxTok, 6, true))
	for _, c := range []*chart{ttft, tput} {
		shadePhases(c, phases)
	}
	var ttftDesc, tputDesc []string
	for i, t := range targets {
		if len(t.Timeline) == 0 {
			continue
		}
		var p50, p99, tok [][2]float64
		peakP99, peakTok := 0.0, 0.0
		for j, bk := range t.Timeline {
			mid := bk.TS + bucketWidth(t.Timeline, j)/2
			if bk.TTFTP50Ms > 0 {
				p50 = append(p50, [2]float64{mid, bk.TTFTP50Ms})
				p99 = append(p99, [2]float64{mid, bk.TTFTP99Ms})
				peakP99 = max(peakP99, finiteOr0(bk.TTFTP99Ms))
			} else {
				// No successful request was sent in this second: a gap in
				// the line, not a 0 ms TTFT.
				p50 = append(p50, [2]float64{math.NaN(), 0})
				p99 = append(p99, [2]float64{math.NaN(), 0})
			}
			tok = append(tok, [2]float64{mid, bk.OutputTokensPerS})
			peakTok = max(peakTok, finiteOr0(bk.OutputTokensPerS))
		}
		c, n := targetColor(i), name(i, t)
		ttft.addLine(p50, c, "", n+" p50")
		ttft.addLine(p99, c, "5 3", n+" p99")
		tput.addLine(tok, c, "", n)
		ttftDesc = append(ttftDesc, fmt.Sprintf("%s: highest per-second p99 %s ms", n, num(peakP99)))
		tputDesc = append(tputDesc, fmt.Sprintf("%s: peak %s output tokens/s", n, num(peakTok)))
	}
	ttft.Desc = "TTFT p50 (solid) and p99 (dashed) per one-second bucket; shaded: warm-up and cool-down. " + strings.Join(ttftDesc, "; ")
	tput.Desc = "Output tokens per second per one-second bucket; shaded: warm-up and cool-down. " + strings.Join(tputDesc, "; ")
	return []*chart{ttft.finish(), tput.finish()}
}

// shadePhases shades the warm-up and cool-down spans of a timeline.
func shadePhases(c *chart, tl []result.Bucket) {
	labels := map[string]string{"warmup": "warm-up", "cooldown": "cool-down"}
	shaded := false
	for i := 0; i < len(tl); {
		j := i
		for j+1 < len(tl) && tl[j+1].Phase == tl[i].Phase {
			j++
		}
		if label, ok := labels[tl[i].Phase]; ok {
			c.addBand(tl[i].TS, tl[j].TS+bucketWidth(tl, j), "phase", label, false)
			shaded = true
		}
		i = j + 1
	}
	if shaded {
		c.addLegend("", "", "phase", "warm-up / cool-down")
	}
}

func finiteOr0(v float64) float64 {
	if finite(v) {
		return v
	}
	return 0
}

// sweepView is a --sweep run: two charts and a table of the levels.
type sweepView struct {
	Variable   string
	Percentile string // the SLO percentile the knee is judged at, e.g. "p99"
	Knee       string // the knee's load, described; empty if there is none
	NoKnee     bool   // no level met the SLO
	Charts     []*chart
	Rows       []sweepRow
}

type sweepRow struct {
	Load, Sent, Failed, TTFT50, TTFTp, ITLp, E2Ep, RPS, TokS, Goodput string
	Meets, Knee                                                       bool
	Why                                                               string
}

func (b *builder) sweep(s *result.Sweep, slo result.SLO) *sweepView {
	if s == nil || len(s.Points) == 0 {
		return nil
	}
	perc := sloPercentile(slo)
	pname := "p" + trimFloat(perc, 1)
	v := &sweepView{Variable: s.Variable, Percentile: pname}
	knee := -1
	if s.Knee >= 0 && s.Knee < len(s.Points) {
		knee = s.Knee
		v.Knee = loadLabel(s.Points[knee].Load, s.Variable)
	} else if s.Knee == -1 {
		v.NoKnee = true
	}

	for i, p := range s.Points {
		m := p.Metrics
		v.Rows = append(v.Rows, sweepRow{
			Load: loadLabel(p.Load, s.Variable), Sent: integer(m.Requests.Sent), Failed: integer(m.Requests.Failed),
			TTFT50: distValue(m.TTFTMs, m.TTFTMs.P50), TTFTp: distValue(m.TTFTMs, atPercentile(m.TTFTMs, perc)),
			ITLp: distValue(m.ITLMs, atPercentile(m.ITLMs, perc)), E2Ep: distValue(m.E2EMs, atPercentile(m.E2EMs, perc)),
			RPS: num(m.Throughput.RequestsPerS), TokS: num(m.Throughput.OutputTokensPerS), Goodput: pct(m.Goodput.Fraction),
			Meets: p.MeetsSLO, Knee: i == knee, Why: p.Why,
		})
	}

	// The charts connect the levels in load order, whatever the run's order.
	pts := slices.Clone(s.Points)
	slices.SortStableFunc(pts, func(a, b result.SweepPoint) int { return cmp.Compare(a.Load, b.Load) })
	lo, hi := math.Inf(1), math.Inf(-1)
	maxTTFT, maxTok := finiteOr0(slo.TTFTMs), 0.0
	for _, p := range pts {
		if finite(p.Load) {
			lo, hi = min(lo, p.Load), max(hi, p.Load)
		}
		if p.Metrics.TTFTMs.N > 0 {
			maxTTFT = max(maxTTFT, finiteOr0(atPercentile(p.Metrics.TTFTMs, perc)))
		}
		maxTok = max(maxTok, finiteOr0(p.Metrics.Throughput.OutputTokensPerS))
	}
	if lo > hi {
		lo, hi = 0, 1
	}
	var x axis
	if lo > 0 && hi/lo >= 16 {
		x = logAxis(lo, hi) // load levels are usually doubled: 1, 2, 4, … 128
	} else {
		x = linearAxis(lo, hi, 7, true)
	}
	xLabel := "Load"
	switch s.Variable {
	case "concurrency":
		xLabel = "Concurrency (users)"
	case "rate":
		xLabel = "Offered load (req/s)"
	}
	if x.log {
		xLabel += ", log scale"
	}

	color := targetColor(0)
	ttft := newChart(b.chartID(), "sweep-ttft", "TTFT "+pname+" vs load", xLabel, "TTFT "+pname+" (ms)",
		x, linearAxis(0, maxTTFT, 6, true))
	tput := newChart(b.chartID(), "sweep-throughput", "Output throughput vs load", xLabel, "Output tokens/s",
		x, linearAxis(0, maxTok, 6, true))
	var tp, t50, tok [][2]float64
	for _, p := range pts {
		m := p.Metrics
		if m.TTFTMs.N > 0 {
			tp = append(tp, [2]float64{p.Load, atPercentile(m.TTFTMs, perc)})
			t50 = append(t50, [2]float64{p.Load, m.TTFTMs.P50})
		}
		tok = append(tok, [2]float64{p.Load, m.Throughput.OutputTokensPerS})
	}
	ttft.addLine(tp, color, "", "TTFT "+pname)
	ttft.addLine(t50, color, "2 3", "TTFT p50")
	tput.addLine(tok, color, "", "output tokens/s")
	for _, p := range pts {
		m := p.Metrics
		status, c := "meets the SLO", color
		if !p.MeetsSLO {
			status, c = "misses the SLO", missColor
			if p.Why != "" {
				status += ": " + p.Why
			}
		}
		load := loadLabel(p.Load, s.Variable)
		if m.TTFTMs.N > 0 {
			ttft.addPoint(p.Load, atPercentile(m.TTFTMs, perc), c, !p.MeetsSLO,
				fmt.Sprintf("%s: TTFT %s %s ms, %s", load, pname, num(atPercentile(m.TTFTMs, perc)), status))
		}
		tput.addPoint(p.Load, m.Throughput.OutputTokensPerS, c, !p.MeetsSLO,
			fmt.Sprintf("%s: %s output tokens/s, %s", load, num(m.Throughput.OutputTokensPerS), status))
	}
	missed := slices.ContainsFunc(pts, func(p result.SweepPoint) bool { return !p.MeetsSLO })
	for _, c := range []*chart{ttft, tput} {
		if missed {
			c.addLegend(missColor, "", "ring", "misses SLO")
		}
		if knee >= 0 {
			c.addVRule(s.Points[knee].Load, "knee", "knee: "+v.Knee)
		}
	}
	if slo.TTFTMs > 0 {
		ttft.addHRule(slo.TTFTMs, "slo", "SLO "+plain(slo.TTFTMs)+" ms")
	}
	var kneeDesc string
	switch {
	case knee >= 0:
		kneeDesc = "The knee, the highest load that met the SLO, is " + v.Knee + "."
	case v.NoKnee:
		kneeDesc = "No load level met the SLO."
	}
	ttft.Desc = fmt.Sprintf("TTFT %s and p50 at each of %d load levels. %s", pname, len(pts), kneeDesc)
	tput.Desc = fmt.Sprintf("Output tokens per second at each of %d load levels. %s", len(pts), kneeDesc)
	v.Charts = []*chart{ttft.finish(), tput.finish()}
	return v
}

// atPercentile picks the Dist field for an SLO percentile; the Dist only
// has a few, so others fall back to p99.
func atPercentile(d result.Dist, p float64) float64 {
	switch p {
	case 50:
		return d.P50
	case 90:
		return d.P90
	case 95:
		return d.P95
	case 99.9:
		return d.P999
	}
	return d.P99
}

func distValue(d result.Dist, v float64) string {
	if d.N <= 0 {
		return dash
	}
	return num(v)
}

func loadLabel(load float64, variable string) string {
	s := plain(load)
	switch variable {
	case "concurrency":
		return s + " concurrent"
	case "rate":
		return s + " req/s"
	}
	return s
}

// compareView is a --compare-targets run: B − A per request pair.
type compareView struct {
	A, B     string
	Pairs    string
	Headline string
	Rows     []deltaRow
	Charts   []*chart
}

type deltaRow struct {
	Metric, N, Median, MedianCI, Mean, MeanCI, P90, P99, Min, Max string
}

func (b *builder) compare(c *result.Compare, targets []result.TargetResult) *compareView {
	if c == nil {
		return nil
	}
	v := &compareView{A: c.A, B: c.B, Pairs: integer(c.Pairs)}
	color := targetColor(1)
	for i, t := range targets {
		if t.Name == c.B {
			color = targetColor(i)
		}
	}
	deltas := []struct {
		key, name string
		d         result.Delta
	}{
		{"ttft", "TTFT", c.DeltaTTFTMs},
		{"itl", "ITL (mean gap per request)", c.DeltaITLMs},
		{"e2e", "E2E", c.DeltaE2EMs},
	}
	for _, d := range deltas {
		if d.d.N == 0 && len(d.d.Counts) == 0 {
			continue
		}
		v.Rows = append(v.Rows, deltaRow{
			Metric: d.name, N: integer(d.d.N),
			Median: signed(d.d.P50), MedianCI: ci(d.d.P50CI95),
			Mean: signed(d.d.Mean), MeanCI: ci(d.d.MeanCI95),
			P90: signed(d.d.P90), P99: signed(d.d.P99), Min: signed(d.d.Min), Max: signed(d.d.Max),
		})
		if ch := b.deltaChart(d.key, d.name, c, d.d, color); ch != nil {
			v.Charts = append(v.Charts, ch)
		}
	}
	if d := c.DeltaTTFTMs; d.N > 0 {
		v.Headline = fmt.Sprintf("%s − %s, median TTFT difference: %s ms (95%% CI %s ms) over %s pairs",
			c.B, c.A, signed(d.P50), ci(d.P50CI95), integer(d.N))
	}
	return v
}

func ci(c [2]float64) string {
	return "[" + signed(c[0]) + ", " + signed(c[1]) + "]"
}

// deltaBins turns a Delta's histogram into [lower, upper, count] bins.
// Edges are lower edges, possibly with the last bin's upper edge appended;
// without it the last bin is as wide as the one before.
func deltaBins(d result.Delta) [][3]float64 {
	n := min(len(d.Edges), len(d.Counts))
	var bins [][3]float64
	for i := range n {
		lo := d.Edges[i]
		var hi float64
		switch {
		case i+1 < len(d.Edges):
			hi = d.Edges[i+1]
		case i > 0:
			hi = lo + (d.Edges[i] - d.Edges[i-1])
		case d.Max > lo:
			hi = d.Max
		default:
			hi = lo + 1
		}
		if !finite(lo) || !finite(hi) || hi <= lo || d.Counts[i] < 0 {
			continue
		}
		bins = append(bins, [3]float64{lo, hi, float64(d.Counts[i])})
	}
	return bins
}

func (b *builder) deltaChart(key, metric string, c *result.Compare, d result.Delta, color string) *chart {
	bins := deltaBins(d)
	if len(bins) == 0 {
		return nil
	}
	// Zero stays in view: "how far from no difference" is the point.
	lo, hi, top := 0.0, 0.0, 0.0
	for _, bn := range bins {
		lo, hi, top = min(lo, bn[0]), max(hi, bn[1]), max(top, bn[2])
	}
	for _, v := range []float64{d.P50, d.P50CI95[0], d.P50CI95[1]} {
		if finite(v) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	ch := newChart(b.chartID(), "delta-"+key, metric+": "+c.B+" − "+c.A+" per request pair",
		"Difference "+c.B+" − "+c.A+" (ms)", "Pairs", linearAxis(lo, hi, 7, false), linearAxis(0, top, 5, true))
	ch.addLegend(color, "", "box", c.B+" − "+c.A)
	for _, bn := range bins {
		ch.addBar(bn[0], bn[1], bn[2], color,
			fmt.Sprintf("%s to %s ms: %s pairs", signed(bn[0]), signed(bn[1]), integer(int64(bn[2]))))
	}
	ch.addVRule(0, "zero", "")
	if finite(d.P50) {
		ch.addVRule(d.P50, "median", "median "+signed(d.P50)+" ms")
		ch.addLegend("", "", "median", "median")
	}
	if lo, hi := d.P50CI95[0], d.P50CI95[1]; finite(lo) && finite(hi) && hi > lo {
		ch.addBand(lo, hi, "ci", "95% CI of the median", true)
		ch.addLegend("", "", "ci", "95% CI of the median")
	}
	ch.Desc = fmt.Sprintf("Histogram of the per-pair difference in %s, %s minus %s, over %s pairs: median %s ms, 95%% CI %s ms; mean %s ms.",
		metric, c.B, c.A, integer(d.N), signed(d.P50), ci(d.P50CI95), signed(d.Mean))
	return ch.finish()
}
