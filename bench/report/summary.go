package report

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/infergate/infergate/bench/result"
)

// The tables of the page: parameters, per-target summaries, the overview
// across targets and the baseline check.

// params describes how the run was configured, in words.
func params(r *result.Report) []kv {
	p := r.Parameters
	var out []kv
	add := func(k, v string) {
		if v != "" {
			out = append(out, kv{k, v})
		}
	}
	var targets []string
	for _, t := range p.Targets {
		s := t.Name
		if t.URL != "" {
			s += " — " + t.URL
		}
		targets = append(targets, s)
	}
	add("Targets", strings.Join(targets, "; "))

	switch p.Mode {
	case "closed":
		add("Mode", fmt.Sprintf("closed loop, %s users per target", integer(p.Concurrency)))
	case "open":
		s := fmt.Sprintf("open loop, %s req/s", plain(p.RatePerS))
		if p.Arrival != "" {
			s += ", " + p.Arrival + " arrivals"
		}
		if p.Arrival == "gamma" && p.Burstiness > 0 {
			s += fmt.Sprintf(" (burstiness %s)", plain(p.Burstiness))
		}
		if p.Concurrency > 0 {
			s += fmt.Sprintf(", at most %s in flight", integer(p.Concurrency))
		}
		add("Mode", s)
	default:
		add("Mode", p.Mode)
	}
	add("Ramp-up", p.RampUp)
	switch {
	case p.Requests > 0:
		add("Load", integer(p.Requests)+" requests per target")
	case p.DurationS > 0:
		add("Load", seconds(p.DurationS)+" measurement window")
	}
	if p.WarmupS > 0 || p.CooldownS > 0 || p.WarmupRequests > 0 || p.CooldownRequests > 0 {
		add("Warm-up / cool-down", phaseBound(p.WarmupS, p.WarmupRequests)+" / "+phaseBound(p.CooldownS, p.CooldownRequests))
	}
	if p.Mode != "" || len(p.Targets) > 0 {
		add("Streaming", yesNo(p.Stream))
	}
	if p.LengthHints {
		add("Length hints", "min_tokens and ignore_eos sent")
	}
	add("Models", mix(p.Models))
	add("Tenants", mix(p.Tenants))
	add("Headers", mix(p.HeaderMixes))
	add("Dataset", p.Dataset)
	add("Input tokens", tokenRange(p.InputTokens))
	add("Output tokens", tokenRange(p.OutputTokens))
	if sp := p.SharedPrefix; sp != nil && sp.Share > 0 {
		add("Shared prefix", fmt.Sprintf("%s of prompts start with a common %s-token prefix", pct(sp.Share), integer(sp.Tokens)))
	}
	if p.Mode != "" || p.Seed != 0 {
		add("Seed", fmt.Sprint(p.Seed))
	}
	add("SLO", slo(p.SLO))
	if p.TimeoutS > 0 {
		add("Request timeout", seconds(p.TimeoutS))
	}
	if r.DurationS > 0 {
		add("Run duration", seconds(r.DurationS)+" (warm-up and cool-down included)")
	}
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// phaseBound describes how long a warm-up or cool-down lasts.
func phaseBound(s float64, requests int) string {
	switch {
	case requests > 0 && s > 0:
		return seconds(s) + " or " + integer(requests) + " requests"
	case requests > 0:
		return integer(requests) + " requests"
	}
	return seconds(s)
}

// mix describes a weighted mix, with shares when there is a choice.
func mix(ws []result.Weight) string {
	var total float64
	for _, w := range ws {
		if finite(w.Weight) && w.Weight > 0 {
			total += w.Weight
		}
	}
	var parts []string
	for _, w := range ws {
		s := w.Value
		if len(ws) > 1 && total > 0 && finite(w.Weight) && w.Weight > 0 {
			s += " (" + pct(w.Weight/total) + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func tokenRange(r result.Range) string {
	if r == (result.Range{}) {
		return ""
	}
	span := integer(r.Min)
	if r.Max != r.Min {
		span += "–" + integer(r.Max)
	}
	if r.Dist == "normal" {
		return fmt.Sprintf("normal, mean %s ± %s, clamped to %s", plain(r.Mean), plain(r.StdDev), span)
	}
	if r.Dist != "" && r.Max != r.Min {
		return r.Dist + " " + span
	}
	return span
}

func slo(s result.SLO) string {
	var parts []string
	if s.TTFTMs > 0 {
		parts = append(parts, "TTFT ≤ "+plain(s.TTFTMs)+" ms")
	}
	if s.ITLMs > 0 {
		parts = append(parts, "ITL ≤ "+plain(s.ITLMs)+" ms (as TPOT)")
	}
	if s.E2EMs > 0 {
		parts = append(parts, "E2E ≤ "+plain(s.E2EMs)+" ms")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ") + " per request; sweep knee judged at p" + trimFloat(sloPercentile(s), 1)
}

func sloPercentile(s result.SLO) float64 {
	if s.Percentile > 0 && s.Percentile < 100 && finite(s.Percentile) {
		return s.Percentile
	}
	return 99
}

// targetView is one target's summary.
type targetView struct {
	Name, URL   string
	Color       string
	Latency     []distRow
	Stats       []kv
	Errors      []errorRow
	ErrorsTotal string
}

type distRow struct {
	Name, Note                                  string
	N, P50, P90, P95, P99, P999, Mean, Max, Min string
}

type errorRow struct {
	Class, Count, Example string
}

func targetSummary(i int, t result.TargetResult) targetView {
	m := t.Metrics
	v := targetView{Name: t.Name, URL: t.URL, Color: targetColor(i)}
	if v.Name == "" {
		v.Name = fmt.Sprintf("target %d", i+1)
	}
	v.Latency = []distRow{
		distRowOf("TTFT", "send → first content token", m.TTFTMs),
	}
	if m.TTFTIntendedMs.N > 0 && m.TTFTIntendedMs != m.TTFTMs {
		v.Latency = append(v.Latency, distRowOf("TTFT (intended)", "from the scheduled send time", m.TTFTIntendedMs))
	}
	v.Latency = append(v.Latency,
		distRowOf("ITL", "gap between content events", m.ITLMs),
		distRowOf("TPOT", "per request, after the first token", m.TPOTMs),
		distRowOf("E2E", "send → end of response", m.E2EMs),
	)
	if m.E2EIntendedMs.N > 0 && m.E2EIntendedMs != m.E2EMs {
		v.Latency = append(v.Latency, distRowOf("E2E (intended)", "from the scheduled send time", m.E2EIntendedMs))
	}
	if m.MaxStallMs.N > 0 {
		v.Latency = append(v.Latency, distRowOf("Longest stall", "per request", m.MaxStallMs))
	}
	// The generator's own delays matter only when there are any.
	if m.QueueMs.N > 0 && m.QueueMs.Max > 0 {
		v.Latency = append(v.Latency, distRowOf("Client queue", "scheduled → a concurrency slot free", m.QueueMs))
	}
	if m.ScheduleLagMs.N > 0 && m.ScheduleLagMs.Max > 0 {
		v.Latency = append(v.Latency, distRowOf("Schedule lag", "scheduled → actually sent", m.ScheduleLagMs))
	}

	rq := m.Requests
	v.Stats = []kv{
		{"Requests", fmt.Sprintf("%s sent, %s succeeded, %s failed", integer(rq.Sent), integer(rq.Succeeded), integer(rq.Failed))},
		{"Throughput", throughput(m.Throughput)},
		{"Goodput", fmt.Sprintf("%s req/s · %s of sent (%s requests met the SLO)",
			num(m.Goodput.RequestsPerS), pct(m.Goodput.Fraction), integer(m.Goodput.Requests))},
		{"Peak concurrency", integer(m.Throughput.PeakConcurrency)},
		{"Tokens", fmt.Sprintf("%s in, %s out", integer(m.InputTokens), integer(m.OutputTokens))},
	}
	if m.TokenSource != "" {
		v.Stats = append(v.Stats, kv{"Token source", tokenSource(m.TokenSource)})
	}
	if m.WindowS > 0 {
		v.Stats = append(v.Stats, kv{"Measurement window", seconds(m.WindowS)})
	}

	v.ErrorsTotal = integer(m.Errors.Total)
	// Most frequent class first; ties by name so the page is deterministic.
	classes := slices.SortedFunc(maps.Keys(m.Errors.ByClass), func(a, b string) int {
		return cmp.Or(cmp.Compare(m.Errors.ByClass[b], m.Errors.ByClass[a]), cmp.Compare(a, b))
	})
	for _, c := range classes {
		if n := m.Errors.ByClass[c]; n > 0 {
			v.Errors = append(v.Errors, errorRow{Class: c, Count: integer(n), Example: m.Errors.Examples[c]})
		}
	}
	return v
}

func throughput(t result.Throughput) string {
	s := num(t.RequestsPerS) + " req/s succeeded"
	if t.SentPerS > 0 {
		s += " (" + num(t.SentPerS) + " sent)"
	}
	return s + " · " + num(t.OutputTokensPerS) + " output tok/s · " + num(t.TotalTokensPerS) + " total tok/s"
}

func tokenSource(s string) string {
	switch s {
	case "usage":
		return "usage (the server's usage object, every request)"
	case "events":
		return "events (content events counted; no usage chunk)"
	case "words":
		return "words (no stream and no usage: words of the content)"
	case "mixed":
		return "mixed (usage where the server sent it, counted otherwise)"
	}
	return s
}

func distRowOf(name, note string, d result.Dist) distRow {
	if d.N <= 0 {
		return distRow{Name: name, Note: note, N: "0", P50: dash, P90: dash, P95: dash, P99: dash, P999: dash, Mean: dash, Max: dash, Min: dash}
	}
	return distRow{
		Name: name, Note: note, N: integer(d.N),
		P50: num(d.P50), P90: num(d.P90), P95: num(d.P95), P99: num(d.P99), P999: num(d.P999),
		Mean: num(d.Mean), Max: num(d.Max), Min: num(d.Min),
	}
}

// overviewRow puts the headline numbers of several targets side by side.
type overviewRow struct {
	Name, Color                             string
	RPS, TokS, TTFT50, TTFT99, ITL99, E2E99 string
	Goodput, Errors                         string
}

func overview(i int, t result.TargetResult) overviewRow {
	m := t.Metrics
	ms := func(d result.Dist, v float64) string {
		if d.N <= 0 {
			return dash
		}
		return num(v)
	}
	name := t.Name
	if name == "" {
		name = fmt.Sprintf("target %d", i+1)
	}
	return overviewRow{
		Name: name, Color: targetColor(i),
		RPS: num(m.Throughput.RequestsPerS), TokS: num(m.Throughput.OutputTokensPerS),
		TTFT50: ms(m.TTFTMs, m.TTFTMs.P50), TTFT99: ms(m.TTFTMs, m.TTFTMs.P99),
		ITL99: ms(m.ITLMs, m.ITLMs.P99), E2E99: ms(m.E2EMs, m.E2EMs.P99),
		Goodput: pct(m.Goodput.Fraction), Errors: integer(m.Errors.Total),
	}
}

// baselineView is the outcome of --baseline.
type baselineView struct {
	File    string
	Passed  bool
	Targets bool // some check names its target: show the column
	Rows    []baselineRow
}

type baselineRow struct {
	Target, Metric, Better, Baseline, Current, Change, Tolerance string
	Passed                                                       bool
}

func baseline(b *result.BaselineCheck) *baselineView {
	if b == nil {
		return nil
	}
	v := &baselineView{File: b.File, Passed: b.Passed}
	for _, c := range b.Checks {
		change := dash
		if c.Baseline != 0 {
			change = signedFixed((c.Current-c.Baseline)/c.Baseline*100, 1) + "%"
		}
		better := "lower is better"
		if c.HigherIsBetter {
			better = "higher is better"
		}
		v.Targets = v.Targets || c.Target != ""
		v.Rows = append(v.Rows, baselineRow{
			Target: c.Target, Metric: c.Metric, Better: better, Baseline: num(c.Baseline), Current: num(c.Current),
			Change: change, Tolerance: pct(c.Tolerance), Passed: c.Passed,
		})
	}
	return v
}
