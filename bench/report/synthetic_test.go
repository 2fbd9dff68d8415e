package report

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/infergate/infergate/bench/result"
)

// Synthetic reports for the tests and for docs/bench-report.png: what a run
// against a mock pool, direct and through the gateway, plausibly looks like.
// Seeded, so the page (and the screenshot) is the same on every run.

// samples is one target's simulated requests.
type samples struct {
	ttft, itl, tpot, e2e, stall []float64
	outTokens                   int64
}

// simulate draws n requests: log-normal TTFT and gaps, with rare stalls.
func simulate(rng *rand.Rand, n int, ttftMedian, overhead float64) samples {
	var s samples
	logn := func(median, sigma float64) float64 { return median * math.Exp(sigma*rng.NormFloat64()) }
	for range n {
		ttft := logn(ttftMedian, 0.32) + overhead + math.Abs(rng.NormFloat64())*0.3
		out := 64 + rng.IntN(192)
		e2e, stall := ttft, 0.0
		for range out - 1 {
			gap := logn(11, 0.22)
			if rng.Float64() < 0.0005 {
				gap += 40 + rng.Float64()*120 // a scheduler hiccup
			}
			s.itl = append(s.itl, gap)
			e2e += gap
			stall = max(stall, gap)
		}
		s.ttft = append(s.ttft, ttft)
		s.e2e = append(s.e2e, e2e)
		s.tpot = append(s.tpot, (e2e-ttft)/float64(out-1))
		s.stall = append(s.stall, stall)
		s.outTokens += int64(out)
	}
	return s
}

func dist(v []float64) result.Dist {
	if len(v) == 0 {
		return result.Dist{}
	}
	v = slices.Sorted(slices.Values(v))
	q := func(p float64) float64 { return v[min(len(v)-1, int(math.Ceil(p*float64(len(v))))-1)] }
	var sum float64
	for _, x := range v {
		sum += x
	}
	return result.Dist{N: int64(len(v)), Mean: sum / float64(len(v)), Min: v[0], Max: v[len(v)-1],
		P50: q(0.50), P90: q(0.90), P95: q(0.95), P99: q(0.99), P999: q(0.999)}
}

func cdf(v []float64, points int) [][2]float64 {
	v = slices.Sorted(slices.Values(v))
	out := make([][2]float64, 0, points+1)
	for i := range points + 1 {
		q := float64(i) / float64(points)
		out = append(out, [2]float64{v[max(0, int(math.Ceil(q*float64(len(v))))-1)], q})
	}
	return out
}

// metricsOf fills Metrics from simulated samples over a window.
func metricsOf(s samples, failed int, window float64) result.Metrics {
	ok := len(s.ttft)
	m := result.Metrics{
		Requests: result.Counts{Sent: ok + failed, Succeeded: ok, Failed: failed},
		TTFTMs:   dist(s.ttft), ITLMs: dist(s.itl), TPOTMs: dist(s.tpot), E2EMs: dist(s.e2e),
		MaxStallMs: dist(s.stall), TokenSource: "usage",
		InputTokens: int64(ok) * 384, OutputTokens: s.outTokens, WindowS: window,
	}
	m.TTFTIntendedMs, m.E2EIntendedMs = m.TTFTMs, m.E2EMs
	m.Throughput = result.Throughput{
		RequestsPerS:     float64(ok) / window,
		SentPerS:         float64(ok+failed) / window,
		OutputTokensPerS: float64(s.outTokens) / window,
		TotalTokensPerS:  float64(s.outTokens+m.InputTokens) / window,
		PeakConcurrency:  32,
	}
	good := 0
	for _, t := range s.ttft {
		if t <= 250 {
			good++
		}
	}
	m.Goodput = result.Goodput{RequestsPerS: float64(good) / window, Fraction: float64(good) / float64(ok+failed), Requests: good}
	return m
}

// timeline makes per-second buckets: 5 s warm-up, 60 s measured, 5 s
// cool-down while the last requests drain.
func timeline(rng *rand.Rand, ttftMedian, overhead float64) []result.Bucket {
	var tl []result.Bucket
	for s := range 70 {
		b := result.Bucket{TS: float64(s), Phase: "measure", InFlight: 32}
		load := 1.0
		switch {
		case s < 5:
			b.Phase, load = "warmup", float64(s+1)/5
		case s >= 65:
			b.Phase, load = "cooldown", math.Max(0, 1-float64(s-64)/5)
		}
		b.InFlight = int(32 * load)
		b.Completed = int(math.Round(24 * load * (1 + 0.05*rng.NormFloat64())))
		if s == 69 {
			b.Completed = 0
		}
		if b.Completed > 0 {
			wobble := 1 + 0.06*rng.NormFloat64()
			if s >= 38 && s <= 41 { // a short latency spike mid-run
				wobble *= 1.6
			}
			b.TTFTP50Ms = (ttftMedian*(0.8+0.2*load) + overhead) * wobble
			b.TTFTP99Ms = b.TTFTP50Ms * (2.1 + 0.15*rng.NormFloat64())
			b.OutputTokensPerS = float64(b.Completed) * 160 * (1 + 0.04*rng.NormFloat64())
		}
		if s == 40 {
			b.Errors = 2
		}
		tl = append(tl, b)
	}
	return tl
}

// delta summarises paired differences with a histogram of bins w wide.
func delta(d []float64, w float64) result.Delta {
	ds := dist(d)
	sd := 0.0
	for _, x := range d {
		sd += (x - ds.Mean) * (x - ds.Mean)
	}
	se := math.Sqrt(sd/float64(len(d)-1)) / math.Sqrt(float64(len(d)))
	out := result.Delta{
		N: len(d), Mean: ds.Mean, MeanCI95: [2]float64{ds.Mean - 1.96*se, ds.Mean + 1.96*se},
		P50: ds.P50, P50CI95: [2]float64{ds.P50 - 2.4*se, ds.P50 + 2.4*se},
		P90: ds.P90, P99: ds.P99, Min: ds.Min, Max: ds.Max,
	}
	lo := math.Floor(ds.Min/w) * w
	for e := lo; e <= ds.Max; e += w {
		out.Edges = append(out.Edges, e)
		out.Counts = append(out.Counts, 0)
	}
	for _, x := range d {
		out.Counts[min(int((x-lo)/w), len(out.Counts)-1)]++
	}
	return out
}

// richReport is a two-target run with timelines, CDFs, a concurrency sweep
// with a knee, a paired comparison and a baseline check: every section.
func richReport() *result.Report {
	rng := rand.New(rand.NewPCG(42, 7))
	const window = 60.0
	direct := simulate(rng, 1440, 38, 0)
	gateway := simulate(rng, 1436, 38, 1.1)

	targets := []result.TargetResult{
		{Name: "direct", URL: "http://127.0.0.1:18001/v1", Metrics: metricsOf(direct, 0, window), Timeline: timeline(rng, 38, 0)},
		{Name: "gateway", URL: "http://127.0.0.1:10000/v1", Metrics: metricsOf(gateway, 4, window), Timeline: timeline(rng, 38, 1.1)},
	}
	targets[1].Metrics.Errors = result.Errors{Total: 4,
		ByClass:  map[string]int{"http_429": 3, "timeout": 1},
		Examples: map[string]string{"http_429": "429 Too Many Requests: rate limit exceeded for key team-a (tokens/min)", "timeout": "no response within 30s"}}
	targets[1].Metrics.TokenSource = "mixed"
	for i, s := range []samples{direct, gateway} {
		targets[i].CDF = result.CDFs{TTFTMs: cdf(s.ttft, 300), ITLMs: cdf(s.itl, 300), E2EMs: cdf(s.e2e, 300)}
	}

	var dTTFT, dITL, dE2E []float64
	for i := range min(len(direct.ttft), len(gateway.ttft)) {
		dTTFT = append(dTTFT, 1.1+0.45*rng.NormFloat64()+0.1*math.Abs(rng.NormFloat64()))
		dITL = append(dITL, 0.02+0.05*rng.NormFloat64())
		dE2E = append(dE2E, dTTFT[i]+0.6*rng.NormFloat64())
	}

	sweep := &result.Sweep{Variable: "concurrency", Knee: -1}
	for i, c := range []float64{1, 2, 4, 8, 16, 32, 64, 128} {
		s := simulate(rng, 200, 30*(1+math.Pow(c/40, 2.2)), 1.1)
		m := metricsOf(s, 0, 30)
		m.Throughput.OutputTokensPerS = 2400 * c / (c + 20)
		m.Throughput.RequestsPerS = m.Throughput.OutputTokensPerS / 160
		p := result.SweepPoint{Load: c, Metrics: m, MeetsSLO: m.TTFTMs.P99 <= 250}
		if !p.MeetsSLO {
			p.Why = "ttft_ms p99 " + num(m.TTFTMs.P99) + " > 250"
		} else {
			sweep.Knee, sweep.KneeLoad = i, c
		}
		sweep.Points = append(sweep.Points, p)
	}

	gm := targets[1].Metrics
	return &result.Report{
		SchemaVersion: result.SchemaVersion, Tool: "infergate bench", Version: "v0.9.0",
		StartedAt: time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC), DurationS: 70,
		Parameters: result.Parameters{
			Targets: []result.Target{{Name: "direct", URL: targets[0].URL}, {Name: "gateway", URL: targets[1].URL}},
			Mode:    "closed", Concurrency: 32, DurationS: window, WarmupS: 5, CooldownS: 5, Stream: true,
			Models:       []result.Weight{{Value: "llama-3.1-8b-instruct", Weight: 3}, {Value: "qwen2.5-7b-instruct", Weight: 1}},
			InputTokens:  result.Range{Min: 128, Max: 1024, Dist: "normal", Mean: 384, StdDev: 128},
			OutputTokens: result.Range{Min: 64, Max: 256, Dist: "uniform"},
			SharedPrefix: &result.Prefix{Share: 0.5, Tokens: 256},
			Seed:         42, SLO: result.SLO{TTFTMs: 250, ITLMs: 50, Percentile: 99}, TimeoutS: 30,
		},
		Metrics: targets[0].Metrics,
		Targets: targets,
		Sweep:   sweep,
		Compare: &result.Compare{A: "direct", B: "gateway", Pairs: len(dTTFT),
			DeltaTTFTMs: delta(dTTFT, 0.2), DeltaITLMs: delta(dITL, 0.02), DeltaE2EMs: delta(dE2E, 0.25)},
		Join: &result.Join{Source: "http://127.0.0.1:9090", Requests: 1436, Joined: 1000,
			ClientMs:             result.Dist{N: 1000, P50: 412, P90: 455, P99: 520, Mean: 421},
			GatewayMs:            result.Dist{N: 1000, P50: 0.9, P90: 1.3, P99: 2.4, Mean: 1.0},
			ModerationMs:         result.Dist{N: 1000, P50: 0, P90: 0, P99: 0, Mean: 0},
			UpstreamFirstTokenMs: result.Dist{N: 1000, P50: 101, P90: 118, P99: 160, Mean: 104},
			DecodeMs:             result.Dist{N: 1000, P50: 309, P90: 330, P99: 352, Mean: 314},
			OutsideMs:            result.Dist{N: 1000, P50: 0.6, P90: 1.1, P99: 2.0, Mean: 0.7}},
		Baseline: &result.BaselineCheck{File: "bench/baseline.json", Passed: true, Checks: []result.BaselineMetric{
			{Metric: "ttft_ms.p99", Baseline: round1(gm.TTFTMs.P99 / 1.03), Current: gm.TTFTMs.P99, Tolerance: 0.10, Passed: true},
			{Metric: "itl_ms.p99", Baseline: round1(gm.ITLMs.P99 * 1.01), Current: gm.ITLMs.P99, Tolerance: 0.10, Passed: true},
			{Metric: "e2e_ms.p99", Baseline: round1(gm.E2EMs.P99 / 1.02), Current: gm.E2EMs.P99, Tolerance: 0.10, Passed: true},
			{Metric: "throughput.output_tokens_per_s", Baseline: round1(gm.Throughput.OutputTokensPerS * 1.01), Current: gm.Throughput.OutputTokensPerS, Tolerance: 0.05, HigherIsBetter: true, Passed: true},
		}},
	}
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }
