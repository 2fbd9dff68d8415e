package controller

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/stats"
)

// sloQuantile is the quantile the latency SLAs are judged at.
const sloQuantile = 0.95

// judge computes a pool's statistics over the Window and its verdict.
func (c *Controller) judge(p *poolState, sla SLA, t Tuning, now time.Time) PoolStats {
	cut := max(now.Add(-t.Window).UnixNano(), p.judgeFrom.UnixNano())
	slope := fitSlope(p.buf, now.Add(-t.BaselineWindow).UnixNano(), t)
	st, itlSamples := c.windowStats(p, cut, slope)
	v := decide(st, itlSamples, sla, t)
	st.Breached, st.Healthy, st.Why = v.breached, v.healthy, reason(v, t)
	return st
}

// fitSlope is the slope of TTFT on prompt tokens, in nanoseconds per token,
// over the successful samples at or after since (the baseline window): by
// least squares on centred values (two passes, for numerical stability),
// clamped at 0. It is t.PrefillPerToken, the prior, unless there are at
// least 2*MinSamples such samples whose prompt lengths spread enough
// (coefficient of variation > minPromptCV) to identify it.
func fitSlope(buf []sample, since int64, t Tuning) float64 {
	var n int
	var sx, sy float64
	for _, s := range buf {
		if s.at >= since && !s.failed && !s.untimed {
			n++
			sx += float64(s.tokens)
			sy += float64(s.ttft)
		}
	}
	prior := float64(t.PrefillPerToken)
	if n < 2*t.MinSamples || n <= 1 || !(sx > 0) {
		return prior
	}
	mx, my := sx/float64(n), sy/float64(n)
	var sxx, sxy float64
	for _, s := range buf {
		if s.at >= since && !s.failed && !s.untimed {
			dx := float64(s.tokens) - mx
			sxx += dx * dx
			sxy += dx * (float64(s.ttft) - my)
		}
	}
	if sxx > 0 && math.Sqrt(sxx/float64(n))/mx > minPromptCV {
		return max(0, sxy/sxx)
	}
	return prior
}

// windowStats summarises a pool's samples at or after since (the window):
// their number, the error rate, the p95 of excess TTFT (beyond slope ×
// prompt tokens), of raw TTFT and of ITL over the successful ones, and the
// pool's load if reported within the window (-1 otherwise). It leaves the
// verdict (Breached, Healthy, Why) unset and also returns how many samples
// carried an ITL. The controller's scratch buffers hold the values.
func (c *Controller) windowStats(p *poolState, since int64, slope float64) (st PoolStats, itlSamples int) {
	excess, ttft, itl := c.excess[:0], c.ttft[:0], c.itl[:0]
	samples, failed := 0, 0
	for _, s := range p.buf {
		if s.at < since {
			continue
		}
		samples++
		if s.failed {
			// A failure has no meaningful latency: it counts toward the
			// error rate only.
			failed++
			continue
		}
		if s.untimed {
			continue // a success whose latency the meter could not vouch for
		}
		ttft = append(ttft, s.ttft)
		excess = append(excess, max(0, s.ttft-int64(slope*float64(s.tokens))))
		if s.itl > 0 {
			itl = append(itl, s.itl)
		}
	}
	c.excess, c.ttft, c.itl = excess, ttft, itl
	slices.Sort(excess)
	slices.Sort(ttft)
	slices.Sort(itl)

	st = PoolStats{
		Samples:       samples,
		ExcessTTFTP95: time.Duration(stats.Percentile(excess, sloQuantile)),
		TTFTP95:       time.Duration(stats.Percentile(ttft, sloQuantile)),
		ITLP95:        time.Duration(stats.Percentile(itl, sloQuantile)),
		Slope:         time.Duration(math.Round(slope)),
	}
	if samples > 0 {
		st.ErrorRate = float64(failed) / float64(samples)
	}
	st.QueueDepth, st.KVCacheUsage = -1, -1
	if !p.load.At.IsZero() && p.load.At.UnixNano() >= since {
		st.QueueDepth, st.KVCacheUsage = p.load.Waiting, p.load.KVCacheUsage
	}
	return st, len(itl)
}

// metric is one SLA metric a verdict weighs.
type metric uint8

const (
	excessTTFT metric = iota
	itlP95
	errorRate
	queueDepth
	numMetrics
)

func (m metric) String() string {
	return [...]string{"excess TTFT p95", "ITL p95", "error rate", "queue depth"}[m]
}

// show renders a value of the metric.
func (m metric) show(v float64) string {
	switch m {
	case excessTTFT, itlP95:
		return fmtDur(time.Duration(v))
	case errorRate:
		return fmt.Sprintf("%.1f%%", 100*v)
	}
	return fmt.Sprintf("%.0f", v)
}

// level is where a metric stands against its threshold.
type level uint8

const (
	fine level = iota // below the threshold less hysteresis
	band              // between the threshold less hysteresis and the threshold
	over              // above the threshold
)

// check is one metric weighed against its threshold.
type check struct {
	metric       metric
	val, limit   float64
	healthyBelow float64 // (1 - Hysteresis) × limit
	level        level
}

// verdict is how a pool stands against its SLA.
type verdict struct {
	samples int
	// judged: at least MinSamples in the window. Otherwise the pool is
	// unknown, unless its queue alone breaches.
	judged   bool
	breached bool // some check over its threshold
	healthy  bool // judged, and every check below its threshold less hysteresis
	checks   [numMetrics]check
	n        int // checks made, in metric order
}

func (v *verdict) weigh(m metric, val, limit, hysteresis float64) {
	c := check{metric: m, val: val, limit: limit, healthyBelow: (1 - hysteresis) * limit}
	switch {
	case val > limit:
		c.level = over
		v.breached = true
	case val >= c.healthyBelow:
		c.level = band
	}
	v.checks[v.n] = c
	v.n++
}

// decide weighs a pool's window statistics against its SLA: a pool with
// fewer than MinSamples samples is unknown (but breached by its queue
// alone); otherwise each enabled metric is checked (ITL only with at least
// MinSamples streamed samples, the queue only if reported), the pool is
// breached when one is over its threshold, and healthy when all are below
// it less the hysteresis.
func decide(st PoolStats, itlSamples int, sla SLA, t Tuning) verdict {
	v := verdict{samples: st.Samples, judged: st.Samples >= t.MinSamples}
	if !v.judged {
		// A queueing pool finishes few requests: its queue speaks for it.
		if sla.QueueDepth > 0 && st.QueueDepth > sla.QueueDepth {
			v.weigh(queueDepth, st.QueueDepth, sla.QueueDepth, t.Hysteresis)
		}
		return v
	}
	if sla.TTFTP95 > 0 {
		v.weigh(excessTTFT, float64(st.ExcessTTFTP95), float64(sla.TTFTP95), t.Hysteresis)
	}
	if sla.ITLP95 > 0 && itlSamples >= t.MinSamples {
		// Too few streamed requests: ITL is not judged.
		v.weigh(itlP95, float64(st.ITLP95), float64(sla.ITLP95), t.Hysteresis)
	}
	if sla.ErrorRate > 0 {
		v.weigh(errorRate, st.ErrorRate, sla.ErrorRate, t.Hysteresis)
	}
	if sla.QueueDepth > 0 && st.QueueDepth >= 0 {
		v.weigh(queueDepth, st.QueueDepth, sla.QueueDepth, t.Hysteresis)
	}
	v.healthy = !v.breached
	for _, c := range v.checks[:v.n] {
		v.healthy = v.healthy && c.level == fine
	}
	return v
}

// reason renders a verdict as PoolStats.Why, e.g. "excess TTFT p95 412ms >
// SLA 300ms".
func reason(v verdict, t Tuning) string {
	checks := v.checks[:v.n]
	if !v.judged {
		if v.breached {
			c := checks[0]
			return fmt.Sprintf("%s %s > SLA %s (%d samples)", c.metric, c.metric.show(c.val), c.metric.show(c.limit), v.samples)
		}
		return fmt.Sprintf("unknown: %d samples in %s < MinSamples %d", v.samples, t.Window, t.MinSamples)
	}
	var overs, bands, fines []string
	for _, c := range checks {
		m := c.metric
		switch c.level {
		case over:
			overs = append(overs, fmt.Sprintf("%s %s > SLA %s", m, m.show(c.val), m.show(c.limit)))
		case band:
			bands = append(bands, fmt.Sprintf("%s %s >= %s (SLA %s less %.0f%% hysteresis)",
				m, m.show(c.val), m.show(c.healthyBelow), m.show(c.limit), 100*t.Hysteresis))
		default:
			fines = append(fines, fmt.Sprintf("%s %s < %s", m, m.show(c.val), m.show(c.healthyBelow)))
		}
	}
	switch {
	case v.breached:
		return strings.Join(overs, "; ")
	case len(bands) > 0:
		return "not yet healthy: " + strings.Join(bands, "; ")
	case len(fines) > 0:
		return "healthy: " + strings.Join(fines, "; ")
	}
	return "healthy"
}

// fmtDur rounds a duration for display.
func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= 10*time.Microsecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.String()
}
