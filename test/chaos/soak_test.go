package chaos

import (
	"context"
	"fmt"
	"html/template"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSoak holds a steady mixed load for SOAK_DURATION (default 3m; `make
// soak` runs 30m): streamed and not, HTTP/1.1 and HTTP/2, three tenants on
// three tiers, a policy and a key reload every minute, and one fault of the
// chaos list every SOAK_FAULT_EVERY (default: a sixth of the run, between
// 30s and 3m). Every 10s it samples infergate's memory, goroutines and file
// descriptors and Redis' memory and keys. It passes when no request was
// lost or corrupted, the ledger balances, and each sample series is flat
// after warm-up (RSS and fds on runs of their judgedFrom or longer). The
// report (table and plots) goes to SOAK_REPORT (default bin/soak.html).
func TestSoak(t *testing.T) {
	d := envDuration(t, "SOAK_DURATION", 3*time.Minute)
	every := envDuration(t, "SOAK_FAULT_EVERY", min(max(d/6, 30*time.Second), 3*time.Minute))
	const sampleEvery, reloadEvery = 10 * time.Second, time.Minute

	r := startRig(t)
	rnd := rand.New(rand.NewPCG(3, 4))
	s := r.startSampler(sampleEvery)
	cycle := []*fault{&redisKill, &envoyRestart, &gateFreeze, &poolKill, &controllerKill}
	var marks []mark
	l := load{benchUsers: 2, probeUsers: 4, duration: d, seed: 100,
		probe: func(u, i int, _ *rand.Rand) probeSpec {
			// Clients 0 and 1 stream, 2 and 3 do not; 1 and 3 speak HTTP/2.
			return probeSpec{i: i, stream: u < 2, http2: u%2 == 1, key: apiKeys[i%len(apiKeys)].key}
		}}
	run := r.runLoad(l, func() []window {
		var windows []window
		start := time.Now()
		nextReload, nextFault := start.Add(reloadEvery), start.Add(every)
		for k := 0; ; {
			next := min(nextReload.Sub(start), nextFault.Sub(start), d)
			time.Sleep(time.Until(start.Add(next)))
			switch {
			case next == d:
				return windows
			case nextReload.Sub(start) == next:
				r.reload(k)
				marks = append(marks, mark{at: time.Now(), what: "reload"})
				nextReload = nextReload.Add(reloadEvery)
				k++
			default:
				f := cycle[len(windows)%len(cycle)]
				w := r.inject(f, rnd)
				windows = append(windows, w)
				marks = append(marks, mark{at: w.start, what: f.name})
				nextFault = nextFault.Add(every)
			}
		}
	})
	samples := s.stop()
	diff, lo, hi := r.judge(run, "soak")

	reloads := strings.Count(r.gate.log.String(), `"policy reloaded"`)
	keyReloads := strings.Count(r.gate.log.String(), `"API keys reloaded"`)
	wantReloads := 0
	for _, m := range marks {
		if m.what == "reload" {
			wantReloads++
		}
	}
	if reloads < wantReloads || keyReloads < wantReloads {
		t.Errorf("%d reloads written, %d policy and %d key reloads applied", wantReloads, reloads, keyReloads)
	}

	warmup := min(max(d/5, 30*time.Second), 5*time.Minute)
	var trends []trend
	for _, sr := range series {
		tr := sr.judge(samples, samples[0].at.Add(warmup), d)
		trends = append(trends, tr)
		if !tr.flat {
			t.Errorf("soak: %s is not flat after warm-up: %s", sr.name, tr.text)
		}
	}

	rep := soakReport{Duration: d, FaultEvery: every, Warmup: warmup, Observed: run.observed(), Lost: len(run.lost),
		Diff: diff, Lo: lo, Hi: hi, Billed: run.after.billed - run.before.billed,
		Reloads: fmt.Sprintf("%d written, %d policy and %d key reloads applied", wantReloads, reloads, keyReloads)}
	for _, w := range run.windows {
		rep.Faults = append(rep.Faults, fmt.Sprintf("+%s %s", w.start.Sub(samples[0].at).Round(time.Second), w.fault.name))
	}
	for i, sr := range series {
		rep.Charts = append(rep.Charts, chart{Name: sr.name, Unit: sr.unit, Trend: trends[i].text, Flat: trends[i].flat,
			SVG: plot(samples, sr, marks, samples[0].at.Add(warmup))})
	}
	path := os.Getenv("SOAK_REPORT")
	if path == "" {
		path = filepath.Join(repoRoot, "bin", "soak.html")
	}
	if err := rep.write(path); err != nil {
		t.Error(err)
	}
	var tb strings.Builder
	fmt.Fprintf(&tb, "soak %s (fault every %s, warm-up %s): %s\nlost %d; ledger charged − billed %+d of %d, bound [%d, %d]; %s\n",
		d, every, warmup, run.observed(), len(run.lost), diff, rep.Billed, lo, hi, rep.Reloads)
	for _, c := range rep.Charts {
		fmt.Fprintf(&tb, "  %-22s %s\n", c.Name, c.Trend)
	}
	t.Logf("%s\nreport: %s", tb.String(), path)
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: not a positive duration", name, v)
	}
	return d
}

// reload rewrites the policy data (a tier's request budget moves by one)
// and the keys file (a retired key comes and goes), as an operator would.
func (r *rig) reload(k int) {
	data := strings.Replace(tenantData, "requests_per_minute: 1000000,", "requests_per_minute: "+strconv.Itoa(1000000+k+1)+",", 1)
	write(r.t, r.policyData, data)
	write(r.t, r.keys, keysFile(fmt.Sprintf("- id: retired-%d\n  sha256: %064x\n  tenant: bronze\n", k, k+1)))
}

// mark is a moment worth showing on the plots.
type mark struct {
	at   time.Time
	what string
}

// sample is one reading of everything watched.
type sample struct {
	at     time.Time
	values map[string]float64
}

// seriesSpec is one watched quantity and how flat it must stay.
type seriesSpec struct {
	name, unit string
	// slack is the growth allowed over the measured span, on top of 10%
	// of its mean: the fitted trend may rise at most this much.
	slack float64
	// judgedFrom is the shortest run whose trend is judged; shorter runs
	// show it only. RSS follows the GC's heap goal (GOGC 400: five times
	// the live heap) and settles over minutes, and the fds step once when a
	// fault makes Envoy or the Redis client open new connections: in a
	// 3-minute run one step reads as a trend. The live heap and the
	// goroutines, judged on every run, are where a leak shows first.
	judgedFrom time.Duration
}

var series = []seriesSpec{
	{"infergate RSS", "MiB", 16, 10 * time.Minute},
	{"infergate live heap", "MiB", 4, 0},
	{"infergate goroutines", "", 25, 0},
	{"infergate open fds", "", 10, 10 * time.Minute},
	{"Redis memory", "MiB", 2, 0},
	{"Redis keys", "", 50, 0},
}

type sampler struct {
	r       *rig
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	samples []sample
}

func (r *rig) startSampler(every time.Duration) *sampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sampler{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if v := r.read(); v != nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{time.Now(), v})
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() []sample {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < 3 {
		s.r.t.Fatalf("only %d samples", len(s.samples))
	}
	return s.samples
}

// read takes one sample; nil when a part is unreachable (mid-fault).
func (r *rig) read() map[string]float64 {
	v := map[string]float64{}
	resp, err := http.Get(r.gateAdmin + "/metrics")
	if err != nil {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil
	}
	var nextGC, gogc float64
	for _, line := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(line, " ")
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if !ok || err != nil {
			continue
		}
		switch name {
		case "go_memstats_next_gc_bytes":
			nextGC = f
		case "go_gc_gogc_percent":
			gogc = f
		case "process_resident_memory_bytes":
			v["infergate RSS"] = f / (1 << 20)
		case "go_goroutines":
			v["infergate goroutines"] = f
		case "process_open_fds":
			v["infergate open fds"] = f
		}
	}
	// The heap the last GC left live: its goal is that times 1 + GOGC/100.
	if nextGC > 0 && gogc > 0 {
		v["infergate live heap"] = nextGC / (1 + gogc/100) / (1 << 20)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := r.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(info, "\r\n") {
		if n, ok := strings.CutPrefix(line, "used_memory:"); ok {
			f, _ := strconv.ParseFloat(n, 64)
			v["Redis memory"] = f / (1 << 20)
		}
	}
	keys, err := r.rdb.DBSize(ctx).Result()
	if err != nil {
		return nil
	}
	v["Redis keys"] = float64(keys)
	if len(v) != len(series) {
		r.t.Errorf("a sample lacks a series (infergate's /metrics without Go or process metrics?): %v", v)
		return nil
	}
	return v
}

// trend is a series' least-squares line after warm-up.
type trend struct {
	flat bool
	text string
}

// judge fits a line to the samples after from: flat when its rise over the
// span is at most 10% of the mean plus slack (or when a run of length run
// is too short to judge it).
func (sr seriesSpec) judge(samples []sample, from time.Time, run time.Duration) trend {
	var xs, ys []float64
	for _, s := range samples {
		if !s.at.Before(from) {
			xs = append(xs, s.at.Sub(from).Minutes())
			ys = append(ys, s.values[sr.name])
		}
	}
	if len(xs) < 3 {
		return trend{false, fmt.Sprintf("only %d samples after warm-up", len(xs))}
	}
	slope, mean := fit(xs, ys)
	span := xs[len(xs)-1] - xs[0]
	rise := slope * span
	allowed := 0.1*math.Abs(mean) + sr.slack
	text := fmt.Sprintf("mean %.1f%s, trend %+.2f%s/min (%+.1f over %.0f min; allowed %+.1f)",
		mean, sr.unit, slope, sr.unit, rise, span, allowed)
	if run < sr.judgedFrom {
		return trend{true, text + fmt.Sprintf("; shown, judged on runs of %s or more", sr.judgedFrom)}
	}
	return trend{rise <= allowed, text}
}

func fit(xs, ys []float64) (slope, mean float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	if d := n*sxx - sx*sx; d != 0 {
		slope = (n*sxy - sx*sy) / d
	}
	return slope, sy / n
}

// plot draws one series as an SVG line, the warm-up shaded and the faults
// and reloads marked.
func plot(samples []sample, sr seriesSpec, marks []mark, warm time.Time) template.HTML {
	const w, h, pad = 640.0, 160.0, 36.0
	t0, t1 := samples[0].at, samples[len(samples)-1].at
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range samples {
		lo, hi = min(lo, s.values[sr.name]), max(hi, s.values[sr.name])
	}
	lo, hi = min(lo, 0), hi*1.1+1e-9
	x := func(t time.Time) float64 { return pad + (w-2*pad)*t.Sub(t0).Seconds()/max(t1.Sub(t0).Seconds(), 1) }
	y := func(v float64) float64 { return h - pad/2 - (h-pad)*(v-lo)/(hi-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`, w, h, w, h, template.HTMLEscapeString(sr.name))
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eee"><title>warm-up</title></rect>`, pad, pad/2, max(x(warm)-pad, 0), h-pad)
	for _, m := range marks {
		color := "#bbb"
		if m.what != "reload" {
			color = "#d33"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="3,3"><title>%s</title></line>`,
			x(m.at), x(m.at), pad/2, h-pad/2, color, template.HTMLEscapeString(m.what))
	}
	var pts []string
	for _, s := range samples {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), y(s.values[sr.name])))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="%s"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="2" y="%.1f" font-size="11">%.4g</text><text x="2" y="%.1f" font-size="11">%.4g</text>`, y(hi)+10, hi, y(lo), lo)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" text-anchor="end">%s</text></svg>`, w-pad, h-2, t1.Sub(t0).Round(time.Second))
	return template.HTML(b.String())
}

type chart struct {
	Name, Unit, Trend string
	Flat              bool
	SVG               template.HTML
}

type soakReport struct {
	Duration, FaultEvery, Warmup time.Duration
	Observed, Reloads            string
	Lost                         int
	Diff, Lo, Hi, Billed         int64
	Faults                       []string
	Charts                       []chart
}

var reportPage = template.Must(template.New("soak").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infergate soak: {{.Duration}}</title>
<style>body{font-family:system-ui,sans-serif;max-width:760px;margin:2em auto;color:#222}
td,th{padding:2px 8px;text-align:left;vertical-align:top}.bad{color:#c00}</style></head><body>
<h1>infergate soak: {{.Duration}}</h1>
<table>
<tr><th>load</th><td>2 bench users + 4 probe clients (streamed and not, HTTP/1.1 and HTTP/2, three tenants on three tiers)</td></tr>
<tr><th>observed</th><td>{{.Observed}}</td></tr>
<tr><th>lost or corrupted</th><td{{if .Lost}} class="bad"{{end}}>{{.Lost}}</td></tr>
<tr><th>ledger</th><td>charged − billed {{.Diff}} of {{.Billed}} tokens billed; bound [{{.Lo}}, {{.Hi}}]</td></tr>
<tr><th>reloads</th><td>{{.Reloads}}</td></tr>
<tr><th>faults (every {{.FaultEvery}})</th><td>{{range .Faults}}{{.}}<br>{{end}}</td></tr>
</table>
<p>Samples every 10 s; the grey band is the warm-up ({{.Warmup}}), red lines are faults, grey lines reloads.
A series passes when its least-squares trend after warm-up rises by at most 10% of its mean plus a fixed slack
(RSS and open fds on runs of 10 minutes or more: in shorter ones a single step reads as a trend).</p>
{{range .Charts}}<h2>{{.Name}}{{if .Unit}} ({{.Unit}}){{end}}</h2><p{{if not .Flat}} class="bad"{{end}}>{{.Trend}}</p>{{.SVG}}
{{end}}</body></html>
`))

func (rep soakReport) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return reportPage.Execute(f, rep)
}
