// Package loadgen is a load generator for LLM inference APIs (OpenAI chat
// completions by default; see API for the others). It measures what a
// client sees: time to first token (TTFT), the gaps between content events
// (inter-token latency, ITL), end-to-end latency (E2E) and throughput, in a closed loop (a number of
// users) or an open loop (arrivals on a seeded schedule), with latency also
// measured from each request's intended send time so that an overloaded
// target cannot hide behind coordinated omission.
//
// Several targets are driven by the same schedule: each workload item goes
// to every target, back to back in an order that rotates item by item, so
// that on a noisy machine every target sees the same conditions and the
// same requests, and a paired comparison measures the targets rather than
// the moment each one happened to run.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/bench/internal/pacer"
)

// Target is one endpoint under test.
type Target struct {
	Name string `json:"name"` // label in results; must be unique within a run
	URL  string `json:"url"`  // base URL, e.g. http://127.0.0.1:10000; requests go to URL+Workload.API.Path()
	// Headers are sent to this target only, on top of the workload's (a
	// gateway's routing headers, say).
	Headers map[string]string `json:"headers,omitempty"`
}

// Phase is the part of a run a request was sent in. Only Measure requests
// count in the metrics; the others keep the target loaded around them.
type Phase uint8

// Phases, in run order.
const (
	Warmup Phase = iota
	Measure
	Cooldown
)

func (p Phase) String() string {
	return [...]string{"warmup", "measure", "cooldown"}[p]
}

// Bound ends a phase after Requests items or Duration, whichever comes
// first; a zero Bound is an empty phase. Time is the open-loop schedule's
// (intended send times) or, in a closed loop, the wall clock.
type Bound struct {
	Requests int
	Duration time.Duration
}

// IsZero reports whether the phase is empty.
func (b Bound) IsZero() bool { return b.Requests <= 0 && b.Duration <= 0 }

// Config configures Run.
type Config struct {
	Targets []Target

	// Rate zero is a closed loop: Concurrency users, each sending its next
	// item as soon as the previous one finished on every target. Rate
	// positive is an open loop: items arrive on a Schedule, and Concurrency,
	// if positive, caps the items in flight (the wait is Sample.Queue).
	Concurrency int
	Rate        float64 // items per second (each item goes to every target)
	Arrival     Arrival
	Burstiness  float64       // gamma shape
	RampUp      time.Duration // open loop: rate rises linearly from 0; closed loop: users start evenly over it
	RampUsers   float64       // closed loop: users started per second (instead of RampUp)

	Warmup, Measure, Cooldown Bound

	Workload *Workload
	Seed     int64
	Timeout  time.Duration // per request, whole stream included; 0 means none
	// Trace sends a W3C traceparent with each request (a new sampled
	// trace), so the gateway's spans and records carry the client's trace.
	Trace bool

	// Sequential sends an item to the targets one after another, in the
	// rotating order, instead of all at once: at concurrency 1 no two
	// requests then overlap, so the targets never compete for the machine
	// (what a per-request overhead comparison on a small box wants). Each
	// target's Intended is when the previous target's request ended.
	Sequential bool
	// Capture, if set, is called after each request with its response body
	// as read (see Raw), for checks the metrics do not keep: bodies
	// compared byte for byte, a server's emit stamps against arrival. It is
	// called from several goroutines at once; raw is valid only during the
	// call.
	Capture func(s *Sample, raw *Raw)

	// OnSample, if set, is called after each request completes (for
	// progress). It is called from several goroutines at once.
	OnSample func(*Sample)

	// Dial, if set, replaces the TCP dialer: tests run on an in-memory
	// network, on which a synctest bubble's clock can run.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Open reports whether the run is open-loop.
func (c *Config) Open() bool { return c.Rate > 0 }

func (c *Config) validate() error {
	if len(c.Targets) == 0 {
		return errors.New("loadgen: no targets")
	}
	seen := make(map[string]bool, len(c.Targets))
	for _, t := range c.Targets {
		if t.Name == "" || t.URL == "" {
			return fmt.Errorf("loadgen: target %q needs a name and a URL", t.Name+"="+t.URL)
		}
		if u, err := url.Parse(t.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("loadgen: target %q: want an http(s) base URL, got %q", t.Name, t.URL)
		}
		if seen[t.Name] {
			return fmt.Errorf("loadgen: duplicate target name %q", t.Name)
		}
		seen[t.Name] = true
	}
	switch {
	case c.Workload == nil:
		return errors.New("loadgen: no workload")
	case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0:
		return fmt.Errorf("loadgen: rate must be a positive number, got %g", c.Rate)
	case !c.Open() && c.Concurrency < 1:
		return fmt.Errorf("loadgen: concurrency must be at least 1, got %d", c.Concurrency)
	case c.Concurrency < 0:
		return fmt.Errorf("loadgen: negative concurrency %d", c.Concurrency)
	case c.Measure.IsZero():
		return errors.New("loadgen: the measurement needs a request count or a duration")
	case c.Timeout < 0 || c.RampUp < 0 || c.RampUsers < 0:
		return errors.New("loadgen: negative timeout or ramp")
	case c.Open() && c.RampUsers > 0:
		return errors.New("loadgen: users per second ramp is for a closed loop; use a ramp duration")
	}
	for _, b := range []Bound{c.Warmup, c.Measure, c.Cooldown} {
		if b.Requests < 0 || b.Duration < 0 {
			return errors.New("loadgen: negative phase length")
		}
	}
	if c.Open() {
		if _, err := NewSchedule(c.Arrival, c.Rate, c.Burstiness, c.RampUp, c.Seed); err != nil {
			return err
		}
	}
	c.Workload.Seed = c.Seed
	return c.Workload.validate()
}

// Recording is what Run measured: every completed request of every phase,
// plus the ITL histogram of each target's measured requests (gaps are too
// many to keep per request).
type Recording struct {
	Targets []Target
	Start   time.Time
	End     time.Time
	// Samples holds each target's requests, sorted by Start. Requests the
	// run aborted (cancelled, or cool-down cut short) are not included.
	Samples [][]Sample
	// MeasureFrom and CooldownFrom are the phase boundaries as offsets
	// from Start (-1 when the phase never began).
	MeasureFrom, CooldownFrom time.Duration

	mu  sync.Mutex
	itl []*hist
}

// Run sends the workload to every target and records what each request
// saw. If ctx ends early, Run stops, drops the requests it aborted (they
// say nothing about the target) and returns what it has with ctx's error.
func Run(ctx context.Context, cfg Config) (*Recording, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	conns := cfg.Concurrency
	if conns == 0 {
		conns = 1024
	}
	r := &runner{
		cfg:    &cfg,
		client: newClient(conns, len(cfg.Targets), cfg.Dial),
		urls:   make([]string, len(cfg.Targets)),
		rec: &Recording{
			Targets: cfg.Targets,
			Samples: make([][]Sample, len(cfg.Targets)),
			itl:     make([]*hist, len(cfg.Targets)),
		},
	}
	defer r.client.CloseIdleConnections()
	for i, t := range cfg.Targets {
		r.urls[i] = strings.TrimSuffix(t.URL, "/") + cfg.Workload.API.Path()
		r.rec.itl[i] = newHist()
	}
	r.coolCtx, r.endCooldown = context.WithCancel(ctx)
	defer r.endCooldown()
	r.phases = newPhaser([3]Bound{cfg.Warmup, cfg.Measure, cfg.Cooldown}, &r.measuring)

	r.rec.Start = time.Now()
	var err error
	if cfg.Open() {
		err = r.openLoop(ctx)
	} else {
		r.closedLoop(ctx)
	}
	r.wg.Wait()
	r.rec.End = time.Now()
	r.rec.MeasureFrom, r.rec.CooldownFrom = r.phases.from[Measure], r.phases.from[Cooldown]
	for _, ss := range r.rec.Samples {
		slices.SortFunc(ss, func(a, b Sample) int { return a.Start.Compare(b.Start) })
	}
	if err == nil {
		err = ctx.Err()
	}
	return r.rec, err
}

type runner struct {
	cfg       *Config
	client    *http.Client
	urls      []string
	rec       *Recording
	phases    *phaser
	measuring atomic.Int64 // measured items in flight
	coolCtx   context.Context
	// endCooldown cuts short the cool-down requests still running once the
	// run is over: they have done their job, keeping the load on.
	endCooldown context.CancelFunc
	wg          sync.WaitGroup
	readers     sync.Pool
}

// job is one item to send to every target.
type job struct {
	req      *Request
	phase    Phase
	intended time.Time
	queue    time.Duration
}

// closedLoop runs Concurrency users until the phases are over.
func (r *runner) closedLoop(ctx context.Context) {
	users := r.cfg.Concurrency
	step := time.Duration(0)
	switch {
	case r.cfg.RampUsers > 0:
		step = time.Duration(float64(time.Second) / r.cfg.RampUsers)
	case r.cfg.RampUp > 0 && users > 1:
		step = r.cfg.RampUp / time.Duration(users-1)
	}
	for u := range users {
		r.wg.Go(func() {
			intended := r.rec.Start.Add(time.Duration(u) * step)
			if !sleepUntil(ctx, intended) {
				return
			}
			for ctx.Err() == nil {
				k, phase, ok := r.phases.claim(time.Since(r.rec.Start))
				if !ok {
					r.endCooldown()
					return
				}
				req, err := r.cfg.Workload.Item(k)
				if err != nil {
					r.fail(k, phase, intended, err)
					r.phases.finish(phase)
					continue
				}
				r.fire(ctx, job{req: req, phase: phase, intended: intended})
				intended = time.Now()
			}
		})
	}
}

// openLoop dispatches items at their scheduled times until the phases are
// over. Items are built before their time comes, so building never makes
// the generator late; waiting for a concurrency slot does, and is measured.
func (r *runner) openLoop(ctx context.Context) error {
	sched, err := NewSchedule(r.cfg.Arrival, r.cfg.Rate, r.cfg.Burstiness, r.cfg.RampUp, r.cfg.Seed)
	if err != nil {
		return err
	}
	var slots chan struct{}
	if r.cfg.Concurrency > 0 {
		slots = make(chan struct{}, r.cfg.Concurrency)
	}
	for ctx.Err() == nil {
		off := sched.Next()
		intended := r.rec.Start.Add(off)
		k, phase, ok := r.phases.claim(off)
		if !ok {
			// The schedule runs to the end of its last phase.
			sleepUntil(ctx, intended)
			r.endCooldown()
			return nil
		}
		req, err := r.cfg.Workload.Item(k)
		if err != nil {
			r.fail(k, phase, intended, err)
			r.phases.finish(phase)
			continue
		}
		if !sleepUntil(ctx, intended) {
			r.phases.finish(phase)
			return nil
		}
		j := job{req: req, phase: phase, intended: intended}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				r.phases.finish(phase)
				return nil
			}
			j.queue = time.Since(intended)
		}
		r.wg.Go(func() {
			r.fire(ctx, j)
			if slots != nil {
				<-slots
			}
		})
	}
	return nil
}

// fire sends j to every target, back to back, starting with target
// item mod n so that no target always goes first, and waits for all.
func (r *runner) fire(ctx context.Context, j job) {
	defer r.phases.finish(j.phase)
	if j.phase == Cooldown {
		ctx = r.coolCtx
	}
	n := len(r.urls)
	if r.cfg.Sequential {
		for i := range n {
			r.send(ctx, j, (j.req.Item+i)%n)
			j.intended = time.Now()
		}
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		t := (j.req.Item + i) % n
		if i == n-1 {
			r.send(ctx, j, t)
			break
		}
		wg.Go(func() { r.send(ctx, j, t) })
	}
	wg.Wait()
}

func (r *runner) send(ctx context.Context, j job, t int) {
	sr, _ := r.readers.Get().(*streamReader)
	if sr == nil {
		sr = newStreamReader()
	}
	defer r.readers.Put(sr)
	if r.cfg.Capture != nil {
		sr.capture()
	}
	s := Sample{Target: t, Item: j.req.Item, Phase: j.phase, Intended: j.intended, Queue: j.queue}
	do(ctx, r.client, r.urls[t], r.cfg.Targets[t].Headers, j.req, r.cfg.Timeout, r.cfg.Trace, sr, &s)
	if !s.OK() && ctx.Err() != nil {
		return // aborted by the run, not failed by the target
	}
	if r.cfg.Capture != nil {
		r.cfg.Capture(&s, sr.raw)
	}
	r.record(&s, sr.gaps)
}

// fail records an item that could not even be built, on every target.
func (r *runner) fail(k int, phase Phase, intended time.Time, err error) {
	for t := range r.urls {
		s := Sample{Target: t, Item: k, Phase: phase, Intended: intended, Start: time.Now()}
		s.fail(ClassOther, err.Error())
		r.record(&s, nil)
	}
}

func (r *runner) record(s *Sample, gaps []time.Duration) {
	rec := r.rec
	rec.mu.Lock()
	rec.Samples[s.Target] = append(rec.Samples[s.Target], *s)
	if s.Phase == Measure && s.OK() {
		h := rec.itl[s.Target]
		for _, g := range gaps {
			h.record(g)
		}
	}
	rec.mu.Unlock()
	if r.cfg.OnSample != nil {
		r.cfg.OnSample(s)
	}
}

// sleepUntil waits for t; false if ctx ended first. The pacer wakes an
// idle runtime on time: on runtime timers alone, open-loop requests left
// 0.7–0.85 ms after their scheduled times at the median.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	pacer.Expect(t)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// phaser hands out item indices and says which phase each belongs to. A
// phase ends when its Bound is reached; cool-down also lasts until no
// measured item is in flight, so the last measured requests see the same
// load as the first.
type phaser struct {
	mu        sync.Mutex
	bounds    [3]Bound
	phase     Phase
	next      int // next item index
	inPhase   int // items claimed in this phase
	start     time.Duration
	from      [3]time.Duration
	done      bool
	measuring *atomic.Int64
}

func newPhaser(bounds [3]Bound, measuring *atomic.Int64) *phaser {
	p := &phaser{bounds: bounds, measuring: measuring, from: [3]time.Duration{-1, -1, -1}}
	p.enter(Warmup, 0)
	return p
}

// claim returns the next item and its phase; ok is false once the run is over.
func (p *phaser) claim(now time.Duration) (item int, phase Phase, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.done {
		end, over := p.over(now)
		if !over {
			break
		}
		p.enter(p.phase+1, end)
	}
	if p.done {
		return 0, 0, false
	}
	if p.phase == Measure {
		p.measuring.Add(1)
	}
	item, p.next, p.inPhase = p.next, p.next+1, p.inPhase+1
	return item, p.phase, true
}

// finish is called when an item of phase is done on every target.
func (p *phaser) finish(phase Phase) {
	if phase == Measure {
		p.measuring.Add(-1)
	}
}

// over reports whether the current phase has reached its bound, and when
// it ended: its nominal end if its time ran out, else now.
func (p *phaser) over(now time.Duration) (end time.Duration, over bool) {
	b := p.bounds[p.phase]
	switch {
	case p.phase == Cooldown && p.measuring.Load() > 0:
		return 0, false
	case b.Requests > 0 && p.inPhase >= b.Requests:
		return now, true
	case b.Duration > 0 && now-p.start >= b.Duration:
		return p.start + b.Duration, true
	}
	return 0, false
}

// enter starts the first non-empty phase from ph on, at time now.
func (p *phaser) enter(ph Phase, now time.Duration) {
	for int(ph) < len(p.bounds) && p.bounds[ph].IsZero() {
		ph++
	}
	if int(ph) >= len(p.bounds) {
		p.done = true
		return
	}
	p.phase, p.from[ph], p.start, p.inPhase = ph, now, now, 0
}
