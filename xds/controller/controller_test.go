package controller

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

var testSLA = SLA{TTFTP95: 300 * time.Millisecond, ITLP95: 50 * time.Millisecond, ErrorRate: 0.05}

func twoPools(t Tuning) VirtualModel {
	return VirtualModel{
		Name:   "chat",
		Pools:  []Pool{{Name: "primary", Priority: 0}, {Name: "backup", Priority: 1}},
		SLA:    testSLA,
		Tuning: t,
	}
}

// behaviour is a pool's response to one request.
type behaviour func(rng *rand.Rand, tokens int) (ttft, itl time.Duration, status int)

// normal: 50ms fixed + 200µs of prefill per prompt token + up to 20ms jitter.
func normal(rng *rand.Rand, tokens int) (time.Duration, time.Duration, int) {
	ttft := 50*time.Millisecond + time.Duration(tokens)*200*time.Microsecond + time.Duration(rng.Int64N(int64(20*time.Millisecond)))
	itl := 20*time.Millisecond + time.Duration(rng.Int64N(int64(5*time.Millisecond)))
	return ttft, itl, 200
}

// slower adds d to every request's TTFT (queueing: the intercept moves).
func slower(d time.Duration) behaviour {
	return func(rng *rand.Rand, tokens int) (time.Duration, time.Duration, int) {
		ttft, itl, st := normal(rng, tokens)
		return ttft + d, itl, st
	}
}

// shortSlower adds d only to prompts shorter than 1000 tokens.
func shortSlower(d time.Duration) behaviour {
	return func(rng *rand.Rand, tokens int) (time.Duration, time.Duration, int) {
		ttft, itl, st := normal(rng, tokens)
		if tokens < 1000 {
			ttft += d
		}
		return ttft, itl, st
	}
}

func failing(rate float64, status int) behaviour {
	return func(rng *rand.Rand, tokens int) (time.Duration, time.Duration, int) {
		ttft, itl, st := normal(rng, tokens)
		if rng.Float64() < rate {
			st = status
		}
		return ttft, itl, st
	}
}

func slowITL(itl time.Duration) behaviour {
	return func(rng *rand.Rand, tokens int) (time.Duration, time.Duration, int) {
		ttft, _, st := normal(rng, tokens)
		return ttft, itl, st
	}
}

// uniformPrompts: 200..1000 tokens (coefficient of variation ~0.38).
func uniformPrompts(rng *rand.Rand) int { return 200 + rng.IntN(801) }

// mostlyShortPrompts: 400..600 tokens, but 5% are 10x longer.
func mostlyShortPrompts(rng *rand.Rand) int {
	n := 400 + rng.IntN(201)
	if rng.Float64() < 0.05 {
		n *= 10
	}
	return n
}

// sim drives a controller with synthetic traffic on an injected clock:
// every tick sends perTick requests of one virtual model, split across its
// pools exactly by the current weights, then advances the clock by the
// interval and calls Tick, checking the invariants.
type sim struct {
	t        testing.TB
	now      time.Time
	c        *Controller
	vm       VirtualModel
	rng      *rand.Rand
	perTick  int
	interval time.Duration
	prompts  func(*rand.Rand) int
	pools    map[string]behaviour
	untimed  map[string]bool // pools whose observations the meter could not time
	ticks    int
	all      []Decision
}

func newSim(t testing.TB, vm VirtualModel) *sim {
	t.Helper()
	s := &sim{
		t: t, now: t0, vm: vm,
		rng:      rand.New(rand.NewPCG(1, 2)),
		perTick:  100,
		interval: 5 * time.Second,
		prompts:  uniformPrompts,
		pools:    map[string]behaviour{},
	}
	for _, p := range vm.Pools {
		s.pools[p.Name] = normal
	}
	c, err := New([]VirtualModel{vm}, func() time.Time { return s.now })
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	return s
}

func (s *sim) step() []Decision {
	s.t.Helper()
	before := s.c.Weights(s.vm.Name)
	names := make([]string, 0, len(before))
	for n := range before {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		n := s.perTick * int(before[name]) / 100
		for k := range n {
			at := s.now.Add(time.Duration(k) * s.interval / time.Duration(n))
			tokens := s.prompts(s.rng)
			ttft, itl, status := s.pools[name](s.rng, tokens)
			s.c.Observe(Observation{At: at, VirtualModel: s.vm.Name, Pool: name, PromptTokens: tokens, TTFT: ttft, ITLP95: itl, Status: status,
				Untimed: s.untimed[name]})
		}
	}
	s.now = s.now.Add(s.interval)
	ds := s.c.Tick()
	s.ticks++
	after := s.c.Weights(s.vm.Name)
	s.checkInvariants(before, after, ds)
	s.all = append(s.all, ds...)
	return ds
}

func (s *sim) checkInvariants(before, after map[string]uint32, ds []Decision) {
	s.t.Helper()
	tun := s.vm.Tuning.WithDefaults()
	var sum uint32
	for name, w := range after {
		sum += w
		if d := int(w) - int(before[name]); d > int(tun.Step) || -d > int(tun.Step) {
			s.t.Fatalf("tick %d: %s moved %d points, Step is %d", s.ticks, name, d, tun.Step)
		}
		if w > 100 {
			s.t.Fatalf("tick %d: %s weight %d (negative wrapped?)", s.ticks, name, w)
		}
		// A shift away never takes a pool below the floor (a shift back
		// may drain a backup to 0).
		if w < before[name] && w < tun.floor() && len(ds) == 1 && !strings.Contains(ds[0].Reason, " back to ") {
			s.t.Fatalf("tick %d: %s taken to %d, below ProbeWeight %d: %s", s.ticks, name, w, tun.floor(), ds[0].Reason)
		}
	}
	if sum != 100 {
		s.t.Fatalf("tick %d: weights %v sum to %d", s.ticks, after, sum)
	}
	switch len(ds) {
	case 0:
		if !mapsEqual(before, after) {
			s.t.Fatalf("tick %d: weights changed %v -> %v without a decision", s.ticks, before, after)
		}
	case 1:
		d := ds[0]
		if !mapsEqual(d.From, before) || !mapsEqual(d.To, after) || mapsEqual(before, after) {
			s.t.Fatalf("tick %d: decision %v -> %v, observed %v -> %v", s.ticks, d.From, d.To, before, after)
		}
		if d.Reason == "" || len(d.Stats) != len(s.vm.Pools) || !d.At.Equal(s.now) {
			s.t.Fatalf("tick %d: incomplete decision %+v", s.ticks, d)
		}
		// Never both directions: exactly one pool loses, one gains.
		var up, down int
		for name := range after {
			switch {
			case after[name] > before[name]:
				up++
			case after[name] < before[name]:
				down++
			}
		}
		if up != 1 || down != 1 {
			s.t.Fatalf("tick %d: %v -> %v moves more than one pair", s.ticks, before, after)
		}
	default:
		s.t.Fatalf("tick %d: %d decisions for one virtual model", s.ticks, len(ds))
	}
}

func mapsEqual(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (s *sim) stats(pool string) PoolStats {
	return s.c.State()[0].Pools[pool]
}

// run steps n ticks and returns the decisions.
func (s *sim) run(n int) []Decision {
	s.t.Helper()
	var out []Decision
	for range n {
		out = append(out, s.step()...)
	}
	return out
}

func TestInitialWeights(t *testing.T) {
	tests := []struct {
		name  string
		pools []Pool
		want  map[string]uint32
	}{
		{"single", []Pool{{Name: "a"}}, map[string]uint32{"a": 100}},
		{"primary and backup", []Pool{{Name: "b", Priority: 1}, {Name: "a", Priority: 0}}, map[string]uint32{"a": 100, "b": 0}},
		{"shared top priority", []Pool{{Name: "a", Priority: 2}, {Name: "b", Priority: 2}, {Name: "c", Priority: 2}, {Name: "d", Priority: 3}},
			map[string]uint32{"a": 34, "b": 33, "c": 33, "d": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New([]VirtualModel{{Name: "m", Pools: tt.pools}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Weights("m"); !mapsEqual(got, tt.want) {
				t.Errorf("weights %v, want %v", got, tt.want)
			}
		})
	}
}

// degradeTicks is how many ticks after the primary starts breaching its TTFT
// SLA uniformly until the backup carries at least 50: the first tick already
// sees the breach (a sixth of the window is slow, far more than 5%), and
// each tick moves Step=10, so 50/10 = 5.
const degradeTicks = 5

func TestDegrade(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	if ds := s.run(12); len(ds) != 0 {
		t.Fatalf("healthy warm-up made decisions: %v", ds[0].Reason)
	}
	if st := s.stats("primary"); !st.Healthy {
		t.Fatalf("primary not healthy after warm-up: %+v", st)
	}
	s.pools["primary"] = slower(500 * time.Millisecond)
	reached := 0
	for i := 1; i <= degradeTicks; i++ {
		ds := s.step()
		if len(ds) != 1 {
			t.Fatalf("degraded tick %d: %d decisions", i, len(ds))
		}
		if !strings.Contains(ds[0].Reason, "excess TTFT p95") || !strings.Contains(ds[0].Reason, "SLA 300ms") {
			t.Errorf("reason %q does not name the metric and threshold", ds[0].Reason)
		}
		if s.c.Weights("chat")["backup"] >= 50 && reached == 0 {
			reached = i
		}
	}
	if reached == 0 {
		t.Fatalf("backup below 50 after %d ticks: %v", degradeTicks, s.c.Weights("chat"))
	}
	st := s.stats("primary")
	if !st.Breached || st.Healthy || st.ExcessTTFTP95 <= testSLA.TTFTP95 {
		t.Errorf("primary stats %+v, want breached", st)
	}
	// The uniform slowdown moved the intercept, not the slope.
	if st.Slope < 150*time.Microsecond || st.Slope > 250*time.Microsecond {
		t.Errorf("learned slope %s, want ~200µs", st.Slope)
	}
	// Keeps draining down to the probe weight, then holds.
	s.run(10)
	if w := s.c.Weights("chat"); w["primary"] != DefaultProbeWeight || w["backup"] != 100-DefaultProbeWeight {
		t.Errorf("weights %v, want primary at ProbeWeight %d", w, DefaultProbeWeight)
	}
	if h := s.c.State()[0].History; len(h) != 10 {
		t.Errorf("history has %d decisions, want 10", len(h))
	}
}

func TestRecover(t *testing.T) {
	for _, cooldown := range []time.Duration{30 * time.Second, 90 * time.Second} {
		t.Run(cooldown.String(), func(t *testing.T) {
			s := newSim(t, twoPools(Tuning{Cooldown: cooldown}))
			s.run(6)
			s.pools["primary"] = slower(500 * time.Millisecond)
			s.run(14)
			if w := s.c.Weights("chat"); w["primary"] != DefaultProbeWeight {
				t.Fatalf("primary not drained: %v", w)
			}
			var lastAway time.Time
			for _, d := range s.all {
				if d.To["primary"] < d.From["primary"] {
					lastAway = d.At
				}
			}
			s.pools["primary"] = normal
			var backs []Decision
			sawHealthyInCooldown := false
			for range 40 {
				ds := s.step()
				st := s.stats("primary")
				if st.Healthy && s.now.Sub(lastAway) < cooldown {
					sawHealthyInCooldown = true
				}
				for _, d := range ds {
					if d.To["primary"] <= d.From["primary"] {
						t.Fatalf("shifted away from recovered primary: %s", d.Reason)
					}
					if got := d.At.Sub(lastAway); got < cooldown {
						t.Fatalf("shift back %s after last shift away, cooldown %s", got, cooldown)
					}
					if !strings.Contains(d.Reason, "back to \"primary\"") || !strings.Contains(d.Reason, "healthy") {
						t.Errorf("reason %q", d.Reason)
					}
					backs = append(backs, d)
				}
			}
			if w := s.c.Weights("chat"); w["primary"] != 100 {
				t.Fatalf("primary at %d after recovery, want 100", w["primary"])
			}
			// 95 points at Step 10: ten gradual steps (step size is
			// checked by the sim on every tick), on consecutive ticks.
			if len(backs) != 10 {
				t.Errorf("%d shifts back, want 10", len(backs))
			}
			for i := 1; i < len(backs); i++ {
				if got := backs[i].At.Sub(backs[i-1].At); got != s.interval {
					t.Errorf("shift back %d came %s after the previous one", i, got)
				}
			}
			if cooldown > 60*time.Second && !sawHealthyInCooldown {
				t.Errorf("primary never healthy during the %s cooldown; test does not exercise it", cooldown)
			}
		})
	}
}

func TestNoFalseSwitchOnLongPrompts(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	s.prompts = mostlyShortPrompts
	rawOver := 0
	for range 100 {
		if ds := s.step(); len(ds) != 0 {
			t.Fatalf("tick %d: decision on a healthy primary: %s", s.ticks, ds[0].Reason)
		}
		st := s.stats("primary")
		if st.TTFTP95 > testSLA.TTFTP95 {
			rawOver++
		}
		if st.Breached {
			t.Fatalf("tick %d: primary breached: %s", s.ticks, st.Why)
		}
	}
	// A raw-TTFT judge would have switched on these ticks.
	if rawOver == 0 {
		t.Errorf("raw TTFT p95 never above the SLA; long prompts do not exercise the normalisation")
	}
	st := s.stats("primary")
	if st.Slope < 180*time.Microsecond || st.Slope > 220*time.Microsecond {
		t.Errorf("slope %s, want ~200µs", st.Slope)
	}
	if !st.Healthy {
		t.Errorf("primary not healthy: %s", st.Why)
	}

	// Now the short prompts (the bulk) slow down: that is a real breach.
	s.pools["primary"] = shortSlower(400 * time.Millisecond)
	ds := s.run(3)
	if len(ds) != 3 || s.c.Weights("chat")["backup"] != 30 {
		t.Fatalf("short-prompt slowdown: %d decisions, weights %v", len(ds), s.c.Weights("chat"))
	}
}

func TestBreaches(t *testing.T) {
	tests := []struct {
		name   string
		pool   behaviour
		reason string
	}{
		{"uniform TTFT", slower(400 * time.Millisecond), "excess TTFT p95"},
		// Half the requests of the last 5s fail: ~1/12 of the window.
		{"5xx", failing(0.5, 503), "% > SLA 5.0%"},
		{"429", failing(0.5, 429), "error rate "},
		{"ITL", slowITL(100 * time.Millisecond), "ITL p95 100ms > SLA 50ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, twoPools(Tuning{}))
			s.run(8)
			s.pools["primary"] = tt.pool
			ds := s.run(1)
			if len(ds) != 1 {
				t.Fatalf("%d decisions, want 1", len(ds))
			}
			d := ds[0]
			if d.To["primary"] != 90 || d.To["backup"] != 10 {
				t.Errorf("weights %v, want 90/10", d.To)
			}
			if !strings.Contains(d.Reason, tt.reason) || !strings.Contains(d.Reason, `"primary"`) {
				t.Errorf("reason %q, want it to contain %q", d.Reason, tt.reason)
			}
			if !d.Stats["primary"].Breached {
				t.Errorf("stats %+v", d.Stats["primary"])
			}
		})
	}
}

// What the meter could not time (its read held up) counts toward a pool's
// error rate and never toward its latency: a starved meter neither hides a
// failing pool nor makes a fast one look slow.
func TestUntimedObservations(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	s.untimed = map[string]bool{"primary": true}
	s.pools["primary"] = slower(2 * time.Second)
	if ds := s.run(10); len(ds) != 0 {
		t.Fatalf("untimed latencies moved weight: %s", ds[0].Reason)
	}
	if st := s.stats("primary"); st.Samples == 0 || st.TTFTP95 != 0 || st.Breached {
		t.Errorf("primary's stats with untimed observations: %+v", st)
	}
	s.pools["primary"] = failing(0.5, 503)
	ds := s.run(1)
	if len(ds) != 1 || !strings.Contains(ds[0].Reason, "error rate") || ds[0].To["primary"] != 90 {
		t.Fatalf("untimed failures: %+v", ds)
	}
}

func TestErrorRateIgnoresClientErrors(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	s.pools["primary"] = failing(0.5, 404)
	if ds := s.run(10); len(ds) != 0 {
		t.Fatalf("4xx counted as errors: %s", ds[0].Reason)
	}
}

func TestUnknownPoolNoChange(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	s.perTick = 3 // 18 per 30s window < MinSamples 20
	s.pools["primary"] = slower(5 * time.Second)
	if ds := s.run(50); len(ds) != 0 {
		t.Fatalf("decision on an unknown pool: %s", ds[0].Reason)
	}
	st := s.stats("primary")
	if st.Breached || st.Healthy || !strings.Contains(st.Why, "unknown") || st.Samples >= 20 {
		t.Errorf("stats %+v, want unknown", st)
	}
}

func TestProbeWeight(t *testing.T) {
	tests := []struct {
		probe uint32
		floor uint32
	}{{0, DefaultProbeWeight}, {20, 20}, {NoProbe, 0}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.floor), func(t *testing.T) {
			s := newSim(t, twoPools(Tuning{ProbeWeight: tt.probe}))
			s.pools["primary"] = slower(time.Second)
			lowest := uint32(100)
			for range 60 {
				s.step()
				lowest = min(lowest, s.c.Weights("chat")["primary"])
			}
			if lowest != tt.floor {
				t.Errorf("primary went down to %d, want ProbeWeight %d", lowest, tt.floor)
			}
			if tt.floor > 0 {
				if w := s.c.Weights("chat")["primary"]; w != tt.floor {
					t.Errorf("primary at %d, want held at %d", w, tt.floor)
				}
				return
			}
			// Drained to 0, the primary is unobservable; after the
			// cooldown it is probed blind and, still slow, drained again.
			var blind, awayAfter int
			for _, d := range s.all {
				if strings.Contains(d.Reason, "probing blind") {
					blind++
				} else if blind > 0 && d.To["primary"] < d.From["primary"] {
					awayAfter++
				}
			}
			if blind == 0 || awayAfter == 0 {
				t.Errorf("blind probes %d, shifts away after one %d", blind, awayAfter)
			}
		})
	}
}

func TestCascadeToThirdPool(t *testing.T) {
	vm := VirtualModel{
		Name:  "chat",
		Pools: []Pool{{Name: "primary"}, {Name: "backup", Priority: 1}, {Name: "spare", Priority: 2}},
		SLA:   testSLA,
	}
	s := newSim(t, vm)
	s.pools["primary"] = slower(time.Second)
	s.pools["backup"] = slower(time.Second)
	s.run(40)
	want := map[string]uint32{"primary": 5, "backup": 5, "spare": 90}
	if w := s.c.Weights("chat"); !mapsEqual(w, want) {
		t.Errorf("weights %v, want %v", w, want)
	}
}

func TestAllBreachedHolds(t *testing.T) {
	s := newSim(t, VirtualModel{Name: "chat", Pools: []Pool{{Name: "only"}}, SLA: testSLA})
	s.pools["only"] = slower(time.Second)
	if ds := s.run(10); len(ds) != 0 {
		t.Fatalf("single pool moved: %v", ds[0].Reason)
	}
	if !s.stats("only").Breached {
		t.Errorf("not breached")
	}
}

// TestRandomizedInvariants flips pools between behaviours at random (fixed
// seed) and relies on sim.checkInvariants at every tick: sum 100, no
// negative weights, <= Step per tick, floor respected, one direction only.
func TestRandomizedInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	behaviours := []behaviour{normal, normal, slower(time.Second), failing(0.3, 500), slowITL(time.Second), shortSlower(time.Second)}
	for run := range 8 {
		vm := VirtualModel{
			Name: "chat",
			Pools: []Pool{
				{Name: "a", Priority: rng.IntN(2)},
				{Name: "b", Priority: rng.IntN(3)},
				{Name: "c", Priority: 2},
			},
			SLA:    testSLA,
			Tuning: Tuning{Step: uint32(1 + rng.IntN(40)), ProbeWeight: []uint32{0, NoProbe, 3, 20}[rng.IntN(4)], Cooldown: time.Duration(1+rng.IntN(60)) * time.Second},
		}
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			s := newSim(t, vm)
			s.rng = rand.New(rand.NewPCG(uint64(run), 3))
			for range 300 {
				if rng.IntN(8) == 0 {
					p := vm.Pools[rng.IntN(3)].Name
					s.pools[p] = behaviours[rng.IntN(len(behaviours))]
				}
				s.step()
			}
			if h := s.c.State()[0].History; len(h) > historyCap {
				t.Errorf("history %d > %d", len(h), historyCap)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := twoPools(Tuning{})
	tests := []struct {
		name  string
		edit  func(*VirtualModel)
		field string
	}{
		{"valid", func(*VirtualModel) {}, ""},
		{"no name", func(vm *VirtualModel) { vm.Name = "" }, "Name"},
		{"no pools", func(vm *VirtualModel) { vm.Pools = nil }, "Pools"},
		{"duplicate pool", func(vm *VirtualModel) { vm.Pools[1].Name = "primary" }, "Pools[1].Name"},
		{"empty pool name", func(vm *VirtualModel) { vm.Pools[0].Name = "" }, "Pools[0].Name"},
		{"negative priority", func(vm *VirtualModel) { vm.Pools[1].Priority = -1 }, "Pools[1].Priority"},
		{"negative TTFT", func(vm *VirtualModel) { vm.SLA.TTFTP95 = -1 }, "SLA.TTFTP95"},
		{"negative ITL", func(vm *VirtualModel) { vm.SLA.ITLP95 = -1 }, "SLA.ITLP95"},
		{"error rate > 1", func(vm *VirtualModel) { vm.SLA.ErrorRate = 1.5 }, "SLA.ErrorRate"},
		{"negative window", func(vm *VirtualModel) { vm.Tuning.Window = -time.Second }, "Tuning.Window"},
		{"negative min samples", func(vm *VirtualModel) { vm.Tuning.MinSamples = -1 }, "Tuning.MinSamples"},
		{"min samples beyond ring", func(vm *VirtualModel) { vm.Tuning.MinSamples = ringCap }, "Tuning.MinSamples"},
		{"step > 100", func(vm *VirtualModel) { vm.Tuning.Step = 101 }, "Tuning.Step"},
		{"hysteresis 1", func(vm *VirtualModel) { vm.Tuning.Hysteresis = 1 }, "Tuning.Hysteresis"},
		{"negative cooldown", func(vm *VirtualModel) { vm.Tuning.Cooldown = -1 }, "Tuning.Cooldown"},
		{"probe 100", func(vm *VirtualModel) { vm.Tuning.ProbeWeight = 100 }, "Tuning.ProbeWeight"},
		{"negative prefill", func(vm *VirtualModel) { vm.Tuning.PrefillPerToken = -1 }, "Tuning.PrefillPerToken"},
		{"baseline < window", func(vm *VirtualModel) { vm.Tuning.BaselineWindow = time.Second }, "Tuning.BaselineWindow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vm := ok
			vm.Pools = slices.Clone(ok.Pools)
			tt.edit(&vm)
			err := vm.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("error %v, want one naming %s", err, tt.field)
			}
			if _, err := New([]VirtualModel{vm}, nil); err == nil {
				t.Errorf("New accepted an invalid model")
			}
		})
	}
	if _, err := New([]VirtualModel{ok, ok}, nil); err == nil || !strings.Contains(err.Error(), "duplicate virtual model") {
		t.Errorf("duplicate virtual model: %v", err)
	}
}

func TestWithDefaults(t *testing.T) {
	got := Tuning{Window: time.Minute, ProbeWeight: NoProbe}.WithDefaults()
	want := Tuning{Window: time.Minute, MinSamples: 20, Interval: 5 * time.Second, Step: 10, Hysteresis: 0.2,
		Cooldown: 30 * time.Second, ProbeWeight: NoProbe, BaselineWindow: 10 * time.Minute}
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if got.WithDefaults() != got {
		t.Errorf("WithDefaults not idempotent")
	}
}

func TestObserveUnknownIgnored(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	for range 100 {
		s.c.Observe(Observation{At: s.now, VirtualModel: "other", Pool: "primary", TTFT: time.Hour, Status: 500})
		s.c.Observe(Observation{At: s.now, VirtualModel: "chat", Pool: "nope", TTFT: time.Hour, Status: 500})
	}
	if s.c.ignored != 200 {
		t.Errorf("ignored %d, want 200", s.c.ignored)
	}
	if ds := s.run(3); len(ds) != 0 {
		t.Errorf("decisions from ignored observations: %v", ds[0].Reason)
	}
	if w := s.c.Weights("other"); w != nil {
		t.Errorf("weights of unknown model: %v", w)
	}
}

func TestStateIsACopy(t *testing.T) {
	s := newSim(t, twoPools(Tuning{}))
	s.pools["primary"] = slower(time.Second)
	s.run(2)
	st := s.c.State()
	if len(st) != 1 || st[0].Name != "chat" || st[0].SLA != testSLA || len(st[0].History) != 2 {
		t.Fatalf("state %+v", st)
	}
	st[0].Weights["primary"] = 0
	st[0].History[0].To["primary"] = 0
	if s.c.Weights("chat")["primary"] != 80 || s.c.State()[0].History[0].To["primary"] != 90 {
		t.Errorf("state shares maps with the controller")
	}
}

func TestConcurrentObserveAndTick(t *testing.T) {
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	c, err := New([]VirtualModel{twoPools(Tuning{})}, now)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 0))
			for range 3000 {
				tokens := uniformPrompts(rng)
				ttft, itl, st := slower(time.Second)(rng, tokens)
				c.Observe(Observation{At: now(), VirtualModel: "chat", Pool: "primary", PromptTokens: tokens, TTFT: ttft, ITLP95: itl, Status: st})
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			clock.Add(int64(100 * time.Millisecond))
			c.Tick()
			_ = c.State()
			_ = c.Weights("chat")
		}
	})
	wg.Wait()
	var sum uint32
	for _, w := range c.Weights("chat") {
		sum += w
	}
	if sum != 100 {
		t.Errorf("weights sum to %d", sum)
	}
}

func BenchmarkObserve(b *testing.B) {
	c, err := New([]VirtualModel{twoPools(Tuning{})}, func() time.Time { return t0 })
	if err != nil {
		b.Fatal(err)
	}
	o := Observation{At: t0, VirtualModel: "chat", Pool: "primary", PromptTokens: 500, TTFT: 150 * time.Millisecond, ITLP95: 20 * time.Millisecond, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		c.Observe(o)
	}
}

func BenchmarkTick(b *testing.B) {
	vm := VirtualModel{
		Name:  "chat",
		Pools: []Pool{{Name: "a"}, {Name: "b", Priority: 1}, {Name: "c", Priority: 2}},
		SLA:   testSLA,
		// A long window so all 4096 samples per pool are judged.
		Tuning: Tuning{Window: time.Hour},
	}
	now := t0.Add(time.Hour)
	c, err := New([]VirtualModel{vm}, func() time.Time { return now })
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, p := range vm.Pools {
		for i := range ringCap {
			tokens := uniformPrompts(rng)
			ttft, itl, st := normal(rng, tokens)
			c.Observe(Observation{At: t0.Add(time.Duration(i) * time.Millisecond), VirtualModel: "chat", Pool: p.Name, PromptTokens: tokens, TTFT: ttft, ITLP95: itl, Status: st})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		c.Tick()
	}
}

// A drained pool that recovers while getting too little traffic to judge
// is probed with one step and then judged on traffic since the probe only:
// the slow samples that drained it must not drain it again.
func TestProbeJudgesOnlyNewTraffic(t *testing.T) {
	s := newSim(t, twoPools(Tuning{ProbeWeight: 2, Window: 30 * time.Second, Cooldown: 10 * time.Second, MinSamples: 20}))
	s.perTick = 200 // 2% of it, 4 per tick, is 24 per window: judged while slow (MinSamples 20)
	s.pools["primary"] = slower(time.Second)
	s.run(15)
	if w := s.c.Weights("chat")["primary"]; w != 2 {
		t.Fatalf("primary at %d, want drained to 2", w)
	}
	s.perTick = 100 // 2 per tick, 12 per window: too few to judge, so it is probed blind
	s.pools["primary"] = normal
	for range 40 {
		s.step()
		if w := s.c.Weights("chat")["primary"]; w == 100 {
			break
		}
	}
	for _, d := range s.all {
		if d.To["primary"] < d.From["primary"] && strings.Contains(d.Reason, "breached") && d.At.After(t0.Add(15*5*time.Second)) {
			t.Errorf("drained again after it recovered: %s", d.Reason)
		}
	}
	if w := s.c.Weights("chat")["primary"]; w != 100 {
		t.Errorf("primary at %d after recovering, want 100", w)
	}
}

func TestRestore(t *testing.T) {
	s := newSim(t, twoPools(Tuning{Cooldown: 30 * time.Second}))
	if err := s.c.Restore("chat", map[string]uint32{"primary": 20, "backup": 80}); err != nil {
		t.Fatal(err)
	}
	if w := s.c.Weights("chat"); w["primary"] != 20 || w["backup"] != 80 {
		t.Fatalf("weights %v after restore", w)
	}
	// A healthy primary comes back only after the cooldown, step by step.
	ds := s.run(5) // 25 s < cooldown
	if len(ds) != 0 {
		t.Errorf("moved before the cooldown: %s", ds[0].Reason)
	}
	for _, bad := range []map[string]uint32{{"primary": 50}, {"primary": 50, "other": 50}, {"primary": 50, "backup": 40}} {
		if err := s.c.Restore("chat", bad); err == nil {
			t.Errorf("Restore(%v) accepted", bad)
		}
	}
	if err := s.c.Restore("nope", map[string]uint32{"primary": 100}); err == nil {
		t.Error("unknown virtual model accepted")
	}
}

// A pool whose model servers report a queue beyond the SLA is drained even
// before its latency shows it, and even with too few finished requests to
// judge; a stale load report is not judged.
func TestQueueDepth(t *testing.T) {
	vm := twoPools(Tuning{})
	vm.SLA.QueueDepth = 8
	s := newSim(t, vm)
	s.run(12)
	s.c.ObserveLoad("primary", Load{At: s.now, Waiting: 3, KVCacheUsage: 0.5})
	if ds := s.step(); len(ds) != 0 {
		t.Fatalf("queue 3 under SLA 8 moved weights: %v", ds[0].Reason)
	}
	if st := s.stats("primary"); st.QueueDepth != 3 || st.KVCacheUsage != 0.5 || !st.Healthy {
		t.Errorf("stats %+v", st)
	}
	s.perTick = 1 // too few samples to judge latency
	s.c.ObserveLoad("primary", Load{At: s.now, Waiting: 40})
	ds := s.step()
	if len(ds) != 1 || !strings.Contains(ds[0].Reason, "queue depth 40 > SLA 8") {
		t.Fatalf("decisions %v", ds)
	}
	// The report ages out of the window: no longer judged.
	s.run(20)
	if st := s.stats("primary"); st.QueueDepth != -1 || st.Breached {
		t.Errorf("stale load still judged: %+v", st)
	}
}
