package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/result"
)

// Report is one run of the harness: what --json writes and the Markdown
// section of docs/performance.md is rendered from.
type Report struct {
	Tool      string    `json:"tool"`
	Version   string    `json:"version"` // infergate's
	StartedAt time.Time `json:"started_at"`
	DurationS float64   `json:"duration_s"`
	// Command is what reproduces the run (make bench-overhead), Args the
	// harness's own arguments.
	Command  string           `json:"command"`
	Args     []string         `json:"args"`
	Machine  Machine          `json:"machine"`
	Pinning  Pinning          `json:"pinning"`
	Phases   []*PhaseResult   `json:"phases"`
	PeakRSS  []ProcessRSS     `json:"peak_rss"`
	Variants []*VariantResult `json:"variants"`
	Peers    []*PeerInfo      `json:"peers,omitempty"` // other gateways' lanes (peers.go)
	Targets  []Target         `json:"targets"`
	Error    string           `json:"error,omitempty"` // why the run failed, if it did
}

// Pinning says which CPUs each side ran on, and how.
type Pinning struct {
	Gateway string `json:"gateway_cpus"` // Envoy (--concurrency 1) and infergate
	Client  string `json:"client_cpus"`  // mock, load generator, Redis, OTLP receiver
	How     string `json:"how"`
}

func pinning(o options) Pinning {
	if o.GatewayCPUs == "" && o.ClientCPUs == "" {
		return Pinning{How: "unpinned; Envoy with --concurrency 1"}
	}
	return Pinning{Gateway: o.GatewayCPUs, Client: o.ClientCPUs,
		How: fmt.Sprintf("taskset -c %s for every Envoy (--concurrency 1: one worker thread) and infergate (Go sizes GOMAXPROCS to its CPUs); "+
			"taskset -c %s for the mock, Redis and the harness itself (it re-executes itself under taskset; the load generator and the OTLP receiver run in it)",
			o.GatewayCPUs, o.ClientCPUs)}
}

// ProcessRSS is a process's peak resident set over the main phases.
type ProcessRSS struct {
	Name  string `json:"name"`
	Bytes int64  `json:"peak_rss_bytes"` // VmHWM
}

// Target is one of the goals and where it stands.
type Target struct {
	Name  string  `json:"name"`
	Limit string  `json:"limit"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Met   bool    `json:"met"`
	Note  string  `json:"note,omitempty"`
}

func (r *Report) phase(key string) *PhaseResult {
	for _, p := range r.Phases {
		if p.Key == key {
			return p
		}
	}
	return nil
}

// Metric pickers, in milliseconds.
func e2eP(q float64) func(*PathResult) float64 {
	return func(p *PathResult) float64 { return pct(p.Metrics.E2EMs, q) }
}
func ttftP(q float64) func(*PathResult) float64 {
	return func(p *PathResult) float64 { return pct(p.Metrics.TTFTMs, q) }
}
func gapP(q float64) func(*PathResult) float64 {
	return func(p *PathResult) float64 {
		if p.Stream == nil {
			return math.NaN()
		}
		return pct(p.Stream.GapMs, q)
	}
}
func transitP(q float64) func(*PathResult) float64 {
	return func(p *PathResult) float64 {
		if p.Stream == nil {
			return math.NaN()
		}
		return pct(p.Stream.TransitMs, q)
	}
}

func pct(d result.Dist, q float64) float64 {
	switch q {
	case 50:
		return d.P50
	case 90:
		return d.P90
	case 99:
		return d.P99
	}
	return d.Max
}

// added is pick(b) − pick(a) in phase ph, in ms; NaN when either is missing.
func added(ph *PhaseResult, a, b string, pick func(*PathResult) float64) float64 {
	if ph == nil {
		return math.NaN()
	}
	pa, pb := ph.path(a), ph.path(b)
	if pa == nil || pb == nil {
		return math.NaN()
	}
	return pick(pb) - pick(pa)
}

func cpuPer1k(ph *PhaseResult, name string) float64 {
	if ph == nil {
		return math.NaN()
	}
	for _, u := range ph.CPU {
		if u.Name == name {
			return u.CPUPer1kTokensS
		}
	}
	return math.NaN()
}

func coalesced(ph *PhaseResult, name string) int {
	if ph == nil || ph.path(name) == nil || ph.path(name).Stream == nil {
		return -1
	}
	return ph.path(name).Stream.Coalesced
}

// targets evaluates the goals, each as infergate's share over plain
// Envoy in the same run.
func targets(r *Report) []Target {
	var out []Target
	us := func(v float64) float64 { return v * 1000 }
	add := func(name, limit string, v, max float64, unit, note string) {
		if math.IsNaN(v) {
			return
		}
		out = append(out, Target{Name: name, Limit: limit, Value: v, Unit: unit, Met: v <= max, Note: note})
	}
	s1, s256 := r.phase("stream-c1"), r.phase("stream-c256")
	add("added TTFT p99 at c=1 (streaming), infergate's share over plain Envoy", "≤ 60 µs",
		us(added(s1, plain, gateway, ttftP(99))), 60, "µs", "")
	add("added TTFT p99 at c=256 (streaming), infergate's share over plain Envoy", "≤ 1 ms",
		us(added(s256, plain, gateway, ttftP(99))), 1000, "µs", "")
	if s1 != nil {
		c := coalesced(s1, gateway)
		add("added ITL p99 at c=1 (streaming), infergate's share over plain Envoy", "≤ 20 µs, 0 coalesced chunks",
			us(added(s1, plain, gateway, gapP(99))), 20, "µs", fmt.Sprintf("chunks coalesced through Envoy + infergate: %d", c))
		if c > 0 {
			out[len(out)-1].Met = false
		}
	}
	for _, key := range []string{"stream-c256", "stream-c64"} {
		ph := r.phase(key)
		ig, envoy := cpuPer1k(ph, gateway+"-infergate"), cpuPer1k(ph, plain+"-envoy")
		if math.IsNaN(ig) || math.IsNaN(envoy) || envoy == 0 {
			continue
		}
		add(fmt.Sprintf("infergate CPU per 1,000 streamed tokens (%s) over plain Envoy's", key), "≤ 0.5",
			ig/envoy, 0.5, "ratio", fmt.Sprintf("infergate %.4f s, plain Envoy %.4f s, Envoy beside infergate %.4f s per 1,000 tokens",
				ig, envoy, cpuPer1k(ph, gateway+"-envoy")))
		break
	}
	out = append(out, wasmMeterTargets(r)...)
	return out
}

// writeJSON writes the report, indented.
func writeJSON(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// The generated part of docs/performance.md lies between these markers;
// the rest of the file is written by hand.
const (
	beginMarker = "<!-- overhead:begin: generated by make bench-overhead; edit outside these markers -->"
	endMarker   = "<!-- overhead:end -->"
)

// updateDoc replaces the generated section of the Markdown file at path
// (appending it when the file has none).
func updateDoc(path string, r *Report) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	section := beginMarker + "\n" + markdown(r) + endMarker
	var out string
	b, rest, found := strings.Cut(string(old), beginMarker)
	_, after, foundEnd := strings.Cut(rest, endMarker)
	switch {
	case found && foundEnd:
		out = b + section + after
	case len(old) == 0:
		out = "# Performance\n\n" + section + "\n"
	default:
		out = strings.TrimRight(string(old), "\n") + "\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// fmtMs renders a latency: µs below 10 ms, ms above.
func fmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.0f µs", v*1000)
	}
	return fmt.Sprintf("%.3f ms", v)
}

// fmtDelta renders a difference, signed, in µs.
func fmtDelta(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%+.0f µs", v*1000)
}

func fmtCI(d result.Delta, v float64, ci [2]float64) string {
	if d.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%+.0f µs [%+.0f, %+.0f]", v*1000, ci[0]*1000, ci[1]*1000)
}

func only(key string) string {
	return "`make bench-overhead OVERHEAD_ARGS='--only " + key + "'`"
}

// markdown renders the report's tables.
func markdown(r *Report) string {
	var b bytes.Buffer
	m := r.Machine
	fmt.Fprintf(&b, "Measured %s on %d CPUs (%s), Linux %s, Envoy %s, %s, %s; load average %s when it started (the machine is shared). "+
		"Command: `%s` (%.1f min). %s.\n\n",
		r.StartedAt.Format("2006-01-02 15:04 UTC"), m.CPUs, m.CPUModel, m.Kernel, m.Envoy, m.GoVer, r.Version, m.LoadAvg,
		r.Command, r.DurationS/60, r.Pinning.How)
	if r.Error != "" {
		fmt.Fprintf(&b, "**The run failed:** %s\n\n", r.Error)
	}

	// The board's numbers: differences of percentiles.
	b.WriteString("**Added latency, the board's way** (difference of percentiles, one run: at c=1 every request goes to the three paths " +
		"one after another; under load the paths take turns, alone, in rotating windows; \"infergate adds\" is Envoy + infergate − plain Envoy):\n\n")
	b.WriteString("| lane | metric | direct | plain Envoy | Envoy + infergate | Envoy adds | **infergate adds** | reproduce |\n|---|---|--:|--:|--:|--:|--:|---|\n")
	type row struct {
		label string
		pick  func(*PathResult) float64
	}
	lanes := []struct {
		key  string
		rows []row
	}{
		{"c1", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}}},
		{"stream-c1", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p50", gapP(50)}, {"ITL p99", gapP(99)},
			{"chunk transit p50", transitP(50)}, {"chunk transit p99", transitP(99)}}},
		{"stream-c64", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p99", gapP(99)}, {"chunk transit p99", transitP(99)}}},
		{"stream-c256", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p99", gapP(99)}, {"chunk transit p99", transitP(99)}}},
		{"rps-c64", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}}},
		{"rps-c256", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}}},
	}
	for _, lane := range lanes {
		ph := r.phase(lane.key)
		if ph == nil {
			continue
		}
		for i, rw := range lane.rows {
			title := ""
			if i == 0 {
				title = ph.Title
			}
			v := func(name string) float64 {
				if p := ph.path(name); p != nil {
					return rw.pick(p)
				}
				return math.NaN()
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | **%s** | %s |\n", title, rw.label,
				fmtMs(v(direct)), fmtMs(v(plain)), fmtMs(v(gateway)),
				fmtDelta(v(plain)-v(direct)), fmtDelta(v(gateway)-v(plain)), map[bool]string{true: only(lane.key)}[i == 0])
		}
	}

	b.WriteString("\n**Paired per-request differences** (every request sent to each path back to back; median and mean with 95% confidence intervals, p99 of the differences):\n\n")
	b.WriteString("| lane | metric | pair | pairs | median [95% CI] | mean [95% CI] | p99 |\n|---|---|---|--:|--:|--:|--:|\n")
	for _, lane := range []struct{ key, metric string }{{"c1", "latency"}, {"stream-c1", "TTFT"}, {"stream-c64", "TTFT"}, {"stream-c256", "TTFT"}} {
		ph := r.phase(lane.key)
		if ph == nil {
			continue
		}
		for _, pair := range [][2]string{{direct, plain}, {plain, gateway}, {direct, gateway}} {
			c := ph.compare(pair[0], pair[1])
			if c == nil {
				continue
			}
			d := c.DeltaTTFTMs
			if lane.metric == "latency" {
				d = c.DeltaE2EMs
			}
			fmt.Fprintf(&b, "| %s | %s | %s − %s | %d | %s | %s | %s |\n", ph.Title, lane.metric, pathLabel(pair[1]), pathLabel(pair[0]), c.Pairs,
				fmtCI(d, d.P50, d.P50CI95), fmtCI(d, d.Mean, d.MeanCI95), fmtDelta(d.P99))
		}
	}

	b.WriteString("\n**Throughput and streams** (per path; under load each path alone in its windows; coalescing and delays only where the mock paces its deltas):\n\n")
	b.WriteString("| lane | path | requests/s | streams in flight (peak) | stalled streams | chunks coalesced | chunks delayed > 1 ms | requests (all phases) |\n|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, key := range []string{"stream-c1", "stream-c64", "stream-c256", "rps-c64", "rps-c256", "stream-zero"} {
		ph := r.phase(key)
		if ph == nil {
			continue
		}
		for i, p := range ph.Paths {
			title := ""
			if i == 0 {
				title = ph.Title
			}
			stalled, coal, delayed := "–", "–", "–"
			if p.Stream != nil && ph.Interval > 0 {
				stalled = fmt.Sprint(p.Stream.Stalled)
				if p.Stream.TransitMs.N > 0 { // a peer that drops the emit stamps has neither
					coal, delayed = fmt.Sprint(p.Stream.Coalesced), fmt.Sprint(p.Stream.Delayed)
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %d | %s | %s | %s | %d |\n", title, pathLabel(p.Name), p.Metrics.Throughput.RequestsPerS,
				p.Metrics.Throughput.PeakConcurrency, stalled, coal, delayed, p.Metrics.Requests.Sent)
		}
	}

	b.WriteString("\n**CPU per 1,000 streamed tokens** (utime + stime from /proc/<pid>/stat over the phase, warm-up included, " +
		"over the tokens streamed through that process) **and peak RSS** (VmHWM):\n\n")
	b.WriteString("| process |")
	var cpuPhases []*PhaseResult
	for _, key := range []string{"stream-c64", "stream-c256", "stream-zero"} {
		if ph := r.phase(key); ph != nil {
			cpuPhases = append(cpuPhases, ph)
			fmt.Fprintf(&b, " %s |", ph.Title)
		}
	}
	b.WriteString(" peak RSS |\n|---|" + strings.Repeat("--:|", len(cpuPhases)+1) + "\n")
	names := []string{plain + "-envoy", gateway + "-envoy", gateway + "-infergate"}
	for _, p := range r.Peers {
		names = append(names, p.Key)
	}
	for _, name := range names {
		fmt.Fprintf(&b, "| %s |", procLabel(name))
		for _, ph := range cpuPhases {
			if v := cpuPer1k(ph, name); !math.IsNaN(v) {
				fmt.Fprintf(&b, " %.4f s |", v)
			} else {
				b.WriteString(" – |")
			}
		}
		rss := "–"
		for _, p := range r.PeakRSS {
			if p.Name == name {
				rss = fmt.Sprintf("%.1f MiB", float64(p.Bytes)/(1<<20))
			}
		}
		fmt.Fprintf(&b, " %s |\n", rss)
	}

	if len(r.Targets) > 0 {
		b.WriteString("\n**Targets** (infergate's share over plain Envoy in the same run):\n\n| target | limit | measured | met |\n|---|---|--:|---|\n")
		for _, t := range r.Targets {
			v := fmt.Sprintf("%.0f %s", t.Value, t.Unit)
			if t.Unit == "ratio" {
				v = fmt.Sprintf("%.2f", t.Value)
			}
			met := "**no**"
			if t.Met {
				met = "yes"
			}
			note := ""
			if t.Note != "" {
				note = " (" + t.Note + ")"
			}
			fmt.Fprintf(&b, "| %s%s | %s | %s | %s |\n", t.Name, note, t.Limit, v, met)
		}
	}

	if len(r.Variants) > 0 {
		b.WriteString("\n**The price of each choice** (the default gateway and a variant, both on the gateway CPU, interleaved; " +
			"Δ = variant − default; latency Δ is the paired per-request median with its 95% CI, then the difference of p99s):\n\n")
		b.WriteString("| choice | default → variant | c=1 latency Δ median [CI] | c=1 latency Δ p99 | c=8 streams: TTFT Δ p99 | ITL Δ p99 | " +
			"coalesced (default / variant) | infergate CPU / 1k tokens (default → variant) | Envoy CPU / 1k tokens | reproduce |\n|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
		for _, v := range r.Variants {
			var c1, st *PhaseResult
			for _, ph := range v.Phases {
				switch {
				case strings.HasSuffix(ph.Key, "/c1"):
					c1 = ph
				case ph.Stream:
					st = ph
				}
			}
			med, p99 := "–", "–"
			if c1 != nil {
				if c := c1.compare(gateway, v.Key); c != nil {
					med = fmtCI(c.DeltaE2EMs, c.DeltaE2EMs.P50, c.DeltaE2EMs.P50CI95)
				}
				p99 = fmtDelta(added(c1, gateway, v.Key, e2eP(99)))
			}
			ttft, itl, coal, igCPU, envCPU := "–", "–", "–", "–", "–"
			if st != nil {
				ttft = fmtDelta(added(st, gateway, v.Key, ttftP(99)))
				itl = fmtDelta(added(st, gateway, v.Key, gapP(99)))
				coal = fmt.Sprintf("%d / %d", coalesced(st, gateway), coalesced(st, v.Key))
				igCPU = fmt.Sprintf("%.4f → %.4f s", cpuPer1k(st, gateway+"-infergate"), cpuPer1k(st, v.Key+"-infergate"))
				if math.IsNaN(cpuPer1k(st, v.Key+"-infergate")) { // the module: no infergate process, its CPU is Envoy's
					igCPU = fmt.Sprintf("%.4f s → in Envoy", cpuPer1k(st, gateway+"-infergate"))
				}
				envCPU = fmt.Sprintf("%.4f → %.4f s", cpuPer1k(st, gateway+"-envoy"), cpuPer1k(st, v.Key+"-envoy"))
			}
			note := ""
			if v.Spans > 0 {
				note = fmt.Sprintf(" (%d spans received)", v.Spans)
			}
			fmt.Fprintf(&b, "| %s | %s → %s%s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v.Title, v.Baseline, v.Changed, note,
				med, p99, ttft, itl, coal, igCPU, envCPU, only(v.Key))
		}
	}
	b.WriteString(peersMarkdown(r))
	b.WriteString("\nRaw numbers: [`docs/performance.json`](performance.json) (every phase's full metrics per path, the paired comparisons, CPU per process).\n")
	return b.String()
}

func pathLabel(name string) string {
	switch name {
	case direct:
		return "direct"
	case plain:
		return "plain Envoy"
	case gateway:
		return "Envoy + infergate"
	case peerLiteLLM:
		return "LiteLLM proxy"
	case peerPortkey:
		return "Portkey gateway"
	}
	return name
}

func procLabel(name string) string {
	switch name {
	case plain + "-envoy":
		return "plain Envoy"
	case gateway + "-envoy":
		return "Envoy beside infergate (ext_proc client)"
	case gateway + "-infergate":
		return "infergate (gate + meter)"
	case peerLiteLLM, peerPortkey:
		return pathLabel(name) + " (peer, one process)"
	}
	return name
}
