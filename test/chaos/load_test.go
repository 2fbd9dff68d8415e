package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

// load is what runs while faults are injected: `infergate-bench bench` and the
// probe clients.
type load struct {
	benchUsers int           // bench users, each with one stream in flight
	probeUsers int           // probe clients next to it
	duration   time.Duration // how long both run
	seed       int
	// probe describes probe client u's i-th request.
	probe func(u, i int, rnd *rand.Rand) probeSpec
}

// inFlight is how many requests the load has in flight at most.
func (l load) inFlight() int { return l.benchUsers + l.probeUsers }

// window is one fault, from its injection to its end.
type window struct {
	fault      *fault
	start, end time.Time
}

// run is what one load came to.
type run struct {
	load          load
	windows       []window
	probes        []result
	bench         benchReport
	before, after balance
	undecided     int64 // requests that reached a pool without the gate's decision
	lost          []string
}

// benchReport is the part of `infergate-bench bench --json` the checks read
// (docs/bench-json.md).
type benchReport struct {
	Metrics struct {
		Requests struct {
			Sent      int `json:"sent"`
			Succeeded int `json:"succeeded"`
			Failed    int `json:"failed"`
		} `json:"requests"`
		Errors struct {
			ByClass  map[string]int    `json:"by_class"`
			Examples map[string]string `json:"examples"`
		} `json:"errors"`
	} `json:"metrics"`
}

// runLoad runs l while events runs (it injects faults and returns their
// windows), then waits for the ledger to settle.
func (r *rig) runLoad(l load, events func() []window) *run {
	r.t.Helper()
	r.quiesce()
	run := &run{load: l, before: r.ledger.settle()}
	undecided := r.undecided()

	out := filepath.Join(r.dir, fmt.Sprintf("bench-%d.json", l.seed))
	args := []string{"bench", "--target", "gateway=" + r.URL, "--model", model,
		"--concurrency", strconv.Itoa(l.benchUsers), "--duration", l.duration.String(),
		"--requests", "100000000", "--input-tokens", "8:48", "--output-tokens", "16:48",
		"--timeout", probeTimeout.String(), "--seed", strconv.Itoa(l.seed + 1), "--json", out}
	for _, k := range apiKeys {
		args = append(args, "--api-key", k.tenant+"="+k.key)
	}
	bench := exec.Command(benchBin, args...)
	var benchLog strings.Builder
	bench.Stdout, bench.Stderr = &benchLog, &benchLog
	if err := bench.Start(); err != nil {
		r.t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), l.duration)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for u := range l.probeUsers {
		wg.Add(1)
		rnd := rand.New(rand.NewPCG(uint64(l.seed), uint64(u)))
		go func() {
			defer wg.Done()
			for i := u; ctx.Err() == nil; i += l.probeUsers {
				spec := l.probe(u, i, rnd)
				// A probe is not cut short by the load's end.
				res := r.probe(context.Background(), spec)
				mu.Lock()
				run.probes = append(run.probes, res)
				mu.Unlock()
			}
		}()
	}
	run.windows = events()
	wg.Wait()
	if err := bench.Wait(); err != nil {
		r.t.Errorf("infergate-bench bench: %v\n%s", err, tail(benchLog.String(), 3000))
	}
	b, err := os.ReadFile(out)
	if err == nil {
		err = json.Unmarshal(b, &run.bench)
	}
	if err != nil || run.bench.Metrics.Requests.Sent == 0 {
		r.t.Fatalf("bench report: %v\n%s", err, tail(benchLog.String(), 3000))
	}
	r.quiesce()
	run.after = r.ledger.settle()
	run.undecided = r.undecided() - undecided
	return run
}

// inject runs f now and returns its window.
func (r *rig) inject(f *fault, rnd *rand.Rand) window {
	w := window{fault: f, start: time.Now()}
	f.inject(r, rnd)
	w.end = time.Now()
	return w
}

// judge checks a run against what its faults said would happen, and
// returns the ledger's difference and bound.
func (r *rig) judge(run *run, name string) (diff, lo, hi int64) {
	allowed := func(p result) bool {
		for _, w := range run.windows {
			f := w.fault
			if !p.start.Before(w.end.Add(recovery)) || !p.end.After(w.start) {
				continue
			}
			switch p.outcome {
			case refused:
				if f.mayRefuse && (f.failFast == 0 || p.end.Sub(p.start) <= f.failFast+200*time.Millisecond) {
					return true
				}
			case dropped:
				if f.mayRefuse {
					return true
				}
			case cut:
				if f.mayCut {
					return true
				}
			}
		}
		return false
	}
	for _, p := range run.probes {
		switch {
		case p.outcome == exact, p.outcome == left && p.spec.leaveAfter > 0, allowed(p):
			continue
		}
		run.lost = append(run.lost, fmt.Sprintf("%s after %s (%s): %s", p.outcome,
			p.end.Sub(p.start).Round(time.Millisecond), p.start.Format("15:04:05.000"), p.detail))
	}
	var mayFail, mayCut bool
	for _, w := range run.windows {
		mayFail = mayFail || w.fault.mayRefuse || w.fault.mayCut
		mayCut = mayCut || w.fault.mayCut
	}
	bt := run.bench.Metrics
	if !mayFail && bt.Requests.Failed > 0 {
		run.lost = append(run.lost, fmt.Sprintf("bench: %d failed %v %v", bt.Requests.Failed, bt.Errors.ByClass, bt.Errors.Examples))
	}
	if !mayCut && bt.Errors.ByClass["stream"] > 0 {
		run.lost = append(run.lost, fmt.Sprintf("bench: %d streams broke %v", bt.Errors.ByClass["stream"], bt.Errors.Examples))
	}
	for _, l := range run.lost {
		r.t.Errorf("%s: %s", name, l)
	}
	if run.undecided > 0 {
		r.t.Errorf("%s: %d requests reached a pool without the gate's decision", name, run.undecided)
	}
	diff = (run.after.charged - run.before.charged) - (run.after.billed - run.before.billed)
	lo, hi = run.ledgerBound()
	if diff < lo || diff > hi {
		r.t.Errorf("%s: ledger charged − billed = %d, outside [%d, %d]", name, diff, lo, hi)
	}
	return diff, lo, hi
}

// ledgerBound is how far what Redis charged may be from what the pools
// billed:
//
//   - a stream whose settlement was lost (the gate killed or frozen past
//     Envoy's patience, Redis down when it ended) keeps its reservation:
//     up to maxReservation more each, for the streams in flight at a fault
//     that keeps reservations;
//   - a response that ended early (a hang-up, a pool or Envoy gone)
//     before its usage or its [DONE] proves no cost: it keeps its
//     reservation too (the accounting rule), up to maxReservation more
//     each. (The lower bound keeps its slack of eventsInFlight per cut:
//     a cut after [DONE] is charged the events counted.)
func (run *run) ledgerBound() (lo, hi int64) {
	for _, w := range run.windows {
		if w.fault.keepsReservations {
			hi += int64(run.load.inFlight()) * maxReservation
		}
	}
	for _, p := range run.probes {
		if p.outcome == cut || p.outcome == left {
			hi += max(promptGap(p.spec.body()), maxReservation)
			lo -= eventsInFlight
		}
	}
	benchCut := int64(run.bench.Metrics.Errors.ByClass["stream"])
	return lo - benchCut*eventsInFlight, hi + benchCut*max(maxPromptGap, maxReservation)
}

const (
	eventsInFlight = 4
	// maxReservation bounds what one request reserves: the tier's cap on
	// output plus the gate's estimate of the largest prompt the load sends
	// (48 synthetic words of at most 10 characters: under 160 tokens).
	maxReservation = maxTokens + 160
	// maxPromptGap: the estimate of a bench prompt (8 to 48 synthetic
	// words) over the pool's count of its words.
	maxPromptGap = 120
	// recovery is how long after a fault ends requests may still fail
	// (Envoy's gRPC reconnect backoff, Redis clients redialling).
	recovery = 2 * time.Second
)

// promptGap is the gate's estimate of body's prompt minus the pool's own
// count (the reference's usage).
func promptGap(body string) int64 {
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		panic(err)
	}
	ans := expectedAnswer(body)
	i := bytes.LastIndex(ans, []byte(`"prompt_tokens":`))
	if i < 0 {
		panic("the reference answer carries no usage")
	}
	rest := ans[i+len(`"prompt_tokens":`):]
	n, _ := strconv.Atoi(string(rest[:bytes.IndexAny(rest, ",}")]))
	return int64(req.PromptTokens - n)
}

// count is how many probes came to o.
func (run *run) count(o outcome) int {
	n := 0
	for _, p := range run.probes {
		if p.outcome == o {
			n++
		}
	}
	return n
}

// slowestRefusal is the longest a refused probe waited for its answer.
func (run *run) slowestRefusal() time.Duration {
	var d time.Duration
	for _, p := range run.probes {
		if p.outcome == refused {
			d = max(d, p.end.Sub(p.start))
		}
	}
	return d
}

// observed summarises the outcomes.
func (run *run) observed() string {
	var counts []string
	for _, o := range []outcome{exact, refused, dropped, cut, left, corrupt, hung} {
		if n := run.count(o); n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, o))
		}
	}
	codes := map[string]int{}
	for _, p := range run.probes {
		if p.outcome == refused {
			codes[p.detail]++
		}
	}
	if len(codes) > 0 {
		counts = append(counts, "refusals: "+tally(codes))
	}
	if slowest := run.slowestRefusal(); slowest > 0 {
		counts = append(counts, fmt.Sprintf("refused in ≤ %s", slowest.Round(time.Millisecond)))
	}
	bt := run.bench.Metrics
	failed := ""
	if bt.Requests.Failed > 0 {
		failed = " (" + tally(bt.Errors.ByClass) + ")"
	}
	return fmt.Sprintf("probes: %s; bench: %d ok, %d failed%s; %d reached a pool undecided",
		strings.Join(counts, ", "), bt.Requests.Succeeded, bt.Requests.Failed, failed, run.undecided)
}

// tally writes counts by name, largest first.
func tally(m map[string]int) string {
	names := slices.Collect(maps.Keys(m))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(m[b]-m[a], strings.Compare(a, b)) })
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d %s", m[n], n)
	}
	return strings.Join(parts, ", ")
}
