package controller

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// Pool is one inference pool backing a virtual model.
type Pool struct {
	Name     string // Envoy cluster name
	Priority int    // 0 = primary, 1 = first backup, ...
}

// SLA holds a virtual model's thresholds; a zero field disables the metric.
// The yaml keys are those of a virtual model's sla section in infergate's
// configuration file.
type SLA struct {
	TTFTP95   time.Duration `json:"ttft_p95_ns" yaml:"ttftP95"`  // p95 of excess TTFT (see the package comment)
	ITLP95    time.Duration `json:"itl_p95_ns" yaml:"itlP95"`    // p95 of per-request ITL p95
	ErrorRate float64       `json:"error_rate" yaml:"errorRate"` // fraction of requests (and failed attempts) with status >= 500 or 429
	// QueueDepth bounds the requests waiting at the pool's model servers
	// (vLLM's num_requests_waiting, summed over endpoints), when the pool's
	// load is reported with ObserveLoad.
	QueueDepth float64 `json:"queue_depth" yaml:"queueDepth"`
}

// NoProbe, as Tuning.ProbeWeight, lets a breached pool be drained to 0
// (a zero ProbeWeight takes the default).
const NoProbe uint32 = math.MaxUint32

// Tuning controls the step. Zero fields take the defaults of WithDefaults;
// to ask for a tiny value use the smallest positive one. The yaml keys are
// those of a virtual model's tuning section in infergate's configuration
// file; BaselineWindow is not configurable there.
type Tuning struct {
	Window          time.Duration `yaml:"window"`          // observations considered (default 30s)
	MinSamples      int           `yaml:"minSamples"`      // per pool per Window before it is judged (default 20; at most MaxMinSamples)
	Interval        time.Duration `yaml:"interval"`        // how often Tick is expected (default 5s); informational
	Step            uint32        `yaml:"step"`            // max weight points moved per Tick (default 10; at most MaxStep)
	Hysteresis      float64       `yaml:"hysteresis"`      // healthy only when every metric < (1-h)*threshold (default 0.2)
	Cooldown        time.Duration `yaml:"cooldown"`        // after a shift away from a pool, no shift toward it for this long (default 30s)
	ProbeWeight     uint32        `yaml:"probeWeight"`     // a breached pool keeps at least this weight (default 5; at most MaxProbeWeight, or NoProbe for 0)
	PrefillPerToken time.Duration `yaml:"prefillPerToken"` // TTFT slope prior, used until enough prompt spread is seen (default 0)
	BaselineWindow  time.Duration `yaml:"-"`               // window for learning the slope (default 10*Window)
}

// Defaults of Tuning.
const (
	DefaultWindow      = 30 * time.Second
	DefaultMinSamples  = 20
	DefaultInterval    = 5 * time.Second
	DefaultStep        = 10
	DefaultHysteresis  = 0.2
	DefaultCooldown    = 30 * time.Second
	DefaultProbeWeight = 5
)

const (
	ringCap     = 4096 // observations kept per pool
	historyCap  = 50   // decisions kept per virtual model
	minPromptCV = 0.2  // prompt-length spread needed to learn the slope
)

// WithDefaults returns t with its zero fields set to the defaults.
func (t Tuning) WithDefaults() Tuning {
	if t.Window == 0 {
		t.Window = DefaultWindow
	}
	if t.MinSamples == 0 {
		t.MinSamples = DefaultMinSamples
	}
	if t.Interval == 0 {
		t.Interval = DefaultInterval
	}
	if t.Step == 0 {
		t.Step = DefaultStep
	}
	if t.Hysteresis == 0 {
		t.Hysteresis = DefaultHysteresis
	}
	if t.Cooldown == 0 {
		t.Cooldown = DefaultCooldown
	}
	if t.ProbeWeight == 0 {
		t.ProbeWeight = DefaultProbeWeight
	}
	if t.BaselineWindow == 0 {
		t.BaselineWindow = 10 * t.Window
	}
	return t
}

// floor is the weight a breached pool keeps.
func (t Tuning) floor() uint32 {
	if t.ProbeWeight == NoProbe {
		return 0
	}
	return t.ProbeWeight
}

// VirtualModel is what clients ask for, backed by pools.
type VirtualModel struct {
	Name   string
	Pools  []Pool
	SLA    SLA
	Tuning Tuning
}

// Observation is one finished request as reported by the meter.
type Observation struct {
	At           time.Time
	VirtualModel string
	Pool         string
	PromptTokens int
	TTFT         time.Duration
	ITLP95       time.Duration // per-request ITL p95 (0 if not streamed / < 2 tokens, or not measured)
	Status       int           // HTTP status, or FailedAttempt
	// Untimed: the meter could not vouch for TTFT (its read was held up):
	// the status counts, the latency does not.
	Untimed bool
}

// FailedAttempt is the Status of an attempt that failed on a pool and was
// retried on another (its status never reached the meter).
const FailedAttempt = -1

// Decision is one change of a virtual model's weights.
type Decision struct {
	At           time.Time            `json:"at"`
	VirtualModel string               `json:"virtual_model"`
	From         map[string]uint32    `json:"from"`   // weights before
	To           map[string]uint32    `json:"to"`     // weights after
	Reason       string               `json:"reason"` // which pool, which metric, the numbers vs thresholds
	Stats        map[string]PoolStats `json:"stats"`
}

// PoolStats is how a pool was judged at a Tick.
type PoolStats struct {
	Samples       int           `json:"samples"`
	ExcessTTFTP95 time.Duration `json:"excess_ttft_p95_ns"`
	TTFTP95       time.Duration `json:"ttft_p95_ns"` // raw, for display
	ITLP95        time.Duration `json:"itl_p95_ns"`
	ErrorRate     float64       `json:"error_rate"`
	Slope         time.Duration `json:"slope_ns_per_token"` // learned TTFT per prompt token
	// QueueDepth and KVCacheUsage are the latest load reported for the
	// pool (-1: none within the window).
	QueueDepth   float64 `json:"queue_depth"`
	KVCacheUsage float64 `json:"kv_cache_usage"`
	Breached     bool    `json:"breached"`
	Healthy      bool    `json:"healthy"` // below thresholds with hysteresis
	Why          string  `json:"why"`     // e.g. "excess TTFT p95 412ms > SLA 300ms"
}

// ModelState is a snapshot of one virtual model, for debug pages and metrics.
type ModelState struct {
	Name    string               `json:"name"`
	SLA     SLA                  `json:"sla"`
	Weights map[string]uint32    `json:"weights"`
	Pools   map[string]PoolStats `json:"pools"`   // as judged at the last Tick
	History []Decision           `json:"history"` // last decisions, oldest first
}

type sample struct {
	at     int64 // unix nanoseconds
	tokens int64
	ttft   int64
	itl    int64
	failed bool
	// untimed: counted for the error rate, no latency.
	untimed bool
}

type poolState struct {
	pool     Pool
	buf      []sample // ring of up to ringCap samples
	next     int      // where the next sample goes once buf is full
	lastAway time.Time
	// judgeFrom: samples before this are not judged — set when a drained
	// pool is probed, so its verdict reflects traffic since the probe, not
	// the slow window that drained it.
	judgeFrom time.Time
	stats     PoolStats
	load      Load // latest ObserveLoad
}

func (p *poolState) add(s sample) {
	if len(p.buf) < ringCap {
		p.buf = append(p.buf, s)
		return
	}
	p.buf[p.next] = s
	p.next = (p.next + 1) % ringCap
}

type model struct {
	name    string
	sla     SLA
	tun     Tuning
	pools   []*poolState
	order   []int // pool indexes by priority, then declaration order
	byPool  map[string]int
	weights []uint32
	desired []uint32 // initial weights, where shifts back return to
	history []Decision
}

// Controller holds the observations and weights of all virtual models.
// Observe, Tick, Weights and State are safe for concurrent use.
type Controller struct {
	now func() time.Time

	mu      sync.Mutex
	models  []*model
	byName  map[string]*model
	ignored uint64 // observations for unknown virtual models or pools

	// scratch buffers for Tick, reused under mu
	excess, ttft, itl []int64
}

// New validates the models and returns a controller with every virtual
// model's weight on its primary pools. now is the clock (time.Now if nil).
func New(models []VirtualModel, now func() time.Time) (*Controller, error) {
	if now == nil {
		now = time.Now
	}
	c := &Controller{now: now, byName: map[string]*model{}}
	var errs []error
	for _, vm := range models {
		if err := vm.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if c.byName[vm.Name] != nil {
			errs = append(errs, fmt.Errorf("virtual model %q: Name: duplicate virtual model", vm.Name))
			continue
		}
		m := &model{
			name:   vm.Name,
			sla:    vm.SLA,
			tun:    vm.Tuning.WithDefaults(),
			byPool: map[string]int{},
		}
		for i, p := range vm.Pools {
			m.pools = append(m.pools, &poolState{pool: p})
			m.byPool[p.Name] = i
			m.order = append(m.order, i)
		}
		slices.SortStableFunc(m.order, func(a, b int) int { return vm.Pools[a].Priority - vm.Pools[b].Priority })
		m.desired = initialWeights(vm.Pools, m.order)
		m.weights = slices.Clone(m.desired)
		c.models = append(c.models, m)
		c.byName[vm.Name] = m
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// initialWeights puts 100 on the top-priority pools, split evenly, the
// remainder going to the first of them in order.
func initialWeights(pools []Pool, order []int) []uint32 {
	w := make([]uint32, len(pools))
	top := pools[order[0]].Priority
	n := 0
	for _, i := range order {
		if pools[i].Priority == top {
			n++
		}
	}
	for k, i := range order[:n] {
		w[i] = uint32(100 / n)
		if k < 100%n {
			w[i]++
		}
	}
	return w
}

// Observe records one request. Observations for unknown virtual models or
// pools are ignored (and counted). A zero At means now.
func (c *Controller) Observe(o Observation) {
	at := o.At
	if at.IsZero() {
		at = c.now()
	}
	s := sample{
		at:      at.UnixNano(),
		tokens:  int64(max(o.PromptTokens, 0)),
		ttft:    int64(o.TTFT),
		itl:     int64(o.ITLP95),
		failed:  o.Status >= 500 || o.Status == 429 || o.Status == FailedAttempt,
		untimed: o.Untimed,
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byName[o.VirtualModel]
	if m == nil {
		c.ignored++
		return
	}
	i, ok := m.byPool[o.Pool]
	if !ok {
		c.ignored++
		return
	}
	m.pools[i].add(s)
}

// Load is a pool's model servers' own view of their load.
type Load struct {
	At           time.Time
	Waiting      float64 // requests queued for a batch slot, all endpoints
	KVCacheUsage float64 // 0..1, mean over endpoints
}

// ObserveLoad records the latest load of pool, for every virtual model it
// serves. A load older than the window is not judged.
func (c *Controller) ObserveLoad(pool string, l Load) {
	if l.At.IsZero() {
		l.At = c.now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.models {
		if i, ok := m.byPool[pool]; ok {
			m.pools[i].load = l
		}
	}
}

// Tick runs one decision step for every virtual model and returns the
// decisions that changed weights, in model order.
func (c *Controller) Tick() []Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	var out []Decision
	for _, m := range c.models {
		for _, p := range m.pools {
			p.stats = c.judge(p, m.sla, m.tun, now)
		}
		if d, ok := m.step(now); ok {
			m.history = append(m.history, cloneDecision(d))
			if len(m.history) > historyCap {
				m.history = slices.Delete(m.history, 0, len(m.history)-historyCap)
			}
			out = append(out, d)
		}
	}
	return out
}

// Weights returns a copy of the virtual model's current weights by pool
// name, or nil for an unknown virtual model.
func (c *Controller) Weights(vm string) map[string]uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byName[vm]
	if m == nil {
		return nil
	}
	return m.weightMap()
}

// State returns a snapshot of every virtual model, in configuration order.
func (c *Controller) State() []ModelState {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ModelState, 0, len(c.models))
	for _, m := range c.models {
		s := ModelState{
			Name:    m.name,
			SLA:     m.sla,
			Weights: m.weightMap(),
			Pools:   m.statsMap(),
			History: make([]Decision, 0, len(m.history)),
		}
		for _, d := range m.history {
			s.History = append(s.History, cloneDecision(d))
		}
		out = append(out, s)
	}
	return out
}

func (m *model) weightMap() map[string]uint32 {
	w := make(map[string]uint32, len(m.pools))
	for i, p := range m.pools {
		w[p.pool.Name] = m.weights[i]
	}
	return w
}

func (m *model) statsMap() map[string]PoolStats {
	s := make(map[string]PoolStats, len(m.pools))
	for _, p := range m.pools {
		s[p.pool.Name] = p.stats
	}
	return s
}

func cloneDecision(d Decision) Decision {
	d.From = maps.Clone(d.From)
	d.To = maps.Clone(d.To)
	d.Stats = maps.Clone(d.Stats)
	return d
}

// cooledDown reports whether a shift toward pool i is allowed.
func (m *model) cooledDown(i int, now time.Time) bool {
	last := m.pools[i].lastAway
	return last.IsZero() || now.Sub(last) >= m.tun.Cooldown
}

// step moves weight for one Tick: away from a breached pool or, failing
// that, back toward a recovered one. It reports whether weights changed.
func (m *model) step(now time.Time) (Decision, bool) {
	floor := m.tun.floor()
	from, to, amt, reason := -1, -1, uint32(0), ""

	// Shift away from the highest-priority breached pool that still has
	// weight above the floor and somewhere to send it.
	for k, i := range m.order {
		st := m.pools[i].stats
		if !st.Breached || m.weights[i] <= floor {
			continue
		}
		j := m.awayTarget(k, now)
		if j < 0 {
			continue
		}
		from, to = i, j
		amt = min(m.tun.Step, m.weights[i]-floor)
		m.pools[i].lastAway = now
		reason = fmt.Sprintf("shift %d from %q to %q: %q breached: %s",
			amt, m.pools[i].pool.Name, m.pools[j].pool.Name, m.pools[i].pool.Name, st.Why)
		break
	}

	// Otherwise shift back toward the highest-priority pool below its
	// initial weight that has recovered and cooled down.
	if from < 0 {
		for _, h := range m.order {
			if m.weights[h] >= m.desired[h] || !m.cooledDown(h, now) {
				continue
			}
			st := m.pools[h].stats
			// A drained pool (at its probe weight, or at zero) often gets too
			// little traffic to be judged: once cooled down, send it one
			// step anyway. If it is still slow it breaches again, with
			// enough samples now, and is drained again after the step.
			blind := m.weights[h] <= floor && !st.Breached && !st.Healthy
			if !st.Healthy && !blind {
				continue
			}
			src := -1
			for _, s := range slices.Backward(m.order) {
				if s != h && m.weights[s] > m.desired[s] {
					src = s
					break
				}
			}
			if src < 0 {
				continue
			}
			from, to = src, h
			amt = min(m.tun.Step, m.desired[h]-m.weights[h], m.weights[src]-m.desired[src])
			why := st.Why
			if blind {
				why = "drained and too little traffic to judge; probing blind with one step"
				m.pools[h].judgeFrom = now
			}
			cool := "never shifted away"
			if last := m.pools[h].lastAway; !last.IsZero() {
				cool = fmt.Sprintf("last shift away %s ago >= cooldown %s", now.Sub(last), m.tun.Cooldown)
			}
			reason = fmt.Sprintf("shift %d back to %q from %q: %s; %s",
				amt, m.pools[h].pool.Name, m.pools[src].pool.Name, why, cool)
			break
		}
	}
	if from < 0 || amt == 0 {
		return Decision{}, false
	}
	d := Decision{At: now, VirtualModel: m.name, From: m.weightMap(), Reason: reason}
	m.weights[from] -= amt
	m.weights[to] += amt
	d.To = m.weightMap()
	d.Stats = m.statsMap()
	return d, true
}

// awayTarget picks where traffic leaving m.order[k] goes: the next pool by
// priority that is neither breached nor cooling down, looking at
// lower-priority pools first and then higher-priority ones. -1 if none.
func (m *model) awayTarget(k int, now time.Time) int {
	ok := func(j int) bool { return !m.pools[j].stats.Breached && m.cooledDown(j, now) }
	for _, j := range m.order[k+1:] {
		if ok(j) {
			return j
		}
	}
	for _, j := range m.order[:k] {
		if ok(j) {
			return j
		}
	}
	return -1
}

// Restore resumes a virtual model at weights saved by an earlier run (a
// restarted controller must not jump back to the primary). Pools drained in
// the saved weights count as just shifted away from, so the cooldown holds
// before traffic returns. Weights that do not name exactly the model's
// pools or do not sum to 100 are refused.
func (c *Controller) Restore(vm string, weights map[string]uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byName[vm]
	if m == nil {
		return fmt.Errorf("restore: unknown virtual model %q", vm)
	}
	if len(weights) != len(m.pools) {
		return fmt.Errorf("restore %q: weights for %d pools, the model has %d", vm, len(weights), len(m.pools))
	}
	next := make([]uint32, len(m.pools))
	var sum uint32
	for name, w := range weights {
		i, ok := m.byPool[name]
		if !ok {
			return fmt.Errorf("restore %q: unknown pool %q", vm, name)
		}
		next[i] = w
		sum += w
	}
	if sum != 100 {
		return fmt.Errorf("restore %q: weights sum to %d, not 100", vm, sum)
	}
	now := c.now()
	for i, w := range next {
		if w < m.desired[i] {
			m.pools[i].lastAway = now
		}
	}
	m.weights = next
	return nil
}
