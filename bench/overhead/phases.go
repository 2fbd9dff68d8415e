package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/bench/loadgen"
	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/stats"
)

// phaseSpec is one measurement: a load shape against every path at once.
type phaseSpec struct {
	Key         string        `json:"key"`
	Title       string        `json:"title"`
	Stream      bool          `json:"stream"`
	Concurrency int           `json:"concurrency"`
	Warmup      time.Duration `json:"-"` // per path
	Measure     time.Duration `json:"-"` // per path
	// The mock's cadence for this phase (board profile, set per request).
	Delay    time.Duration `json:"-"`
	Interval time.Duration `json:"-"`
	Chunks   int           `json:"chunks,omitempty"`
}

// sequential phases send each item to the paths one after another: at c=1
// no two requests overlap, as when the board measures one path at a time.
func (p phaseSpec) sequential() bool { return p.Concurrency == 1 }

func (p phaseSpec) mockDesc() string {
	if !p.Stream {
		return fmt.Sprintf("non-streaming, %s delay", p.Delay)
	}
	return fmt.Sprintf("stream: role + %d × 16 B every %s", p.Chunks, p.Interval)
}

// path is one target of a phase and the processes its traffic runs through.
type path struct {
	name    string
	url     string
	procs   []*proc
	headers map[string]string // sent on this path only (a peer's routing)
	peer    bool              // a peer lane: compared by content, its failures recorded, not fatal
}

// PathResult is one path's numbers in one phase.
type PathResult struct {
	Name    string         `json:"name"`
	Metrics result.Metrics `json:"metrics"`
	// Stream is measured from the captured bytes, exactly (the metrics'
	// histograms round to 3 significant digits: 16 µs at 20 ms).
	Stream *StreamStats `json:"stream,omitempty"`
	Peer   *PeerCheck   `json:"peer,omitempty"` // a peer lane's failures and bodies
}

// StreamStats are a path's streamed events, from each event's emit stamp
// (the mock's clock, just before it wrote the event) and its arrival at the
// client (same machine, same clock).
type StreamStats struct {
	Events int `json:"events"` // content events
	// GapMs are the gaps between consecutive content events at the client
	// (the ITL a client sees).
	GapMs result.Dist `json:"gap_ms"`
	// TransitMs is arrival − emit per content event: what the path added
	// to each event on its way.
	TransitMs result.Dist `json:"transit_ms"`
	// Coalesced counts events emitted at least 1 ms after the one before
	// but arriving less than half that gap after it: held and sent on
	// together. Delayed counts events whose transit was over 1 ms.
	Coalesced int `json:"coalesced"`
	Delayed   int `json:"delayed"`
	// Stalled counts streams with a gap over twice the mock's interval (the
	// board's stall).
	Stalled int `json:"stalled_streams"`
}

// ProcessUsage is one process's CPU over a phase.
type ProcessUsage struct {
	Name       string  `json:"name"`
	Path       string  `json:"path"`
	CPUSeconds float64 `json:"cpu_s"`
	// Tokens streamed through it in the phase (warm-up included, as its
	// CPU is), and its CPU per 1,000 of them.
	Tokens          int64   `json:"tokens"`
	CPUPer1kTokensS float64 `json:"cpu_s_per_1k_tokens"`
	Requests        int     `json:"requests"` // through it in the phase, warm-up included
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`
}

// PhaseResult is one phase's outcome.
type PhaseResult struct {
	phaseSpec
	WarmupS  float64          `json:"warmup_s_per_path"`
	MeasureS float64          `json:"measure_s_per_path"`
	Mock     string           `json:"mock"`
	Paths    []PathResult     `json:"paths"`
	Compare  []result.Compare `json:"compare,omitempty"` // paired per-request differences
	CPU      []ProcessUsage   `json:"cpu"`
	Requests int              `json:"requests"` // every request of the phase, warm-up included
	// BodiesCompared counts the bodies compared, byte for byte, with the
	// first path's answer to the same request.
	BodiesCompared int `json:"bodies_compared"`
}

func (r *PhaseResult) path(name string) *PathResult {
	for i := range r.Paths {
		if r.Paths[i].Name == name {
			return &r.Paths[i]
		}
	}
	return nil
}

func (r *PhaseResult) compare(a, b string) *result.Compare {
	for i := range r.Compare {
		if r.Compare[i].A == a && r.Compare[i].B == b {
			return &r.Compare[i]
		}
	}
	return nil
}

// The request every path gets: the board's shape (a chat message padded to
// 256 bytes, max_tokens 16), with the bench key.
func workload(spec phaseSpec) *loadgen.Workload {
	one := result.Range{Min: 1, Max: 1, Dist: "uniform"}
	w := &loadgen.Workload{
		Models:  []result.Weight{{Value: "gpt-4o-mini", Weight: 1}},
		Keys:    []loadgen.Key{{Name: benchTenant, Key: benchKey, Weight: 1}},
		Prompt:  "u-" + strings.Repeat("x", 256),
		Input:   one,
		Output:  result.Range{Min: 16, Max: 16, Dist: "uniform"},
		Stream:  spec.Stream,
		NoHints: true,
		Headers: map[string]string{
			"x-mock-ttft-ms": strconv.FormatInt(spec.Delay.Milliseconds(), 10),
			"x-mock-itl-ms":  strconv.FormatInt(spec.Interval.Milliseconds(), 10),
		},
	}
	if spec.Stream {
		w.Headers["x-mock-tokens"] = strconv.Itoa(spec.Chunks)
		w.Headers["x-mock-emit-timestamps"] = "1"
	}
	return w
}

// runPhase measures every path under spec's load and checks what came
// back: a failed request, or a body that differs between the paths, fails
// the phase.
//
// At c=1 every item goes to each path in turn, back to back (one request
// at a time on the machine, as when the board measures one path at a
// time), so each request is paired across paths. Under load the paths
// take turns instead, in windows whose order rotates: three gateways at
// once would share the one gateway CPU, and each is measured alone, as on
// the board.
func (h *harness) runPhase(ctx context.Context, spec phaseSpec, paths []path) (*PhaseResult, error) {
	h.logf("phase %s: %s, c=%d, %s warm-up + %s per path", spec.Key, spec.mockDesc(), spec.Concurrency, spec.Warmup, spec.Measure)
	res := &PhaseResult{phaseSpec: spec, WarmupS: spec.Warmup.Seconds(), MeasureS: spec.Measure.Seconds(), Mock: spec.mockDesc()}
	col := newCollector(paths, spec)
	var failures []string
	var err error
	if spec.sequential() {
		failures, err = h.interleaved(ctx, spec, paths, col, res)
	} else {
		failures, err = h.windows(ctx, spec, paths, col, res)
	}
	if err != nil {
		return nil, fmt.Errorf("phase %s: %w", spec.Key, err)
	}
	res.BodiesCompared, failures = col.check(failures, paths)
	for i, p := range paths {
		if p.peer {
			res.path(p.name).Peer = col.peerCheck(i)
		}
	}
	if len(failures) > 0 {
		if len(failures) > 10 {
			failures = append(failures[:10], fmt.Sprintf("... and %d more", len(failures)-10))
		}
		return res, fmt.Errorf("phase %s: %d failures:\n  %s", spec.Key, len(failures), strings.Join(failures, "\n  "))
	}
	return res, nil
}

// loadConfig is the load generator's configuration for spec.
func loadConfig(spec phaseSpec, targets []loadgen.Target, capture func(*loadgen.Sample, *loadgen.Raw)) loadgen.Config {
	cfg := loadgen.Config{
		Targets:     targets,
		Concurrency: spec.Concurrency,
		Sequential:  spec.sequential(),
		Workload:    workload(spec),
		Seed:        1,
		Timeout:     time.Minute,
		Capture:     capture,
	}
	if spec.Stream && spec.Concurrency > 1 {
		// The mock keeps each stream on exact deadlines from its start, so
		// streams started together would deliver every event at once, in
		// lockstep, for ever (the board's mock sleeps after each send and
		// drifts apart). Starting the users over one interval spreads them.
		cfg.RampUp = spec.Interval
	}
	return cfg
}

// cpuMeter reads the CPU time of processes before and after a stretch.
type cpuMeter map[*proc]float64

func (c cpuMeter) start(procs []*proc) {
	for _, p := range procs {
		c[p], _ = cpuSeconds(p.pid())
	}
}

// stop returns how much CPU p used since start.
func (c cpuMeter) stop(p *proc) float64 {
	after, _ := cpuSeconds(p.pid())
	return after - c[p]
}

func usage(spec phaseSpec, p *proc, path string, cpu float64, tokens int64, requests int) ProcessUsage {
	u := ProcessUsage{Name: p.name, Path: path, CPUSeconds: cpu, Tokens: tokens, Requests: requests, PeakRSSBytes: peakRSS(p.pid())}
	if tokens > 0 && spec.Stream {
		u.CPUPer1kTokensS = cpu / float64(tokens) * 1000
	}
	return u
}

// interleaved runs every path in one load, item by item.
func (h *harness) interleaved(ctx context.Context, spec phaseSpec, paths []path, col *collector, res *PhaseResult) ([]string, error) {
	n := len(paths)
	targets := make([]loadgen.Target, n)
	var procs []*proc
	for i, p := range paths {
		targets[i] = loadgen.Target{Name: p.name, URL: p.url, Headers: p.headers}
		procs = append(procs, p.procs...)
	}
	cfg := loadConfig(spec, targets, col.capture)
	// Each path gets its share of the window, as if measured alone.
	cfg.Warmup = loadgen.Bound{Duration: spec.Warmup * time.Duration(n)}
	cfg.Measure = loadgen.Bound{Duration: spec.Measure * time.Duration(n)}
	var profDone chan struct{}
	if h.opts.ProfileDir != "" {
		profDone = h.profile(ctx, spec, paths, cfg.Warmup.Duration, cfg.Measure.Duration)
	}
	cpu := cpuMeter{}
	cpu.start(procs)
	rec, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if profDone != nil {
		<-profDone
	}
	var failures []string
	for i, samples := range rec.Samples {
		res.Requests += len(samples)
		var tokens int64
		for k := range samples {
			if s := &samples[k]; s.OK() {
				tokens += int64(s.OutputTokens)
			} else {
				failures = col.fail(failures, i, fmt.Sprintf("%s item %d (%s): %s", paths[i].name, s.Item, s.Phase, s.Err))
			}
		}
		for _, p := range paths[i].procs {
			res.CPU = append(res.CPU, usage(spec, p, paths[i].name, cpu.stop(p), tokens, len(samples)))
		}
		pr := PathResult{Name: paths[i].name, Metrics: rec.Result(i, result.SLO{}).Metrics}
		if spec.Stream {
			pr.Stream = col.stats(i)
		}
		res.Paths = append(res.Paths, pr)
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			res.Compare = append(res.Compare, rec.Compare(a, b))
		}
	}
	return failures, nil
}

// windowRounds is how many windows each path gets under load.
const windowRounds = 2

// windows runs the paths one at a time, in windowRounds turns each, the
// order rotating every round; each window has its own warm-up (the users
// start over) and each path's CPU is read over its own windows only.
func (h *harness) windows(ctx context.Context, spec phaseSpec, paths []path, col *collector, res *PhaseResult) ([]string, error) {
	n := len(paths)
	type acc struct {
		ttft, e2e         []time.Duration
		sent, ok, all     int
		outTokens, tokens int64
		windowS           float64
		peak              int
		cpu               map[*proc]float64
	}
	accs := make([]acc, n)
	for i := range accs {
		accs[i].cpu = map[*proc]float64{}
	}
	var failures []string
	warm, measure := spec.Warmup/windowRounds, spec.Measure/windowRounds
	for round := range windowRounds {
		for j := range n {
			i := (round + j) % n
			p := paths[i]
			capture := func(s *loadgen.Sample, raw *loadgen.Raw) {
				c := *s
				c.Target = i
				col.capture(&c, raw)
			}
			cfg := loadConfig(spec, []loadgen.Target{{Name: p.name, URL: p.url, Headers: p.headers}}, capture)
			cfg.Warmup, cfg.Measure = loadgen.Bound{Duration: warm}, loadgen.Bound{Duration: measure}
			var profDone chan struct{}
			if h.opts.ProfileDir != "" {
				profDone = h.profile(ctx, spec, []path{p}, warm, measure)
			}
			cpu := cpuMeter{}
			cpu.start(p.procs)
			rec, err := loadgen.Run(ctx, cfg)
			if err != nil {
				return nil, err
			}
			a := &accs[i]
			for _, pr := range p.procs {
				a.cpu[pr] += cpu.stop(pr)
			}
			if profDone != nil {
				<-profDone
			}
			samples := rec.Samples[0]
			res.Requests += len(samples)
			a.all += len(samples)
			for k := range samples {
				s := &samples[k]
				if !s.OK() {
					failures = col.fail(failures, i, fmt.Sprintf("%s item %d (%s): %s", p.name, s.Item, s.Phase, s.Err))
					continue
				}
				a.tokens += int64(s.OutputTokens)
				if s.Phase != loadgen.Measure {
					continue
				}
				a.ok++
				a.outTokens += int64(s.OutputTokens)
				a.ttft, a.e2e = append(a.ttft, s.TTFT), append(a.e2e, s.E2E)
			}
			m := rec.Result(0, result.SLO{}).Metrics
			a.sent += m.Requests.Sent
			a.windowS += m.WindowS
			a.peak = max(a.peak, m.Throughput.PeakConcurrency)
		}
	}
	for i, p := range paths {
		a := &accs[i]
		for _, pr := range p.procs {
			res.CPU = append(res.CPU, usage(spec, pr, p.name, a.cpu[pr], a.tokens, a.all))
		}
		m := result.Metrics{
			Requests:     result.Counts{Sent: a.sent, Succeeded: a.ok, Failed: a.sent - a.ok},
			TTFTMs:       exactDist(a.ttft),
			E2EMs:        exactDist(a.e2e),
			OutputTokens: a.outTokens,
			WindowS:      a.windowS,
			Errors:       result.Errors{ByClass: map[string]int{}},
		}
		if a.windowS > 0 {
			m.Throughput = result.Throughput{RequestsPerS: float64(a.ok) / a.windowS, SentPerS: float64(a.sent) / a.windowS,
				OutputTokensPerS: float64(a.outTokens) / a.windowS, PeakConcurrency: a.peak}
		}
		pr := PathResult{Name: p.name, Metrics: m}
		if spec.Stream {
			pr.Stream = col.stats(i)
			pr.Metrics.ITLMs = pr.Stream.GapMs
		}
		res.Paths = append(res.Paths, pr)
	}
	return failures, nil
}

// profile fetches a CPU profile of each path's infergate for the
// measurement window (after the warm-up), into the profile directory.
func (h *harness) profile(ctx context.Context, spec phaseSpec, paths []path, warm, measure time.Duration) chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range paths {
		st := h.stackOf(p.name)
		if st == nil || st.admin == "" {
			continue
		}
		wg.Go(func() {
			select {
			case <-time.After(warm):
			case <-ctx.Done():
				return
			}
			// Allocations: the measurement window is the difference of
			// these two (go tool pprof -base ...-allocs-start.pprof ...).
			prefix := filepath.Join(h.opts.ProfileDir, strings.ReplaceAll(spec.Key, "/", "-")+"-"+p.name+"-infergate")
			h.fetch(st.admin+"/debug/pprof/allocs", prefix+"-allocs-start.pprof")
			secs := max(1, int(measure.Seconds()))
			h.fetch(st.admin+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), prefix+"-cpu.pprof")
			h.fetch(st.admin+"/debug/pprof/allocs", prefix+"-allocs-end.pprof")
		})
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

func (h *harness) fetch(url, out string) {
	resp, err := http.Get(url)
	if err != nil {
		h.logf("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(out)
	if err != nil {
		h.logf("profile: %v", err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err == nil {
		h.logf("profile: %s", out)
	}
}

// collector reads every captured response: a digest per (item, path) for
// the byte-for-byte comparison, and the measured streams' event timings.
// A peer lane is compared with direct by content instead, and its failures
// are kept here, apart from the run's.
type collector struct {
	spec     phaseSpec
	mu       sync.Mutex
	digests  map[int][][32]byte // item → digest per path (zero: not seen)
	contents map[int][][32]byte // item → content digest per path, with peers only
	changed  int                // items a path answered differently another time
	acc      []streamAcc        // per path, measured requests only
	peer     []bool             // per path
	peers    []PeerCheck        // per path (peers only)
}

type streamAcc struct {
	gaps, transit              []time.Duration
	events, coalesced, delayed int
	stalled                    int
}

func newCollector(paths []path, spec phaseSpec) *collector {
	c := &collector{spec: spec, digests: map[int][][32]byte{}, acc: make([]streamAcc, len(paths)),
		peer: make([]bool, len(paths)), peers: make([]PeerCheck, len(paths))}
	for i, p := range paths {
		c.peer[i] = p.peer
		if p.peer {
			c.contents = map[int][][32]byte{}
		}
	}
	return c
}

// maxPeerErrors bounds the errors kept per peer and phase.
const maxPeerErrors = 5

// fail records a failed request on path i: a peer's in its own check,
// any other's in failures, which it returns.
func (c *collector) fail(failures []string, i int, msg string) []string {
	if !c.peer[i] {
		return append(failures, msg)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := &c.peers[i]
	pc.Failed++
	if len(pc.Errors) < maxPeerErrors {
		pc.Errors = append(pc.Errors, msg)
	}
	return failures
}

func (c *collector) peerCheck(i int) *PeerCheck {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.peers[i]
	return &pc
}

// Markers of the board mock's stream.
var (
	stampPrefix = []byte(": t=")
	dataPrefix  = []byte("data: ")
	contentMark = []byte(`"delta":{"content":"`)
	emptyMark   = []byte(`"delta":{"content":""`)
)

func (c *collector) capture(s *loadgen.Sample, raw *loadgen.Raw) {
	if c.peer[s.Target] {
		c.mu.Lock()
		c.peers[s.Target].Requests++
		c.mu.Unlock()
	}
	if !s.OK() {
		return
	}
	// The body without the emit stamps (comment lines every SSE client
	// ignores): what must be identical on every path.
	h := sha256.New()
	type event struct{ emit, at time.Time }
	var events []event
	if !s.Streamed {
		h.Write(raw.Body)
	} else {
		start := 0
		var emit time.Time
		for _, l := range raw.Lines {
			line := raw.Body[start:l.End]
			start = l.End
			if v, ok := bytes.CutPrefix(line, stampPrefix); ok {
				ns, _ := strconv.ParseInt(string(v[:bytes.IndexByte(v, ' ')]), 10, 64)
				emit = time.Unix(0, ns)
				continue
			}
			h.Write(line)
			if bytes.HasPrefix(line, dataPrefix) && bytes.Contains(line, contentMark) && !bytes.Contains(line, emptyMark) {
				events = append(events, event{emit, l.At})
				emit = time.Time{} // a peer that drops the stamps has none for the next event
			}
		}
	}
	var sum, content [32]byte
	h.Sum(sum[:0])
	withContent := c.contents != nil && (c.peer[s.Target] || s.Target == 0)
	if withContent {
		content = contentDigest(s.Streamed, raw.Body)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.digests[s.Item]
	if d == nil {
		d = make([][32]byte, len(c.acc))
		c.digests[s.Item] = d
	}
	var cd [][32]byte
	if withContent {
		if cd = c.contents[s.Item]; cd == nil {
			cd = make([][32]byte, len(c.acc))
			c.contents[s.Item] = cd
		}
	}
	switch {
	case d[s.Target] == [32]byte{}:
		d[s.Target] = sum
		if cd != nil {
			cd[s.Target] = content
		}
	case c.peer[s.Target]: // peers may frame the same content differently each time
		if cd[s.Target] != content {
			c.peers[s.Target].Changed++
		}
	case d[s.Target] != sum: // the same request, answered differently by one path
		c.changed++
	}
	if s.Phase != loadgen.Measure || !s.Streamed {
		return
	}
	a := &c.acc[s.Target]
	stalled := false
	for i, e := range events {
		stamped := !e.emit.IsZero()
		if stamped {
			transit := e.at.Sub(e.emit)
			a.transit = append(a.transit, transit)
			if transit > time.Millisecond {
				a.delayed++
			}
		}
		if i == 0 {
			continue
		}
		gap := e.at.Sub(events[i-1].at)
		a.gaps = append(a.gaps, gap)
		if emitted := e.emit.Sub(events[i-1].emit); stamped && !events[i-1].emit.IsZero() && emitted >= time.Millisecond && gap < emitted/2 {
			a.coalesced++
		}
		if c.spec.Interval > 0 && gap > 2*c.spec.Interval {
			stalled = true
		}
	}
	a.events += len(events)
	if stalled {
		a.stalled++
	}
}

// contentDigest digests what a client reads from a response, whatever its
// framing: the message's text, or every delta's text in order, and the
// finish reason. A peer may rebuild every chunk (LiteLLM does, with its
// own created time, and drops the SSE comments): its bodies are compared
// with direct's by this.
func contentDigest(streamed bool, body []byte) [32]byte {
	h := sha256.New()
	if !streamed {
		h.Write([]byte(gjson.GetBytes(body, "choices.0.message.content").String()))
		h.Write([]byte{0})
		h.Write([]byte(gjson.GetBytes(body, "choices.0.finish_reason").String()))
	} else {
		var finish string
		for line := range bytes.Lines(body) {
			data, ok := bytes.CutPrefix(line, dataPrefix)
			if !ok {
				continue
			}
			choice := gjson.GetBytes(data, "choices.0")
			h.Write([]byte(choice.Get("delta.content").String()))
			if f := choice.Get("finish_reason").String(); f != "" {
				finish = f
			}
		}
		h.Write([]byte{0})
		h.Write([]byte(finish))
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

func (c *collector) stats(i int) *StreamStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := &c.acc[i]
	return &StreamStats{Events: a.events, GapMs: exactDist(a.gaps), TransitMs: exactDist(a.transit),
		Coalesced: a.coalesced, Delayed: a.delayed, Stalled: a.stalled}
}

// check compares each item's body across the paths; it returns how many
// items were compared and the failures, with any mismatch added. A peer's
// bodies are compared by content, into its own check.
func (c *collector) check(failures []string, paths []path) (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var zero [32]byte
	compared, mismatched := 0, 0
	if c.changed > 0 {
		failures = append(failures, fmt.Sprintf("%d requests were answered differently from an earlier time on the same path", c.changed))
	}
	for item, d := range c.digests {
		if d[0] == zero {
			continue // not sent on the first path (windows of other lengths), or it failed there
		}
		for t := 1; t < len(d); t++ {
			if d[t] == zero {
				continue
			}
			if c.peer[t] {
				pc := &c.peers[t]
				pc.Compared++
				if d[t] == d[0] {
					pc.ByteIdentical++
				}
				if cd := c.contents[item]; cd[t] != cd[0] {
					if pc.ContentDiffered++; len(pc.Errors) < maxPeerErrors {
						pc.Errors = append(pc.Errors, fmt.Sprintf("item %d: the content through %s differs from %s's", item, paths[t].name, paths[0].name))
					}
				}
				continue
			}
			compared++
			if d[t] != d[0] {
				mismatched++
				if mismatched <= 5 {
					failures = append(failures, fmt.Sprintf("item %d: the body through %s differs from %s's", item, paths[t].name, paths[0].name))
				}
			}
		}
	}
	if mismatched > 5 {
		failures = append(failures, fmt.Sprintf("%d bodies differed in all", mismatched))
	}
	for t := range c.peers {
		if pc := &c.peers[t]; pc.Changed > 0 {
			pc.Errors = append(pc.Errors, fmt.Sprintf("%d requests were answered with other content than the time before", pc.Changed))
		}
	}
	return compared, failures
}

// exactDist summarises durations without rounding, in milliseconds
// (nearest-rank percentiles, as everywhere: internal/stats).
func exactDist(d []time.Duration) result.Dist {
	if len(d) == 0 {
		return result.Dist{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) float64 { return stats.Ms(stats.Percentile(s, p/100)) }
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	return result.Dist{N: int64(len(s)), Mean: stats.Ms(sum) / float64(len(s)), P50: at(50), P90: at(90), P95: at(95),
		P99: at(99), P999: at(99.9), Max: stats.Ms(s[len(s)-1]), Min: stats.Ms(s[0])}
}
