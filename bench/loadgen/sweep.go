package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/stats"
)

// SweepSpec is a --sweep: the load variable and its levels, ascending.
type SweepSpec struct {
	Variable string // "concurrency" or "rate"
	Levels   []float64
}

// ParseSweep reads "concurrency=1,2,4,8" or "rate=0.5,1,2", or the
// geometric form "VAR=START:STOP:FACTOR" (START, START·FACTOR, … ≤ STOP).
func ParseSweep(s string) (SweepSpec, error) {
	v, list, ok := strings.Cut(s, "=")
	spec := SweepSpec{Variable: strings.TrimSpace(v)}
	if !ok || (spec.Variable != "concurrency" && spec.Variable != "rate") {
		return spec, fmt.Errorf("want concurrency=LEVELS or rate=LEVELS, got %q", s)
	}
	if parts := strings.Split(list, ":"); len(parts) == 3 {
		var f [3]float64
		for i, p := range parts {
			x, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil {
				return spec, fmt.Errorf("want START:STOP:FACTOR, got %q", list)
			}
			f[i] = x
		}
		if !(f[0] > 0) || f[1] < f[0] || !(f[2] > 1) || f[1]/f[0] > 1e6 {
			return spec, fmt.Errorf("want 0 < START <= STOP and FACTOR > 1, got %q", list)
		}
		for x := f[0]; x <= f[1]*(1+1e-9); x *= f[2] {
			spec.Levels = append(spec.Levels, x)
		}
	} else {
		for p := range strings.SplitSeq(list, ",") {
			x, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil || !(x > 0) || math.IsInf(x, 0) {
				return spec, fmt.Errorf("want positive levels, got %q", p)
			}
			spec.Levels = append(spec.Levels, x)
		}
	}
	if spec.Variable == "concurrency" {
		for i, x := range spec.Levels {
			spec.Levels[i] = math.Round(x)
		}
	}
	slices.Sort(spec.Levels)
	spec.Levels = slices.Compact(spec.Levels)
	if len(spec.Levels) == 0 || spec.Levels[0] <= 0 {
		return spec, fmt.Errorf("no positive levels in %q", s)
	}
	return spec, nil
}

// Sweep runs cfg once per level of spec (same seed, so the same requests)
// against cfg's first target and judges each level against slo. onLevel,
// if set, is called before each level starts. It returns the sweep and
// each level's recording; on error, the levels completed so far.
func Sweep(ctx context.Context, cfg Config, spec SweepSpec, slo result.SLO, onLevel func(i int, load float64)) (*result.Sweep, []*Recording, error) {
	if len(cfg.Targets) != 1 {
		return nil, nil, errors.New("loadgen: a sweep measures one target")
	}
	sw := &result.Sweep{Variable: spec.Variable, Knee: -1}
	var recs []*Recording
	for i, load := range spec.Levels {
		c := cfg
		if spec.Variable == "rate" {
			c.Rate = load
		} else {
			c.Rate, c.Concurrency = 0, int(load)
		}
		if onLevel != nil {
			onLevel(i, load)
		}
		rec, err := Run(ctx, c)
		if err != nil {
			return sw, recs, err
		}
		recs = append(recs, rec)
		meets, why := rec.Judge(0, slo)
		sw.Points = append(sw.Points, result.SweepPoint{Load: load, Metrics: rec.Result(0, slo).Metrics, MeetsSLO: meets, Why: why})
	}
	sw.Knee = Knee(sw.Points)
	if sw.Knee >= 0 {
		sw.KneeLoad = sw.Points[sw.Knee].Load
	}
	return sw, recs, nil
}

// Knee is the index of the highest load that met the SLO, or -1.
func Knee(points []result.SweepPoint) int {
	knee := -1
	for i, p := range points {
		if p.MeetsSLO && (knee < 0 || p.Load > points[knee].Load) {
			knee = i
		}
	}
	return knee
}

// Judge reports whether target i's measured requests meet slo at its
// percentile (default 99): failed requests count as missing every SLO, and
// the percentile of each SLO'd metric over the requests sent must be within
// its limit. The ITL SLO is judged on TPOT, as for goodput. why names the
// first miss.
func (rec *Recording) Judge(i int, slo result.SLO) (meets bool, why string) {
	p := slo.Percentile
	if p <= 0 || p > 100 {
		p = 99
	}
	label := strconv.FormatFloat(p, 'f', -1, 64)
	sent, failed := 0, 0
	for k := range rec.Samples[i] {
		if s := &rec.Samples[i][k]; s.Phase == Measure {
			sent++
			if !s.OK() {
				failed++
			}
		}
	}
	// Failures miss every SLO, so they alone can fail a level.
	if sent == 0 || float64(sent-failed) < p/100*float64(sent) {
		return false, fmt.Sprintf("p%s: %d of %d requests failed", label, failed, sent)
	}
	checks := []struct {
		name  string
		limit float64
		value func(*Sample) (time.Duration, bool)
	}{
		{"ttft_ms", slo.TTFTMs, func(s *Sample) (time.Duration, bool) { return s.TTFT, true }},
		{"tpot_ms", slo.ITLMs, (*Sample).TPOT},
		{"e2e_ms", slo.E2EMs, func(s *Sample) (time.Duration, bool) { return s.E2E, true }},
	}
	for _, c := range checks {
		if c.limit <= 0 {
			continue
		}
		var vals []float64
		for k := range rec.Samples[i] {
			s := &rec.Samples[i][k]
			switch {
			case s.Phase != Measure:
			case !s.OK():
				vals = append(vals, math.Inf(1))
			default:
				if d, ok := c.value(s); ok {
					vals = append(vals, stats.Ms(d))
				}
			}
		}
		if len(vals) == 0 {
			continue
		}
		slices.Sort(vals)
		if v := stats.Percentile(vals, p/100); v > c.limit {
			return false, fmt.Sprintf("%s p%s %.1f > %g", c.name, label, v, c.limit)
		}
	}
	return true, ""
}
