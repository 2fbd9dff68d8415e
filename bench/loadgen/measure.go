package loadgen

import (
	"math"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/stats"
)

// Histograms record microseconds with 3 significant digits, up to an hour
// (longer values are clamped; the exact maximum is kept beside).
const (
	histMax    = int64(time.Hour / time.Microsecond)
	histDigits = 3
	cdfPoints  = 300
)

// hist is an HDR histogram plus the exact count, sum, min and max, so
// the mean and extremes are not rounded to the histogram's buckets.
type hist struct {
	h        *hdrhistogram.Histogram
	n        int64
	sum      time.Duration
	min, max time.Duration
}

func newHist() *hist { return &hist{h: hdrhistogram.New(1, histMax, histDigits)} }

func (h *hist) record(d time.Duration) {
	d = max(d, 0)
	_ = h.h.RecordValue(min(d.Microseconds(), histMax))
	if h.n == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.sum += d
	h.n++
}

// dist summarises h in milliseconds; percentiles come from the histogram.
func (h *hist) dist() result.Dist {
	if h.n == 0 {
		return result.Dist{}
	}
	// A percentile is the value at its nearest rank (stats.Rank, the
	// definition the meter and the controller use), read as its bucket's
	// highest equivalent value; never one above the exact maximum. Asking
	// the histogram for exactly rank/n makes its own rounding land on rank.
	at := func(p float64) float64 {
		rank := stats.Rank(int(h.n), p/100)
		return min(float64(h.h.ValueAtPercentile(100*float64(rank)/float64(h.n)))/1000, stats.Ms(h.max))
	}
	return result.Dist{
		N:    h.n,
		Mean: stats.Ms(h.sum) / float64(h.n),
		P50:  at(50), P90: at(90), P95: at(95), P99: at(99), P999: at(99.9),
		Max: stats.Ms(h.max),
		Min: stats.Ms(h.min),
	}
}

// cdf returns at most cdfPoints [value_ms, quantile] pairs: dense over the
// body of the distribution and, on a log scale of 1−q, into the tail, so a
// chart shows p99.9 as well as the median.
func (h *hist) cdf() [][2]float64 {
	if h.n == 0 {
		return [][2]float64{}
	}
	type point struct{ v, q float64 }
	var pts []point
	var cum int64
	for _, b := range h.h.Distribution() {
		if b.Count == 0 {
			continue
		}
		cum += b.Count
		pts = append(pts, point{float64(b.To) / 1000, float64(cum) / float64(h.n)})
	}
	var targets []float64
	const body = 200
	for i := range body {
		targets = append(targets, 0.99*float64(i)/body)
	}
	for i := range cdfPoints - body - 1 {
		targets = append(targets, 1-0.01*math.Pow(10, -4*float64(i)/float64(cdfPoints-body-2)))
	}
	out := make([][2]float64, 0, cdfPoints)
	j := 0
	for _, q := range targets {
		for j < len(pts)-1 && pts[j].q < q {
			j++
		}
		p := [2]float64{min(pts[j].v, stats.Ms(h.max)), pts[j].q}
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	// The exact maximum closes the curve.
	if end := &out[len(out)-1]; end[1] == 1 {
		end[0] = stats.Ms(h.max)
	} else {
		out = append(out, [2]float64{stats.Ms(h.max), 1})
	}
	return out
}

// Result computes target i's metrics, timeline and CDFs. slo decides
// goodput (zero fields are not checked).
func (rec *Recording) Result(i int, slo result.SLO) result.TargetResult {
	ttft, ttftInt, tpot := newHist(), newHist(), newHist()
	e2e, e2eInt, stall, queue, lag := newHist(), newHist(), newHist(), newHist(), newHist()
	m := result.Metrics{Errors: result.Errors{ByClass: map[string]int{}}}
	var first, last time.Time
	var sources [4]int
	for k := range rec.Samples[i] {
		s := &rec.Samples[i][k]
		if s.Phase != Measure {
			continue
		}
		m.Requests.Sent++
		queue.record(s.Queue)
		lag.record(s.Lag())
		if first.IsZero() || s.Start.Before(first) {
			first = s.Start
		}
		if end := s.Start.Add(s.E2E); end.After(last) {
			last = end
		}
		if !s.OK() {
			m.Requests.Failed++
			m.Errors.Total++
			m.Errors.ByClass[s.Class]++
			if m.Errors.Examples == nil {
				m.Errors.Examples = map[string]string{}
			}
			if _, ok := m.Errors.Examples[s.Class]; !ok {
				m.Errors.Examples[s.Class] = s.Err
			}
			continue
		}
		m.Requests.Succeeded++
		if s.TTFT > 0 { // embeddings have no first token
			ttft.record(s.TTFT)
			ttftInt.record(s.TTFT + s.Lag())
		}
		e2e.record(s.E2E)
		e2eInt.record(s.E2E + s.Lag())
		if d, ok := s.TPOT(); ok {
			tpot.record(d)
		}
		if s.Gaps > 0 {
			stall.record(s.MaxGap)
		}
		m.InputTokens += int64(s.InputTokens)
		m.OutputTokens += int64(s.OutputTokens)
		sources[s.TokenSource]++
		if meetsSLO(s, slo) {
			m.Goodput.Requests++
		}
	}
	rec.mu.Lock()
	m.ITLMs = rec.itl[i].dist()
	itlCDF := rec.itl[i].cdf()
	rec.mu.Unlock()
	m.TTFTMs, m.TTFTIntendedMs, m.TPOTMs = ttft.dist(), ttftInt.dist(), tpot.dist()
	m.E2EMs, m.E2EIntendedMs, m.MaxStallMs = e2e.dist(), e2eInt.dist(), stall.dist()
	m.QueueMs, m.ScheduleLagMs = queue.dist(), lag.dist()
	m.TokenSource = tokenSource(sources)
	if last.After(first) {
		m.WindowS = last.Sub(first).Seconds()
		m.Throughput.RequestsPerS = float64(m.Requests.Succeeded) / m.WindowS
		m.Throughput.SentPerS = float64(m.Requests.Sent) / m.WindowS
		m.Throughput.OutputTokensPerS = float64(m.OutputTokens) / m.WindowS
		m.Throughput.TotalTokensPerS = float64(m.InputTokens+m.OutputTokens) / m.WindowS
		m.Goodput.RequestsPerS = float64(m.Goodput.Requests) / m.WindowS
	}
	if m.Requests.Sent > 0 {
		m.Goodput.Fraction = float64(m.Goodput.Requests) / float64(m.Requests.Sent)
	}
	m.Throughput.PeakConcurrency = rec.peakInFlight(i, first, last)
	return result.TargetResult{
		Name:     rec.Targets[i].Name,
		URL:      rec.Targets[i].URL,
		Metrics:  m,
		Timeline: rec.timeline(i),
		CDF:      result.CDFs{TTFTMs: ttft.cdf(), ITLMs: itlCDF, E2EMs: e2e.cdf()},
	}
}

// meetsSLO is the per-request goodput test (DistServe's definition: every
// SLO set is met). The ITL SLO applies to the request's TPOT, its mean time
// per token after the first, as vLLM's and AIPerf's goodput do.
func meetsSLO(s *Sample, slo result.SLO) bool {
	if slo.TTFTMs > 0 && stats.Ms(s.TTFT) > slo.TTFTMs {
		return false
	}
	if slo.E2EMs > 0 && stats.Ms(s.E2E) > slo.E2EMs {
		return false
	}
	if d, ok := s.TPOT(); ok && slo.ITLMs > 0 && stats.Ms(d) > slo.ITLMs {
		return false
	}
	return true
}

func tokenSource(n [4]int) string {
	var names []string
	for src, c := range n {
		if c > 0 {
			names = append(names, TokenSource(src).String())
		}
	}
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return "mixed"
}

// peakInFlight is the most of target i's requests (any phase) in flight at
// once within [from, to].
func (rec *Recording) peakInFlight(i int, from, to time.Time) int {
	type edge struct {
		t time.Time
		d int
	}
	var edges []edge
	for k := range rec.Samples[i] {
		s := &rec.Samples[i][k]
		end := s.Start.Add(s.E2E)
		if end.Before(from) || s.Start.After(to) {
			continue
		}
		edges = append(edges, edge{s.Start, 1}, edge{end, -1})
	}
	// Ends before starts at the same instant: back-to-back is not overlap.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.t.Compare(b.t); c != 0 {
			return c
		}
		return a.d - b.d
	})
	n, peak := 0, 0
	for _, e := range edges {
		n += e.d
		peak = max(peak, n)
	}
	return peak
}

// timeline buckets target i's whole run by second: completions and errors
// by completion time, TTFT by send time, output tokens spread evenly over
// each request's streaming time, in-flight requests at each bucket's end.
func (rec *Recording) timeline(i int) []result.Bucket {
	total := rec.End.Sub(rec.Start)
	n := int(math.Ceil(total.Seconds()))
	if n == 0 {
		return []result.Bucket{}
	}
	buckets := make([]result.Bucket, n)
	tokens := make([]float64, n)
	ttfts := make([][]float64, n)
	at := func(t time.Time) int { return min(max(int(t.Sub(rec.Start)/time.Second), 0), n-1) }
	for k := range rec.Samples[i] {
		s := &rec.Samples[i][k]
		end := s.Start.Add(s.E2E)
		if !s.OK() {
			buckets[at(end)].Errors++
			continue
		}
		buckets[at(end)].Completed++
		if s.TTFT > 0 {
			ttfts[at(s.Start)] = append(ttfts[at(s.Start)], stats.Ms(s.TTFT))
		}
		spread(tokens, s.Start.Add(s.TTFT).Sub(rec.Start), end.Sub(rec.Start), float64(s.OutputTokens))
	}
	for b := range buckets {
		bs := time.Duration(b) * time.Second
		width := min(time.Second, total-bs)
		buckets[b].TS = bs.Seconds()
		buckets[b].Phase = rec.phaseAt(bs).String()
		if width > 0 {
			buckets[b].OutputTokensPerS = tokens[b] / width.Seconds()
		}
		if v := ttfts[b]; len(v) > 0 {
			slices.Sort(v)
			buckets[b].TTFTP50Ms, buckets[b].TTFTP99Ms = stats.Percentile(v, 0.50), stats.Percentile(v, 0.99)
		}
	}
	// In flight at each bucket's end: started minus ended by then.
	starts := make([]time.Duration, 0, len(rec.Samples[i]))
	ends := make([]time.Duration, 0, len(rec.Samples[i]))
	for k := range rec.Samples[i] {
		s := &rec.Samples[i][k]
		starts = append(starts, s.Start.Sub(rec.Start))
		ends = append(ends, s.Start.Sub(rec.Start)+s.E2E)
	}
	slices.Sort(starts)
	slices.Sort(ends)
	si, ei := 0, 0
	for b := range buckets {
		edge := min(time.Duration(b+1)*time.Second, total)
		for si < len(starts) && starts[si] <= edge {
			si++
		}
		for ei < len(ends) && ends[ei] <= edge {
			ei++
		}
		buckets[b].InFlight = si - ei
	}
	return buckets
}

// spread adds v over [from, to) to per-second buckets, in proportion.
func spread(buckets []float64, from, to time.Duration, v float64) {
	last := len(buckets) - 1
	if to <= from {
		buckets[min(max(int(from/time.Second), 0), last)] += v
		return
	}
	rate := v / float64(to-from)
	for t := from; t < to; {
		b := min(max(int(t/time.Second), 0), last)
		next := min(time.Duration(b+1)*time.Second, to)
		if b == last {
			next = to
		}
		buckets[b] += rate * float64(next-t)
		t = next
	}
}

// phaseAt is the phase in force at offset t.
func (rec *Recording) phaseAt(t time.Duration) Phase {
	switch {
	case rec.CooldownFrom >= 0 && t >= rec.CooldownFrom:
		return Cooldown
	case rec.MeasureFrom >= 0 && t >= rec.MeasureFrom:
		return Measure
	}
	return Warmup
}
