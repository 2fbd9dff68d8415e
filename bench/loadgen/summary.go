package loadgen

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Summary condenses one target's samples. Latency percentiles and
// throughput cover successful requests only; failures are counted in Errors.
type Summary struct {
	Target             string        `json:"target"`
	Requests           int           `json:"requests"` // all samples, failed ones included
	Errors             int           `json:"errors"`
	TTFT               Percentiles   `json:"ttft"`
	ITL                Percentiles   `json:"itl"` // all gaps of all successful requests, pooled
	E2E                Percentiles   `json:"e2e"`
	OutputTokensPerSec float64       `json:"output_tokens_per_sec"` // successful requests' output tokens / Duration
	RequestsPerSec     float64       `json:"requests_per_sec"`      // successful requests / Duration
	Duration           time.Duration `json:"duration_ns"`           // the wall time passed to Summarize
}

// Percentiles are nearest-rank percentiles: P95 is the smallest value at
// least 95% of the N values are less than or equal to. All are zero when N
// is zero.
type Percentiles struct {
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	N   int           `json:"n"`
}

// Summarize computes name's summary from its samples. wall is the time the
// run took; with interleaved targets it is the whole run's wall time, shared
// by every target.
func Summarize(name string, samples []Sample, wall time.Duration) Summary {
	sum := Summary{Target: name, Requests: len(samples), Duration: wall}
	var ttft, itl, e2e []time.Duration
	ok, tokens := 0, 0
	for _, s := range samples {
		if s.Err != "" {
			sum.Errors++
			continue
		}
		ok++
		tokens += s.OutputTokens
		ttft = append(ttft, s.TTFT)
		e2e = append(e2e, s.E2E)
		itl = append(itl, s.Gaps...)
	}
	sum.TTFT, sum.ITL, sum.E2E = percentiles(ttft), percentiles(itl), percentiles(e2e)
	if wall > 0 {
		sum.RequestsPerSec = float64(ok) / wall.Seconds()
		sum.OutputTokensPerSec = float64(tokens) / wall.Seconds()
	}
	return sum
}

// percentiles sorts d in place.
func percentiles(d []time.Duration) Percentiles {
	n := len(d)
	if n == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	rank := func(p int) time.Duration { return d[(p*n+99)/100-1] } // ceil(p/100 * n), 1-based
	return Percentiles{P50: rank(50), P95: rank(95), P99: rank(99), Max: d[n-1], N: n}
}

// WriteTable writes sums side by side: one row per metric, one column per
// target and, for exactly two targets, a "delta" column (second minus
// first). A "-" marks a metric with no data (every request failed).
func WriteTable(w io.Writer, sums []Summary) {
	type metric struct {
		label string
		cell  func(Summary) (float64, bool)
		fmt   func(v float64, signed bool) string
	}
	dur := func(pick func(Summary) Percentiles, at func(Percentiles) time.Duration) func(Summary) (float64, bool) {
		return func(s Summary) (float64, bool) {
			p := pick(s)
			return float64(at(p)) / float64(time.Millisecond), p.N > 0
		}
	}
	ms := func(v float64, signed bool) string { return num(v, 2, signed) + "ms" }
	rate := func(v float64, signed bool) string { return num(v, 1, signed) }
	ttft := func(s Summary) Percentiles { return s.TTFT }
	itl := func(s Summary) Percentiles { return s.ITL }
	e2e := func(s Summary) Percentiles { return s.E2E }
	p50 := func(p Percentiles) time.Duration { return p.P50 }
	p95 := func(p Percentiles) time.Duration { return p.P95 }
	p99 := func(p Percentiles) time.Duration { return p.P99 }
	always := func(get func(Summary) float64) func(Summary) (float64, bool) {
		return func(s Summary) (float64, bool) { return get(s), true }
	}
	metrics := []metric{
		{"TTFT p50", dur(ttft, p50), ms},
		{"TTFT p95", dur(ttft, p95), ms},
		{"TTFT p99", dur(ttft, p99), ms},
		{"ITL p50", dur(itl, p50), ms},
		{"ITL p95", dur(itl, p95), ms},
		{"ITL p99", dur(itl, p99), ms},
		{"E2E p50", dur(e2e, p50), ms},
		{"E2E p95", dur(e2e, p95), ms},
		{"req/s", always(func(s Summary) float64 { return s.RequestsPerSec }), rate},
		{"output tok/s", always(func(s Summary) float64 { return s.OutputTokensPerSec }), rate},
	}

	delta := len(sums) == 2
	header := []string{"metric"}
	for _, s := range sums {
		header = append(header, s.Target)
	}
	if delta {
		header = append(header, "delta")
	}
	rows := [][]string{header}
	for _, m := range metrics {
		row := []string{m.label}
		var vals [2]float64
		var have [2]bool
		for i, s := range sums {
			v, ok := m.cell(s)
			if i < 2 {
				vals[i], have[i] = v, ok
			}
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, m.fmt(v, false))
		}
		if delta {
			d := "-"
			if have[0] && have[1] {
				d = m.fmt(vals[1]-vals[0], true)
			}
			row = append(row, d)
		}
		rows = append(rows, row)
	}
	errRow := []string{"errors"}
	for _, s := range sums {
		errRow = append(errRow, fmt.Sprintf("%d/%d", s.Errors, s.Requests))
	}
	if delta {
		errRow = append(errRow, fmt.Sprintf("%+d", sums[1].Errors-sums[0].Errors))
	}
	rows = append(rows, errRow)

	writeAligned(w, rows)
	if len(sums) > 1 && sharedWall(sums) {
		fmt.Fprintln(w, "\nreq/s and output tok/s divide each target's successful requests by one shared wall")
		fmt.Fprintln(w, "clock: the targets were interleaved on the same workers, so these rows are not")
		fmt.Fprintln(w, "independent per-target throughputs. Compare targets on the latency rows.")
	}
}

func sharedWall(sums []Summary) bool {
	for _, s := range sums[1:] {
		if s.Duration != sums[0].Duration {
			return false
		}
	}
	return true
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
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.Reset()
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-len(c))
			if i == 0 {
				b.WriteString(c + pad)
				continue
			}
			b.WriteString("  " + pad + c)
		}
		fmt.Fprintln(w, b.String())
	}
}

func num(v float64, prec int, signed bool) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if signed && !strings.HasPrefix(s, "-") {
		s = "+" + s
	}
	return s
}
