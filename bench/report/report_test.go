package report

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"

	"github.com/infergate/infergate/bench/result"
)

// render writes r and checks what every page must satisfy, returning the
// parsed document.
func render(t *testing.T, r *result.Report) (string, *html.Node) {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	out := buf.String()
	doc, err := html.Parse(strings.NewReader(out))
	if err != nil {
		t.Fatalf("parsing the page: %v", err)
	}
	checkPage(t, out, doc)
	return out, doc
}

// numericAttrs are the SVG attributes the charts print numbers into.
var numericAttrs = map[string]bool{
	"x": true, "y": true, "x1": true, "x2": true, "y1": true, "y2": true, "dy": true,
	"cx": true, "cy": true, "r": true, "width": true, "height": true,
}

var number = regexp.MustCompile(`-?[0-9]*\.?[0-9]+(e[-+]?[0-9]+)?`)

func checkPage(t *testing.T, out string, doc *html.Node) {
	t.Helper()
	// %! is a fmt verb error, ZgotmplZ html/template's mark of a value it refused.
	for _, bad := range []string{"NaN", "Inf", "%!", "ZgotmplZ"} {
		if strings.Contains(out, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	ids := map[string]bool{}
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		if n.DataAtom == atom.Script {
			t.Error("page has a <script>; it is meant to run without JavaScript")
		}
		if n.DataAtom == atom.Style && n.FirstChild != nil {
			css := n.FirstChild.Data
			if strings.Contains(css, "url(") || strings.Contains(css, "@import") {
				t.Error("stylesheet refers to an external resource")
			}
		}
		for _, a := range n.Attr {
			a.Key = strings.ToLower(a.Key) // the parser restores SVG's viewBox
			switch {
			case a.Key == "id":
				if ids[a.Val] {
					t.Errorf("duplicate id %q", a.Val)
				}
				ids[a.Val] = true
			case a.Key == "src" || a.Key == "srcset" || a.Key == "action" || a.Key == "poster" || a.Key == "data":
				t.Errorf("<%s %s=%q>: the page loads nothing", n.Data, a.Key, a.Val)
			case a.Key == "href" || strings.HasSuffix(a.Key, ":href"):
				if !strings.HasPrefix(a.Val, "#") && !strings.HasPrefix(a.Val, "data:") {
					t.Errorf("<%s href=%q>: only in-page links and data: URLs are allowed", n.Data, a.Val)
				}
			case a.Key == "style" && strings.Contains(a.Val, "url("):
				t.Errorf("<%s style=%q> refers to a resource", n.Data, a.Val)
			case a.Key == "d" || a.Key == "viewbox" || a.Key == "transform" || numericAttrs[a.Key] && inSVG(n):
				checkNumbers(t, n, a)
			}
		}
	}
	for _, svg := range charts(doc) {
		kind := attr(svg, "data-chart")
		if attr(svg, "role") != "img" {
			t.Errorf("chart %s: role=%q, want img", kind, attr(svg, "role"))
		}
		labels := strings.Fields(attr(svg, "aria-labelledby"))
		if len(labels) != 2 {
			t.Errorf("chart %s: aria-labelledby=%q, want a title and a description", kind, attr(svg, "aria-labelledby"))
		}
		for _, id := range labels {
			el := byID(doc, id)
			if el == nil || el.Parent != svg || strings.TrimSpace(text(el)) == "" {
				t.Errorf("chart %s: aria-labelledby %q is not a non-empty child of the chart", kind, id)
			}
		}
		if vb := strings.Fields(attr(svg, "viewbox")); len(vb) != 4 || vb[2] == "0" || vb[3] == "0" {
			t.Errorf("chart %s: viewBox=%q", kind, attr(svg, "viewbox"))
		}
	}
}

func checkNumbers(t *testing.T, n *html.Node, a html.Attribute) {
	t.Helper()
	for _, s := range number.FindAllString(a.Val, -1) {
		if v, err := strconv.ParseFloat(s, 64); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("<%s %s=%q>: bad number %q", n.Data, a.Key, a.Val, s)
		}
	}
	if a.Key != "d" && a.Key != "viewbox" && a.Key != "transform" {
		if _, err := strconv.ParseFloat(a.Val, 64); err != nil {
			t.Errorf("<%s %s=%q>: not a number", n.Data, a.Key, a.Val)
		}
	}
}

func inSVG(n *html.Node) bool { return n.Namespace == "svg" }

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if strings.EqualFold(a.Key, key) {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, class string) bool {
	return n.Type == html.ElementNode && strings.Contains(" "+attr(n, "class")+" ", " "+class+" ")
}

func text(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}

func byID(doc *html.Node, id string) *html.Node {
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && attr(n, "id") == id {
			return n
		}
	}
	return nil
}

// charts returns the chart <svg> elements, in page order.
func charts(doc *html.Node) []*html.Node {
	var out []*html.Node
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "svg" && attr(n, "data-chart") != "" {
			out = append(out, n)
		}
	}
	return out
}

func chartKinds(doc *html.Node) []string {
	var kinds []string
	for _, c := range charts(doc) {
		k := attr(c, "data-chart")
		if s := attr(c, "data-scale"); s != "" {
			k += "/" + s
		}
		kinds = append(kinds, k)
	}
	return kinds
}

// find returns the elements under n with the class.
func find(n *html.Node, class string) []*html.Node {
	var out []*html.Node
	for d := range n.Descendants() {
		if hasClass(d, class) {
			out = append(out, d)
		}
	}
	return out
}

func chartOf(t *testing.T, doc *html.Node, kind string) *html.Node {
	t.Helper()
	for _, c := range charts(doc) {
		if attr(c, "data-chart") == kind {
			return c
		}
	}
	t.Fatalf("no %s chart", kind)
	return nil
}

func TestWriteHTMLNilReport(t *testing.T) {
	if err := WriteHTML(&bytes.Buffer{}, nil); err == nil {
		t.Error("WriteHTML(nil) succeeded")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteHTMLWriteError(t *testing.T) {
	if err := WriteHTML(failingWriter{}, oneTarget()); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("WriteHTML to a failing writer = %v, want its error", err)
	}
}

func TestWriteHTMLEmptyReport(t *testing.T) {
	out, doc := render(t, &result.Report{})
	if len(charts(doc)) != 0 {
		t.Errorf("empty report has charts: %v", chartKinds(doc))
	}
	for _, id := range []string{"summary", "latency", "timeline", "sweep", "compare", "baseline"} {
		if byID(doc, id) != nil {
			t.Errorf("empty report has a %q section", id)
		}
	}
	if byID(doc, "parameters") == nil || !strings.Contains(out, "infergate bench report") {
		t.Error("empty report lacks its header")
	}
}

// oneTarget is a single-target report with CDFs and a timeline.
func oneTarget() *result.Report {
	rng := rand.New(rand.NewPCG(1, 2))
	s := simulate(rng, 300, 40, 0)
	return &result.Report{
		Tool: "infergate bench", DurationS: 70,
		Parameters: result.Parameters{
			Targets: []result.Target{{Name: "direct", URL: "http://127.0.0.1:8000/v1"}},
			Mode:    "open", RatePerS: 20, Arrival: "gamma", Burstiness: 0.5, Requests: 300,
			WarmupS: 5, CooldownS: 5, Stream: true, Seed: 7,
		},
		Targets: []result.TargetResult{{
			Name: "direct", URL: "http://127.0.0.1:8000/v1", Metrics: metricsOf(s, 0, 60),
			Timeline: timeline(rng, 40, 0),
			CDF:      result.CDFs{TTFTMs: cdf(s.ttft, 200), ITLMs: cdf(s.itl, 200), E2EMs: cdf(s.e2e, 200)},
		}},
	}
}

func TestWriteHTMLSingleTarget(t *testing.T) {
	_, doc := render(t, oneTarget())
	out := text(doc)
	want := []string{"cdf-ttft/lin", "cdf-ttft/log", "cdf-itl/lin", "cdf-itl/log", "cdf-e2e/lin", "cdf-e2e/log",
		"timeline-ttft", "timeline-throughput"}
	if got := chartKinds(doc); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("charts = %v, want %v", got, want)
	}
	for _, id := range []string{"sweep", "compare", "baseline"} {
		if byID(doc, id) != nil {
			t.Errorf("report without %s has a %q section", id, id)
		}
	}
	for _, s := range []string{"open loop, 20 req/s, gamma arrivals (burstiness 0.5)", "300 requests per target", "p99.9"} {
		if !strings.Contains(out, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	// Warm-up and cool-down are shaded on both timelines.
	for _, kind := range []string{"timeline-ttft", "timeline-throughput"} {
		if n := len(find(chartOf(t, doc, kind), "phase")); n != 3 { // two spans + the legend swatch
			t.Errorf("%s: %d phase shapes, want 3", kind, n)
		}
	}
	// One target: no side-by-side overview table.
	if strings.Contains(out, "All targets, measurement window only") {
		t.Error("single target report has the overview table")
	}
}

func TestWriteHTMLTwoTargetsCompare(t *testing.T) {
	r := richReport()
	r.Sweep, r.Baseline = nil, nil
	_, doc := render(t, r)
	out := text(doc)

	for _, kind := range []string{"cdf-ttft", "cdf-e2e", "timeline-ttft"} {
		legend := text(find(chartOf(t, doc, kind), "legend")[0])
		if !strings.Contains(legend, "direct") || !strings.Contains(legend, "gateway") {
			t.Errorf("%s legend %q lacks a target", kind, legend)
		}
	}
	if !strings.Contains(out, "All targets, measurement window only") {
		t.Error("two-target report lacks the overview table")
	}
	if byID(doc, "compare") == nil {
		t.Fatal("no compare section")
	}
	for _, kind := range []string{"delta-ttft", "delta-itl", "delta-e2e"} {
		c := chartOf(t, doc, kind)
		if len(find(c, "median")) < 2 { // the rule and its label
			t.Errorf("%s: median not marked", kind)
		}
		if len(find(c, "ci")) < 1 {
			t.Errorf("%s: confidence interval not marked", kind)
		}
		if len(find(c, "zero")) != 1 {
			t.Errorf("%s: no zero line", kind)
		}
	}
	d := r.Compare.DeltaTTFTMs
	if want := "median TTFT difference: " + signed(d.P50) + " ms (95% CI " + ci(d.P50CI95) + " ms)"; !strings.Contains(out, want) {
		t.Errorf("page lacks the headline %q", want)
	}
	for _, s := range []string{"http_429", "429 Too Many Requests", "mixed (usage where"} {
		if !strings.Contains(out, s) {
			t.Errorf("page lacks %q", s)
		}
	}
}

func TestWriteHTMLSweep(t *testing.T) {
	r := richReport()
	_, doc := render(t, r)
	knee := r.Sweep.Points[r.Sweep.Knee].Load
	for _, kind := range []string{"sweep-ttft", "sweep-throughput"} {
		c := chartOf(t, doc, kind)
		labels := find(c, "knee")
		if len(labels) != 2 || !strings.Contains(text(labels[1]), "knee: "+strconv.Itoa(int(knee))+" concurrent") {
			t.Errorf("%s: knee not marked at %v", kind, knee)
		}
		// Missed levels are hollow markers.
		hollow := 0
		for n := range c.Descendants() {
			if n.Data == "circle" && attr(n, "fill") == "#ffffff" && attr(n, "stroke") == missColor {
				hollow++
			}
		}
		if want := len(r.Sweep.Points) - r.Sweep.Knee - 1 + 1; hollow != want { // + the legend's
			t.Errorf("%s: %d hollow markers, want %d", kind, hollow, want)
		}
	}
	if len(find(chartOf(t, doc, "sweep-ttft"), "slo")) != 2 {
		t.Error("sweep-ttft: SLO threshold not drawn")
	}
	var rows []string
	for _, n := range find(byID(doc, "sweep"), "knee") {
		if n.Data == "tr" {
			rows = append(rows, text(n.FirstChild))
		}
	}
	if want := strconv.Itoa(int(knee)) + " concurrent (knee)"; len(rows) != 1 || rows[0] != want {
		t.Errorf("sweep table rows marked as the knee: %q, want [%q]", rows, want)
	}

	// No level met the SLO: said in words, no knee line.
	r.Sweep.Knee, r.Sweep.KneeLoad = -1, 0
	_, doc = render(t, r)
	if !strings.Contains(text(byID(doc, "sweep")), "No load level met the SLO.") {
		t.Error("page does not say that no level met the SLO")
	}
	if n := len(find(byID(doc, "sweep"), "knee")); n != 0 {
		t.Errorf("knee marked %d times with Knee = -1", n)
	}
}

func TestWriteHTMLBaseline(t *testing.T) {
	r := oneTarget()
	r.Baseline = &result.BaselineCheck{File: "base.json", Passed: false, Checks: []result.BaselineMetric{
		{Target: "direct", Metric: "ttft_ms.p99", Baseline: 100, Current: 125, Tolerance: 0.1, Passed: false},
		{Target: "direct", Metric: "itl_ms.p99", Baseline: 20, Current: 19, Tolerance: 0.1, Passed: true},
		{Target: "direct", Metric: "goodput.requests_per_s", Baseline: 0, Current: 3, Tolerance: 0.1, HigherIsBetter: true, Passed: true},
	}}
	_, doc := render(t, r)
	sec := byID(doc, "baseline")
	if sec == nil {
		t.Fatal("no baseline section")
	}
	s := text(sec)
	for _, want := range []string{"FAILED", "base.json", "Target", "direct", "ttft_ms.p99", "lower is better", "+25.0%", "✗ fail",
		"−5.0%", "✓ pass", "higher is better"} {
		if !strings.Contains(s, want) {
			t.Errorf("baseline section lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "PASSED") {
		t.Error("a failed baseline says PASSED")
	}
	r.Baseline.Passed = true
	if _, doc = render(t, r); !strings.Contains(text(byID(doc, "baseline")), "PASSED") {
		t.Error("a passed baseline does not say PASSED")
	}
}

// TestWriteHTMLDegenerate feeds the corner cases a broken or tiny run can
// produce: nothing may reach the page as NaN or Inf, and nothing may fail.
func TestWriteHTMLDegenerate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	bad := result.Dist{N: 3, Mean: nan, P50: inf, P90: -inf, P99: nan, Max: inf}
	r := &result.Report{
		Parameters: result.Parameters{
			Targets: []result.Target{{Name: `<script>alert("x")</script>`, URL: "javascript:alert(1)"}},
			Models:  []result.Weight{{Value: "m", Weight: nan}, {Value: "n", Weight: inf}},
			SLO:     result.SLO{TTFTMs: nan, Percentile: inf},
		},
		DurationS: nan,
		Targets: []result.TargetResult{
			{
				Name:    `<script>alert("x")</script>`,
				Metrics: result.Metrics{TTFTMs: bad, ITLMs: bad, Throughput: result.Throughput{RequestsPerS: nan}, Goodput: result.Goodput{Fraction: inf}},
				CDF: result.CDFs{
					TTFTMs: [][2]float64{{12, 1}},                  // a single point
					ITLMs:  [][2]float64{{nan, 0.5}, {inf, 1}},     // nothing usable
					E2EMs:  [][2]float64{{0, 0}, {0, 0.5}, {0, 1}}, // all zero: no log axis
				},
				Timeline: []result.Bucket{{TS: 0, Phase: "warmup", TTFTP50Ms: nan, TTFTP99Ms: inf, OutputTokensPerS: nan}},
			},
			{Name: "empty"}, // zero samples
		},
		Sweep: &result.Sweep{Variable: "rate", Knee: 5, Points: []result.SweepPoint{
			{Load: 10, Metrics: result.Metrics{TTFTMs: result.Dist{N: 1, P99: 40, P50: 40}}, MeetsSLO: true},
		}},
		Compare: &result.Compare{A: "a", B: "b",
			DeltaTTFTMs: result.Delta{N: 2, P50: nan, P50CI95: [2]float64{inf, -inf}, Edges: []float64{0, 1, inf}, Counts: []int{1, 2, 3}},
			DeltaITLMs:  result.Delta{N: 1, P50: 1, Edges: []float64{1}, Counts: []int{1}, Max: 1}, // one bucket, no upper edge
			DeltaE2EMs:  result.Delta{Edges: []float64{1, 2, 3}, Counts: []int{4}},                 // more edges than counts
		},
		Baseline: &result.BaselineCheck{Checks: []result.BaselineMetric{{Metric: "x", Baseline: nan, Current: inf}}},
	}
	out, doc := render(t, r)
	if strings.Contains(out, `<script>alert`) {
		t.Error("a target name reached the page unescaped")
	}
	kinds := strings.Join(chartKinds(doc), " ")
	for _, want := range []string{"cdf-ttft/lin", "cdf-e2e", "timeline-ttft", "sweep-ttft", "delta-ttft", "delta-itl", "delta-e2e"} {
		if !strings.Contains(kinds, want) {
			t.Errorf("charts %q lack %s", kinds, want)
		}
	}
	if strings.Contains(kinds, "cdf-itl") {
		t.Errorf("a CDF with no finite point was drawn: %s", kinds)
	}
	// A one-point CDF is a dot, not an invisible one-point path.
	if c := chartOf(t, doc, "cdf-ttft"); len(find(c, "series")) != 0 {
		t.Error("one-point CDF drawn as a path")
	} else {
		dots := 0
		for n := range c.Descendants() {
			if n.Data == "circle" {
				dots++
			}
		}
		if dots != 1 {
			t.Errorf("one-point CDF has %d dots, want 1", dots)
		}
	}
	if strings.Contains(out, "knee:") {
		t.Error("an out-of-range knee index was drawn")
	}
}

func TestWriteHTMLTopLevelMetricsOnly(t *testing.T) {
	r := oneTarget()
	r.Metrics, r.Targets = r.Targets[0].Metrics, nil
	_, doc := render(t, r)
	if byID(doc, "summary") == nil || byID(doc, "h-target-0") == nil {
		t.Fatal("report with only top-level metrics has no summary")
	}
	if h := text(byID(doc, "h-target-0")); !strings.Contains(h, "direct") {
		t.Errorf("summary heading %q does not name the target from the parameters", h)
	}
	if len(charts(doc)) != 0 {
		t.Error("charts without any CDF or timeline")
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{num(0), "0"}, {num(0.1234), "0.123"}, {num(1.234), "1.23"}, {num(12.34), "12.3"},
		{num(1234.5), "1,234"}, {num(1234567), "1,234,567"}, {num(-1500), "−1,500"}, {num(math.NaN()), "–"},
		{signed(1.2), "+1.20"}, {signed(-0.5), "−0.500"}, {signed(0), "0"},
		{pct(0.997), "99.7%"}, {pct(1), "100%"}, {pct(math.Inf(1)), "–"},
		{seconds(5), "5 s"}, {seconds(72.45), "72.5 s"}, {seconds(600), "10 min 0 s"}, {seconds(3720), "1 h 2 min"},
		{integer(1440), "1,440"}, {integer(int64(-3)), "−3"},
		{signedFixed(-0.742, 1), "−0.7"}, {signedFixed(3.03, 1), "+3.0"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
