package report

import (
	"math"
	"strconv"
	"strings"
)

// Chart geometry: scales with "nice" ticks and a chart model that
// page.html.tmpl draws as inline SVG. Every coordinate goes through px,
// which never prints NaN or ±Inf, and every data point is filtered through
// finite, so a corrupt report can make a chart emptier but never invalid.

// Canvas size of every chart, in SVG user units; the page scales it to the
// column width (viewBox + width 100%).
const (
	chartW = 560.0
	chartH = 280.0

	marginL = 58.0 // y tick labels + axis title
	marginR = 18.0
	marginT = 34.0 // legend row
	marginB = 46.0 // x tick labels + axis title
)

// px is an SVG coordinate or length. Its String method is what the template
// prints: one decimal, and 0 for anything non-finite.
type px float64

func (p px) String() string {
	v := float64(p)
	if !finite(v) {
		return "0"
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// axis maps a data domain [lo, hi] onto a pixel range [a, b] (b < a for a
// y axis, whose pixels grow downwards), linearly or logarithmically.
type axis struct {
	lo, hi float64
	a, b   float64
	log    bool
	ticks  []float64
	step   float64 // linear tick step; decides how many decimals labels get
}

// pos returns v's pixel, clamped to the axis so that an outlier cannot draw
// outside the plot.
func (s axis) pos(v float64) float64 {
	lo, hi := s.lo, s.hi
	if s.log {
		v, lo, hi = math.Log10(v), math.Log10(lo), math.Log10(hi)
	}
	t := (v - lo) / (hi - lo)
	if !finite(t) {
		t = 0
	}
	t = min(max(t, 0), 1)
	return s.a + t*(s.b-s.a)
}

// inDomain reports whether v can be placed on the axis at all (log axes
// have no place for zero or negatives).
func (s axis) inDomain(v float64) bool {
	return finite(v) && (!s.log || v > 0)
}

// linearAxis returns a linear axis covering [lo, hi] extended to round
// numbers, with about n ticks. withZero forces 0 into the domain, which
// counts and rates want so that bar heights and lines are not exaggerated.
func linearAxis(lo, hi float64, n int, withZero bool) axis {
	if !finite(lo) || !finite(hi) || lo > hi {
		lo, hi = 0, 1
	}
	if withZero {
		lo, hi = min(lo, 0), max(hi, 0)
	}
	if lo == hi {
		// A single value: give it some room instead of dividing by zero.
		if lo == 0 {
			hi = 1
		} else {
			d := math.Abs(lo) * 0.5
			lo, hi = lo-d, hi+d
		}
	}
	step := niceStep((hi - lo) / float64(max(n-1, 1)))
	lo = math.Floor(lo/step+1e-9) * step
	hi = math.Ceil(hi/step-1e-9) * step
	// Snap away float noise such as 0.6000000000000001 by rounding to the
	// step's decimals.
	scale := math.Pow(10, max(0, -math.Floor(math.Log10(step))))
	var ticks []float64
	for i := 0; ; i++ {
		v := lo + float64(i)*step
		if v > hi+step*1e-6 || i > 100 {
			break
		}
		ticks = append(ticks, math.Round(v*scale)/scale)
	}
	return axis{lo: lo, hi: hi, ticks: ticks, step: step}
}

// niceStep rounds a raw tick step to the nearest 1, 2 or 5 times a power
// of ten.
func niceStep(raw float64) float64 {
	if !(raw > 0) || !finite(raw) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / mag; {
	case f < 1.5:
		return mag
	case f < 3:
		return 2 * mag
	case f < 7:
		return 5 * mag
	default:
		return 10 * mag
	}
}

// logAxis returns a base-10 axis covering [lo, hi] (both > 0), bounded by
// the nearest 1-2-5 values so that a narrow range does not waste most of
// the plot on empty decades. Ticks are 1-2-5 per decade when there are at
// most three decades, powers of ten otherwise.
func logAxis(lo, hi float64) axis {
	if !(lo > 0) || !finite(lo) || !finite(hi) || hi < lo {
		lo, hi = 1, 10
	}
	lo, hi = floor125(lo), ceil125(hi)
	if lo == hi { // a single value that is itself a 1-2-5 value
		lo, hi = floor125(lo*0.99), ceil125(hi*1.01)
	}
	mults := []float64{1, 2, 5}
	if math.Log10(hi/lo) > 3 {
		// Many decades: powers of ten, and the domain ends on one.
		mults = []float64{1}
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	}
	var ticks []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range mults {
			v := m * math.Pow(10, e)
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ticks = append(ticks, v)
			}
		}
	}
	return axis{lo: lo, hi: hi, log: true, ticks: ticks}
}

// floor125 rounds v (> 0) down to a 1-2-5 value, ceil125 up.
func floor125(v float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if v >= m*mag*(1-1e-9) {
			return m * mag
		}
	}
	return mag
}

func ceil125(v float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if v <= m*mag*(1+1e-9) {
			return m * mag
		}
	}
	return 10 * mag
}

// tickLabel formats a tick value: as few decimals as the step needs, and
// k/M suffixes for large values so labels stay short.
func tickLabel(v, step float64) string {
	if v == 0 {
		return "0"
	}
	av := math.Abs(v)
	switch {
	case av >= 1e6:
		return trimFloat(v/1e6, 2) + "M"
	case av >= 1e4:
		return trimFloat(v/1e3, 1) + "k"
	}
	if v < 0 {
		return "−" + tickLabel(-v, step) // a real minus sign, as wide as the digits
	}
	dec := 0
	if step > 0 && step < 1 {
		dec = int(math.Ceil(-math.Log10(step) - 1e-9))
	} else if step == 0 && av < 1 { // log axis: decimals from the value
		dec = int(math.Ceil(-math.Log10(av) - 1e-9))
	}
	return trimFloat(v, min(dec, 6))
}

func trimFloat(v float64, dec int) string {
	s := strconv.FormatFloat(v, 'f', dec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// chart is everything the "chart" template needs, already in pixels.
type chart struct {
	ID    string // unique within the page; prefixes the title/desc ids
	Kind  string // data-chart attribute, e.g. "cdf-ttft"
	Scale string // data-scale attribute: "lin" or "log" for the CDF toggle, else empty
	Title string
	Desc  string // text alternative for screen readers

	W, H             px
	PlotX, PlotY     px // top left of the plot area
	PlotW, PlotH     px
	PlotR, PlotB     px // right and bottom edges
	XTickY, YTickX   px // where tick labels go
	TickEnd          px // bottom of the x tick marks
	Shift            px // extra legend rows push the plot down by this much
	XTicks, YTicks   []tick
	XLabel, YLabel   string
	XLabelX, XLabelY px
	YLabelX, YLabelY px
	Bands            []band // under the data
	Overlays         []band // over the data (confidence intervals)
	Bars             []bar
	Lines            []line
	Points           []point
	Rules            []rule
	Legend           []legendItem
	Note             string // shown in the plot when there is nothing to draw

	x, y       axis
	legendX    float64
	legendRows int
	anyData    bool
}

type tick struct {
	Pos   px
	Label string
}

// band is a shaded vertical span: warm-up, cool-down, a confidence interval.
type band struct {
	X, W   px
	Class  string
	Title  string
	Label  string // printed only when the band is wide enough for it
	LabelX px
}

type bar struct {
	X, Y, W, H px
	Color      string
	Title      string
}

type line struct {
	D     string // SVG path data
	Color string
	Dash  string
	Label string
}

type point struct {
	X, Y   px
	Color  string
	Hollow bool
	Title  string
}

// rule is a reference line with a label: a knee, an SLO, a median, zero.
type rule struct {
	X1, Y1, X2, Y2 px
	Class          string
	Label          string
	LX, LY         px
	Anchor         string
}

type legendItem struct {
	X, Y   px
	Color  string
	Dash   string
	Swatch string // "line", "box", "ring", "median", or a band's class: "phase", "ci"
	Label  string
}

// newChart lays out a chart with the given axes; their pixel ranges are
// filled in here.
func newChart(id, kind, title, xLabel, yLabel string, x, y axis) *chart {
	c := &chart{
		ID: id, Kind: kind, Title: title,
		W: chartW, H: chartH,
		PlotX: marginL, PlotY: marginT,
		PlotW: chartW - marginL - marginR, PlotH: chartH - marginT - marginB,
		PlotR: chartW - marginR, PlotB: chartH - marginB,
		XTickY: chartH - marginB + 17, YTickX: marginL - 6, TickEnd: chartH - marginB + 5,
		XLabel: xLabel, YLabel: yLabel,
		legendX: marginL,
	}
	x.a, x.b = marginL, chartW-marginR
	y.a, y.b = chartH-marginB, marginT
	c.x, c.y = x, y
	c.XLabelX, c.XLabelY = px(marginL+float64(c.PlotW)/2), chartH-8
	c.YLabelX, c.YLabelY = 14, px(marginT+float64(c.PlotH)/2)
	for _, v := range x.ticks {
		c.XTicks = append(c.XTicks, tick{px(x.pos(v)), tickLabel(v, x.step)})
	}
	for _, v := range y.ticks {
		c.YTicks = append(c.YTicks, tick{px(y.pos(v)), tickLabel(v, y.step)})
	}
	return c
}

// addLine draws points (in data units) as a polyline; points outside the
// axes' domains (non-finite, ≤ 0 on a log axis) break the line. A series
// with a single drawable point gets a dot, since a one-point path is
// invisible.
func (c *chart) addLine(pts [][2]float64, color, dash, label string) {
	var b strings.Builder
	var n int
	var lastX, lastY px
	pen := false
	for _, p := range pts {
		if !c.x.inDomain(p[0]) || !c.y.inDomain(p[1]) {
			pen = false
			continue
		}
		x, y := px(c.x.pos(p[0])), px(c.y.pos(p[1]))
		// Drop points that land on the previous pixel: CDFs carry hundreds
		// of points the eye cannot tell apart.
		if pen && math.Abs(float64(x-lastX)) < 0.5 && math.Abs(float64(y-lastY)) < 0.5 {
			continue
		}
		if pen {
			b.WriteByte('L')
		} else {
			b.WriteByte('M')
		}
		b.WriteString(x.String())
		b.WriteByte(',')
		b.WriteString(y.String())
		lastX, lastY, pen = x, y, true
		n++
	}
	if n == 1 {
		c.Points = append(c.Points, point{X: lastX, Y: lastY, Color: color, Title: label})
	}
	if n > 1 {
		c.Lines = append(c.Lines, line{D: b.String(), Color: color, Dash: dash, Label: label})
	}
	if n > 0 {
		c.anyData = true
	}
	c.addLegend(color, dash, "line", label)
}

// addPoint draws a marker at (x, y) in data units, if it can be placed.
func (c *chart) addPoint(x, y float64, color string, hollow bool, title string) {
	if !c.x.inDomain(x) || !c.y.inDomain(y) {
		return
	}
	c.Points = append(c.Points, point{X: px(c.x.pos(x)), Y: px(c.y.pos(y)), Color: color, Hollow: hollow, Title: title})
	c.anyData = true
}

// addBar draws a bar over [x0, x1] from zero up to y.
func (c *chart) addBar(x0, x1, y float64, color, title string) {
	if !c.x.inDomain(x0) || !c.x.inDomain(x1) || !c.y.inDomain(y) || x1 < x0 {
		return
	}
	a, b := c.x.pos(x0), c.x.pos(x1)
	top, base := c.y.pos(y), c.y.pos(max(c.y.lo, 0))
	w := b - a
	if w > 2 {
		w -= 1 // a hairline gap between bars
	}
	c.Bars = append(c.Bars, bar{X: px(a), Y: px(min(top, base)), W: px(max(w, 0.5)), H: px(math.Abs(base - top)), Color: color, Title: title})
	c.anyData = true
}

// addBand shades the x span [x0, x1], under the data or, with over, on top
// of it (a band under histogram bars would be hidden by them).
func (c *chart) addBand(x0, x1 float64, class, label string, over bool) {
	if !c.x.inDomain(x0) || !c.x.inDomain(x1) || x1 <= x0 {
		return
	}
	a, b := c.x.pos(x0), c.x.pos(x1)
	if b-a < 0.5 {
		b = a + 0.5 // still visible, however narrow
	}
	bd := band{X: px(a), W: px(b - a), Class: class, Title: label, LabelX: px((a + b) / 2)}
	if b-a >= 7*float64(len([]rune(label))) {
		bd.Label = label
	}
	if over {
		c.Overlays = append(c.Overlays, bd)
	} else {
		c.Bands = append(c.Bands, bd)
	}
}

// addVRule draws a vertical reference line at x with a label at the top.
func (c *chart) addVRule(x float64, class, label string) {
	if !c.x.inDomain(x) || x < c.x.lo || x > c.x.hi {
		return
	}
	p := px(c.x.pos(x))
	anchor, lx := "start", p+4
	if float64(p) > chartW-marginR-90 { // keep the label inside the canvas
		anchor, lx = "end", p-4
	}
	c.Rules = append(c.Rules, rule{X1: p, X2: p, Y1: px(c.y.b), Y2: px(c.y.a), Class: class,
		Label: label, LX: lx, LY: px(c.y.b + 12), Anchor: anchor})
}

// addHRule draws a horizontal reference line at y with a label on the right.
func (c *chart) addHRule(y float64, class, label string) {
	if !c.y.inDomain(y) || y < c.y.lo || y > c.y.hi {
		return
	}
	p := px(c.y.pos(y))
	ly := p - 4
	if float64(ly) < marginT+10 { // no room above the line: label below it
		ly = p + 12
	}
	c.Rules = append(c.Rules, rule{X1: px(c.x.a), X2: px(c.x.b), Y1: p, Y2: p, Class: class,
		Label: label, LX: px(c.x.b - 4), LY: ly, Anchor: "end"})
}

// addLegend appends a legend entry above the plot, starting a new row when
// the current one is full. Widths are estimated from the label length:
// there is no text measurement in Go, and 12px system-ui averages about
// 6.6 units per character.
func (c *chart) addLegend(color, dash, swatch, label string) {
	if label == "" {
		return
	}
	for _, it := range c.Legend {
		if it.Label == label {
			return
		}
	}
	w := 26 + 6.6*float64(len([]rune(label)))
	if c.legendX > marginL && c.legendX+w > chartW-marginR {
		c.legendX = marginL
		c.legendRows++
	}
	c.Legend = append(c.Legend, legendItem{X: px(c.legendX), Y: px(14 + legendRow*float64(c.legendRows)),
		Color: color, Dash: dash, Swatch: swatch, Label: label})
	c.legendX += w + 14
}

// legendRow is the height of a legend row.
const legendRow = 17

// finish makes room for extra legend rows and sets the note shown when
// nothing could be drawn.
func (c *chart) finish() *chart {
	c.Shift = px(legendRow * float64(c.legendRows))
	c.H += c.Shift
	if !c.anyData {
		c.Note = "no data"
	}
	return c
}
