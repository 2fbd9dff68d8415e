package report

import (
	"bytes"
	"cmp"
	"image"
	"image/color"
	"image/png"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/infergate/infergate/bench/browser"
)

// The page is checked in a real browser: it must render every chart with no
// console message at all (a broken SVG attribute, a blocked resource or a
// CSS error would show up there), and the same run produces the screenshot
// in the docs:
//
//	UPDATE_SCREENSHOT=1 go -C bench test ./report/ -run Chromium

const (
	screenshotPath  = "../../docs/bench-report.png"
	screenshotLimit = 400 << 10 // bytes: it lives in the repository
	viewportWidth   = 1240
)

// chartBox is what the page reports about one chart.
type chartBox struct {
	Kind     string   `json:"kind"`
	Scale    string   `json:"scale"`
	Visible  bool     `json:"visible"`
	Width    float64  `json:"width"`
	Height   float64  `json:"height"`
	Overflow []string `json:"overflow"` // texts drawn outside the chart's canvas
}

// chartsJS measures every chart: its box, and whether any of its labels
// (whose widths Go only estimates) spill out of the viewBox.
const chartsJS = `Array.from(document.querySelectorAll("svg[data-chart]")).map(svg => {
	const r = svg.getBoundingClientRect();
	const visible = r.width > 0 && r.height > 0 && getComputedStyle(svg).visibility !== "hidden";
	const overflow = !visible ? [] : Array.from(svg.querySelectorAll("text")).filter(t => {
		const b = t.getBoundingClientRect();
		return b.left < r.left - 0.5 || b.top < r.top - 0.5 || b.right > r.right + 0.5 || b.bottom > r.bottom + 0.5;
	}).map(t => t.textContent);
	return {kind: svg.dataset.chart, scale: svg.dataset.scale || "", visible, width: r.width, height: r.height, overflow};
})`

func TestHTMLInChromium(t *testing.T) {
	r := richReport()
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "report.html")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	b := browser.Start(t, viewportWidth, 900)
	bctx := b.Ctx

	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+file)); err != nil {
		t.Fatalf("opening the report: %v", err)
	}
	boxes, err := chromedp.Run(bctx, chromedp.Evaluate[[]chartBox](chartsJS))
	if err != nil {
		t.Fatalf("measuring the charts: %v", err)
	}
	checkVisibleCharts(t, boxes, "as opened")

	// The screenshot shows the page as it opens, before the toggles below.
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}

	// Flipping every CDF's log switch must swap which of its two drawings
	// shows, with CSS alone.
	if err := chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](
		`document.querySelectorAll("input.logx").forEach(c => c.click())`)); err != nil {
		t.Fatal(err)
	}
	flipped, err := chromedp.Run(bctx, chromedp.Evaluate[[]chartBox](chartsJS))
	if err != nil {
		t.Fatal(err)
	}
	checkVisibleCharts(t, flipped, "after flipping the log switches")
	for i, b := range boxes {
		if b.Scale != "" && b.Visible == flipped[i].Visible {
			t.Errorf("%s/%s: the log switch did not change its visibility", b.Kind, b.Scale)
		}
	}

	got := b.Console(t)
	for _, m := range got {
		t.Errorf("console: %s (%s:%d)", m, m.URL, m.Line+1)
	}

	checkScreenshot(t, shot)
}

// checkVisibleCharts wants each chart kind shown exactly once (a CDF is
// drawn twice, one drawing hidden), with a real size and no label outside
// its canvas.
func checkVisibleCharts(t *testing.T, boxes []chartBox, when string) {
	t.Helper()
	want := []string{"cdf-ttft", "cdf-itl", "cdf-e2e", "timeline-ttft", "timeline-throughput",
		"sweep-ttft", "sweep-throughput", "delta-ttft", "delta-itl", "delta-e2e"}
	var shown []string
	for _, b := range boxes {
		if !b.Visible {
			continue
		}
		shown = append(shown, b.Kind)
		if b.Width < 300 || b.Height < 150 {
			t.Errorf("%s: %s/%s is %.0f×%.0f px", when, b.Kind, b.Scale, b.Width, b.Height)
		}
		if len(b.Overflow) > 0 {
			t.Errorf("%s: %s/%s has labels outside the chart: %q", when, b.Kind, b.Scale, b.Overflow)
		}
	}
	if !slices.Equal(shown, want) {
		t.Errorf("%s: visible charts %v, want %v", when, shown, want)
	}
}

// checkScreenshot decodes the screenshot and, with UPDATE_SCREENSHOT=1,
// writes it to the docs.
func checkScreenshot(t *testing.T, shot []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != viewportWidth || b.Dy() < 2000 {
		t.Errorf("screenshot is %v, want %d px wide and the whole page tall", b.Size(), viewportWidth)
	}
	if os.Getenv("UPDATE_SCREENSHOT") == "" {
		return
	}
	var out bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&out, quantize(img)); err != nil {
		t.Fatal(err)
	}
	if out.Len() > screenshotLimit {
		t.Fatalf("screenshot is %d KiB, over the %d KiB limit", out.Len()>>10, screenshotLimit>>10)
	}
	if err := os.WriteFile(screenshotPath, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d KiB)", screenshotPath, out.Len()>>10)
}

// quantize maps img onto its 256 most frequent colours. A page is mostly
// flat colour, so this is invisible except on the anti-aliased edges, and
// the 8-bit PNG is less than half the size of the RGBA one.
func quantize(img image.Image) *image.Paletted {
	b := img.Bounds()
	counts := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	common := slices.SortedFunc(maps.Keys(counts), func(p, q color.RGBA) int {
		return cmp.Or(cmp.Compare(counts[q], counts[p]), cmp.Compare(rgbaKey(p), rgbaKey(q)))
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range common[:min(256, len(common))] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(b, pal)
	nearest := map[color.RGBA]uint8{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := nearest[c]
			if !ok {
				i = uint8(pal.Index(c))
				nearest[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	return out
}

func rgbaKey(c color.RGBA) uint32 {
	return uint32(c.R)<<24 | uint32(c.G)<<16 | uint32(c.B)<<8 | uint32(c.A)
}
