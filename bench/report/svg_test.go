package report

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestLinearAxis(t *testing.T) {
	tests := []struct {
		lo, hi   float64
		n        int
		withZero bool
		want     []float64
	}{
		{0, 100, 6, true, []float64{0, 20, 40, 60, 80, 100}},
		{12.3, 117, 7, false, []float64{0, 20, 40, 60, 80, 100, 120}},
		{-0.24, 2.55, 7, false, []float64{-0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3}},
		{0.1, 0.7, 4, true, []float64{0, 0.2, 0.4, 0.6, 0.8}},
		{0, 0, 5, true, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}}, // nothing measured
		{40, 40, 5, false, []float64{20, 30, 40, 50, 60}},    // a single value gets room
		{math.NaN(), math.Inf(1), 5, true, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
	}
	for _, tt := range tests {
		a := linearAxis(tt.lo, tt.hi, tt.n, tt.withZero)
		if !slices.Equal(a.ticks, tt.want) {
			t.Errorf("linearAxis(%v, %v, %d, %v) ticks = %v, want %v", tt.lo, tt.hi, tt.n, tt.withZero, a.ticks, tt.want)
		}
		if a.lo != tt.want[0] || a.hi != tt.want[len(tt.want)-1] {
			t.Errorf("linearAxis(%v, %v) domain = [%v, %v], want the outer ticks", tt.lo, tt.hi, a.lo, a.hi)
		}
	}
}

func TestLogAxis(t *testing.T) {
	tests := []struct {
		lo, hi float64
		want   []float64
	}{
		{4.2, 177, []float64{2, 5, 10, 20, 50, 100, 200}},
		{1, 128, []float64{1, 2, 5, 10, 20, 50, 100, 200}},
		{0.05, 40000, []float64{0.01, 0.1, 1, 10, 100, 1000, 10000, 100000}}, // many decades: powers of ten only
		{10, 10, []float64{5, 10, 20}},
		{0, 10, []float64{1, 2, 5, 10}}, // impossible domain: a default
	}
	for _, tt := range tests {
		a := logAxis(tt.lo, tt.hi)
		if !slices.EqualFunc(a.ticks, tt.want, func(x, y float64) bool { return math.Abs(x-y) < 1e-9*y }) {
			t.Errorf("logAxis(%v, %v) ticks = %v, want %v", tt.lo, tt.hi, a.ticks, tt.want)
		}
	}
}

func TestAxisPos(t *testing.T) {
	a := linearAxis(0, 100, 6, true)
	a.a, a.b = 50, 550
	for _, tt := range []struct{ v, want float64 }{
		{0, 50}, {50, 300}, {100, 550},
		{-10, 50}, {1e9, 550}, // clamped into the plot
		{math.NaN(), 50},
	} {
		if got := a.pos(tt.v); got != tt.want {
			t.Errorf("pos(%v) = %v, want %v", tt.v, got, tt.want)
		}
	}
	l := logAxis(1, 100)
	l.a, l.b = 0, 200
	if got := l.pos(10); math.Abs(got-100) > 1e-9 {
		t.Errorf("log pos(10) on [1, 100] = %v, want 100", got)
	}
	if l.inDomain(0) || l.inDomain(-1) || !l.inDomain(0.5) {
		t.Error("log axis must reject zero and negatives, and only those")
	}
}

func TestPxString(t *testing.T) {
	for v, want := range map[float64]string{
		12.345: "12.3", 0: "0", -3.06: "-3.1", 200: "200",
		math.NaN(): "0", math.Inf(1): "0", math.Inf(-1): "0",
	} {
		if got := px(v).String(); got != want {
			t.Errorf("px(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestTickLabel(t *testing.T) {
	for _, tt := range []struct {
		v, step float64
		want    string
	}{
		{0, 20, "0"}, {40, 20, "40"}, {0.5, 0.5, "0.5"}, {0.25, 0.05, "0.25"},
		{-0.1, 0.1, "−0.1"}, {25000, 5000, "25k"}, {2.5e6, 5e5, "2.5M"},
		{0.01, 0, "0.01"}, {200, 0, "200"}, // log axes: no step
	} {
		if got := tickLabel(tt.v, tt.step); got != tt.want {
			t.Errorf("tickLabel(%v, %v) = %q, want %q", tt.v, tt.step, got, tt.want)
		}
	}
}

func TestAddLine(t *testing.T) {
	c := newChart("c", "k", "t", "x", "y", linearAxis(0, 10, 6, true), linearAxis(0, 10, 6, true))
	c.addLine([][2]float64{{0, 0}, {1, 1}, {math.NaN(), 2}, {3, 3}, {4, math.Inf(1)}, {5, 5}, {5.001, 5.001}}, "#000", "", "s")
	if len(c.Lines) != 1 {
		t.Fatalf("got %d lines, want 1", len(c.Lines))
	}
	d := c.Lines[0].D
	// Non-finite points lift the pen (three M segments); the last point
	// lands on the previous pixel and is dropped.
	if n := strings.Count(d, "M"); n != 3 {
		t.Errorf("path %q has %d segments, want 3", d, n)
	}
	if n := strings.Count(d, "L"); n != 1 {
		t.Errorf("path %q has %d line-tos, want 1", d, n)
	}

	one := newChart("c", "k", "t", "x", "y", linearAxis(0, 10, 6, true), linearAxis(0, 10, 6, true))
	one.addLine([][2]float64{{3, 3}}, "#000", "", "single")
	if len(one.Lines) != 0 || len(one.Points) != 1 {
		t.Errorf("a one-point series drew %d lines and %d points, want a dot", len(one.Lines), len(one.Points))
	}

	none := newChart("c", "k", "t", "x", "y", logAxis(1, 10), linearAxis(0, 10, 6, true))
	none.addLine([][2]float64{{0, 1}, {-1, 2}}, "#000", "", "nothing on a log axis")
	if none.finish().Note == "" {
		t.Error("a chart with nothing drawable has no note")
	}
}

func TestLegendWraps(t *testing.T) {
	c := newChart("c", "k", "t", "x", "y", linearAxis(0, 1, 2, true), linearAxis(0, 1, 2, true))
	for _, l := range []string{"direct p50", "direct p99", "gateway p50", "gateway p99", "warm-up / cool-down"} {
		c.addLegend("#000", "", "line", l)
	}
	c.finish()
	last := c.Legend[len(c.Legend)-1]
	if last.Y == c.Legend[0].Y {
		t.Fatal("legend did not wrap onto a second row")
	}
	if c.Shift == 0 || c.H != chartH+c.Shift {
		t.Errorf("Shift = %v, H = %v: the plot must move down by a legend row", c.Shift, c.H)
	}
	for _, it := range c.Legend {
		if float64(it.X) > chartW-marginR {
			t.Errorf("legend item %q starts at %v, outside the canvas", it.Label, it.X)
		}
	}
}
