package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/vtime"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/loadsignal"
)

// The loop's tests run in virtual time (testing/synctest): the ticker fires
// at exactly start+k*interval, and every observation is stamped with the
// bubble's clock, so each assertion names the instant it holds at.

// llama is a virtual model on a primary and a backup pool, at the
// controller's default tuning (5s interval, 30s window, 20 samples, step
// 10, 30s cooldown, probe weight 5).
func llama(sla controller.SLA, metrics ...string) Options {
	return Options{VirtualModels: []VirtualModel{{
		Name: "llama", SLA: sla,
		Pools: []Pool{{Cluster: "pool-a", Priority: 0, Metrics: metrics}, {Cluster: "pool-b", Priority: 1}},
	}}}
}

// testService builds a Service on cfg inside the bubble, its logs in the
// returned buffer and its metrics in the returned reader.
func testService(t *testing.T, cfg Options) (*Service, *syncBuffer, *sdkmetric.ManualReader) {
	t.Helper()
	logs := &syncBuffer{}
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	r, err := New(t.Context(), cfg, slog.New(slog.NewTextHandler(logs, nil)), meter, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r, logs, reader
}

// published is the xDS version a Service on cfg publishes for weights: the
// version is a hash of the routes' content, so equal versions mean the
// same routes went to Envoy.
func published(t *testing.T, cfg Options, weights map[string]uint32) string {
	t.Helper()
	r, _, _ := testService(t, cfg)
	if err := r.ctrl.Restore("llama", weights); err != nil {
		t.Fatal(err)
	}
	v, err := r.push(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// decisions is the infergate.sla.decisions counter for llama.
func decisions(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "infergate.sla.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value("virtual_model"); v.AsString() == "llama" {
					return dp.Value
				}
			}
		}
	}
	return 0
}

// debugState is what /debug/controller?format=json shows.
func debugState(t *testing.T, r *Service) []controller.ModelState {
	t.Helper()
	rec := httptest.NewRecorder()
	r.DebugHandler(rec, httptest.NewRequest("GET", "/debug/controller?format=json", nil))
	var states []controller.ModelState
	if err := json.Unmarshal(rec.Body.Bytes(), &states); err != nil {
		t.Fatalf("/debug/controller?format=json: %v\n%s", err, rec.Body)
	}
	return states
}

// record meters n requests served by pool with status, now.
func record(r *Service, pool string, status, n int) {
	for range n {
		r.Record(context.Background(), &request.Stamp{Model: "llama", Pool: pool, Status: status, TTFT: 50 * time.Millisecond})
	}
}

func weightsOf(a uint32) map[string]uint32 { return map[string]uint32{"pool-a": a, "pool-b": 100 - a} }

// The loop over a breach and a recovery, tick by tick: 20 failures at
// 0.5s breach pool-a's error rate, so every tick from 5s to 30s shifts 10
// points to pool-b (the failures are in the 30s window until 30.5s); at
// 35s pool-a is unknown and nothing moves; 20 successes at 36s make it
// healthy, but it is shifted back only once 30s have passed since the last
// shift away (at 30s): at 60s and 65s, then its samples age out at 66s.
// Each change is published to Envoy, counted, saved in the history with
// its time, and shown by /debug/controller; between ticks nothing moves.
func TestTickShiftsOnTheIntervalAndBackAfterCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := llama(controller.SLA{ErrorRate: 0.1})
		r, logs, reader := testService(t, cfg)
		start := time.Now()
		at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
		versions := map[uint32]string{}
		for _, a := range []uint32{100, 90, 80, 70, 60, 50, 40} {
			versions[a] = published(t, cfg, weightsOf(a))
		}
		if r.xds.Version() != versions[100] {
			t.Fatal("New did not publish the initial weights (pool-a 100)")
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() { defer close(done); r.tick(ctx) }()

		vtime.Advance(500 * time.Millisecond)
		record(r, "pool-a", 503, 20)

		// pool-a's weight after each tick, by second; no entry: unchanged.
		want := map[int]uint32{5: 90, 10: 80, 15: 70, 20: 60, 25: 50, 30: 40, 60: 50, 65: 60}
		weight, changes := uint32(100), int64(0)
		for sec := 1; sec <= 75; sec++ {
			vtime.Advance(time.Until(at(float64(sec))) - time.Nanosecond)
			if got := r.ctrl.Weights("llama")["pool-a"]; got != weight {
				t.Fatalf("%v before the tick at %ds: pool-a weight %d, want %d (no change between ticks)", time.Since(start), sec, got, weight)
			}
			vtime.Advance(time.Nanosecond)
			if sec == 36 {
				record(r, "pool-a", 200, 20)
			}
			if w, ok := want[sec]; ok {
				weight = w
				changes++
			}
			if got := r.ctrl.Weights("llama"); got["pool-a"] != weight || got["pool-b"] != 100-weight {
				t.Fatalf("at %ds: weights %v, want %v", sec, got, weightsOf(weight))
			}
			if sec%5 == 0 {
				if v := r.xds.Version(); v != versions[weight] {
					t.Fatalf("at %ds: Envoy has routes version %s, want that of pool-a %d (%s)", sec, v, weight, versions[weight])
				}
			}
			if got := decisions(t, reader); got != changes {
				t.Fatalf("at %ds: infergate.sla.decisions = %d, want %d", sec, got, changes)
			}
		}

		states := debugState(t, r)
		if len(states) != 1 || len(states[0].History) != int(changes) {
			t.Fatalf("/debug/controller: %+v, want one model with %d decisions", states, changes)
		}
		st := states[0]
		if st.Weights["pool-a"] != 60 || st.Weights["pool-b"] != 40 {
			t.Errorf("/debug/controller weights %v, want pool-a 60, pool-b 40", st.Weights)
		}
		// At 75s the 36s successes are out of the window: unknown.
		if p := st.Pools["pool-a"]; p.Samples != 0 || p.Breached || p.Healthy {
			t.Errorf("/debug/controller pool-a at 75s: %+v, want 0 samples, unknown", p)
		}
		for i, sec := range []int{5, 10, 15, 20, 25, 30, 60, 65} {
			d := st.History[i]
			if !d.At.Equal(at(float64(sec))) {
				t.Errorf("decision %d at %v, want %ds", i, d.At.Sub(start), sec)
			}
			if d.To["pool-a"] != want[sec] {
				t.Errorf("decision %d at %ds: to %v, want pool-a %d", i, sec, d.To, want[sec])
			}
		}
		if got, want := st.History[5].Reason, `shift 10 from "pool-a" to "pool-b": "pool-a" breached: error rate`; !strings.HasPrefix(got, want) {
			t.Errorf("decision at 30s: reason %q, want it to start %q", got, want)
		}
		if got, want := st.History[6].Reason, "last shift away 30s ago >= cooldown 30s"; !strings.HasSuffix(got, want) {
			t.Errorf("decision at 60s: reason %q, want it to end %q", got, want)
		}
		if n := strings.Count(logs.String(), "routes published"); n != int(changes) {
			t.Errorf("%d routes published logged, want %d", n, changes)
		}
		cancel()
		<-done
	})
}

// A forged, replayed or denied stamp moves no weight; a retried request
// counts a failure against each pool it failed on.
func TestRecordJudgesOnlyVerifiedStamps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _, _ := testService(t, llama(controller.SLA{ErrorRate: 0.1}))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.tick(ctx)
		for range 20 {
			r.Record(ctx, &request.Stamp{Model: "llama", Pool: "pool-a", Status: 503, Unverified: true})
			r.Record(ctx, &request.Stamp{Model: "llama", Pool: "pool-a", Status: 503, Decision: "deny"})
		}
		vtime.Advance(5 * time.Second)
		if p := debugState(t, r)[0].Pools["pool-a"]; p.Samples != 0 || r.ctrl.Weights("llama")["pool-a"] != 100 {
			t.Fatalf("unverified and denied stamps were judged: pool-a %+v, weights %v", p, r.ctrl.Weights("llama"))
		}
		// 20 requests that failed on pool-a and were served by pool-b.
		for range 20 {
			r.Record(ctx, &request.Stamp{Model: "llama", Pool: "pool-b", PoolsTried: []string{"pool-a", "pool-b"}, Status: 200})
		}
		vtime.Advance(5 * time.Second)
		st := debugState(t, r)[0]
		if a, b := st.Pools["pool-a"], st.Pools["pool-b"]; a.Samples != 20 || a.ErrorRate != 1 || b.Samples != 20 || b.ErrorRate != 0 {
			t.Fatalf("at 10s: pool-a %+v, pool-b %+v; want 20 failed attempts on pool-a, 20 successes on pool-b", a, b)
		}
		if got := st.Weights["pool-a"]; got != 90 {
			t.Fatalf("at 10s: pool-a weight %d, want 90", got)
		}
		cancel()
	})
}

// The pools' metrics are scraped at start and then every interval; a
// queue deeper than the SLA breaches the pool at the next tick; a failing
// scrape is logged once, keeps the last load until it leaves the window,
// and its recovery is logged once.
func TestScrapeFeedsQueueDepth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, logs, _ := testService(t, llama(controller.SLA{QueueDepth: 8}, "http://pool-a/metrics"))
		start := time.Now()
		var mu sync.Mutex
		var calls []time.Duration
		r.scrape = func(_ context.Context, urls []string) (loadsignal.Load, error) {
			mu.Lock()
			defer mu.Unlock()
			if len(urls) != 1 || urls[0] != "http://pool-a/metrics" {
				t.Errorf("scraped %v", urls)
			}
			now := time.Since(start)
			calls = append(calls, now)
			switch {
			case now == 0:
				return loadsignal.Load{At: time.Now(), Waiting: 12, KVCacheUsage: 0.5}, nil
			case now < 50*time.Second:
				return loadsignal.Load{}, errors.New("connection refused")
			default:
				return loadsignal.Load{At: time.Now(), Waiting: 1}, nil
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { r.tick(ctx) })
		wg.Go(func() { r.scrapeLoads(ctx) })

		vtime.Advance(5 * time.Second)
		p := debugState(t, r)[0].Pools["pool-a"]
		if !p.Breached || p.QueueDepth != 12 || p.KVCacheUsage != 0.5 || r.ctrl.Weights("llama")["pool-a"] != 90 {
			t.Fatalf("at 5s: pool-a %+v, weights %v; want breached by queue 12, pool-a 90", p, r.ctrl.Weights("llama"))
		}
		// The 0s load is judged until it is older than the 30s window.
		vtime.Advance(25 * time.Second)
		if p := debugState(t, r)[0].Pools["pool-a"]; p.QueueDepth != 12 {
			t.Fatalf("at 30s: pool-a queue %v, want the last load, 12", p.QueueDepth)
		}
		vtime.Advance(5 * time.Second)
		if p := debugState(t, r)[0].Pools["pool-a"]; p.QueueDepth != -1 || p.Breached {
			t.Fatalf("at 35s: pool-a %+v, want no load within the window, not breached", p)
		}
		vtime.Advance(20 * time.Second)
		if p := debugState(t, r)[0].Pools["pool-a"]; p.QueueDepth != 1 {
			t.Fatalf("at 55s: pool-a queue %v, want 1 (scraped at 50s)", p.QueueDepth)
		}
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for i, c := range calls {
			if c != time.Duration(i)*5*time.Second {
				t.Fatalf("scrapes at %v, want every 5s from 0", calls)
			}
		}
		if len(calls) != 12 {
			t.Errorf("%d scrapes in 55s, want 12 (0s to 55s)", len(calls))
		}
		for msg, n := range map[string]int{"pool metrics scrape failing": 1, "pool metrics scrape recovered": 1} {
			if got := strings.Count(logs.String(), msg); got != n {
				t.Errorf("%q logged %d times, want %d", msg, got, n)
			}
		}
	})
}

// podsTargets stands for a followed InferencePool: the URLs of its ready
// pods at each scrape.
type podsTargets struct {
	mu   sync.Mutex
	urls []string
}

func (p *podsTargets) URLs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.urls
}

func (p *podsTargets) set(urls ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.urls = urls
}

// A followed pool is scraped at the URLs of its ready pods of the moment;
// with no ready pod nothing is scraped and the pool has no load (its
// queue is not judged), as with a failing scrape: a zero queue would claim
// a health nobody saw.
func TestScrapeFollowsThePoolsPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, logs, _ := testService(t, llama(controller.SLA{QueueDepth: 8}, "http://placeholder/metrics"))
		pods := &podsTargets{}
		pods.set("http://10.0.0.7:8000/metrics", "http://10.0.0.8:8000/metrics")
		r.targets = map[string]metricsTargets{"pool-a": pods}
		var mu sync.Mutex
		var scraped [][]string
		r.scrape = func(_ context.Context, urls []string) (loadsignal.Load, error) {
			mu.Lock()
			defer mu.Unlock()
			scraped = append(scraped, urls)
			return loadsignal.Load{At: time.Now(), Waiting: float64(len(urls))}, nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { r.tick(ctx) })
		wg.Go(func() { r.scrapeLoads(ctx) })

		vtime.Advance(5 * time.Second)
		if q := debugState(t, r)[0].Pools["pool-a"].QueueDepth; q != 2 {
			t.Fatalf("at 5s: queue %v, want 2 (two pods)", q)
		}
		pods.set()
		vtime.Advance(35 * time.Second)
		if p := debugState(t, r)[0].Pools["pool-a"]; p.QueueDepth != -1 || p.Breached {
			t.Fatalf("at 40s with no ready pod: %+v, want no load, not breached", p)
		}
		pods.set("http://10.0.0.9:8000/metrics")
		vtime.Advance(10 * time.Second)
		if q := debugState(t, r)[0].Pools["pool-a"].QueueDepth; q != 1 {
			t.Fatalf("at 50s: queue %v, want 1 (the new pod)", q)
		}
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, urls := range scraped {
			if len(urls) == 0 {
				t.Fatal("scraped with no URL")
			}
		}
		if !strings.Contains(logs.String(), "err=\"no ready pod\"") || strings.Count(logs.String(), "pool metrics scrape failing") != 1 {
			t.Errorf("no ready pod logged as a failing scrape once; logs:\n%s", logs)
		}
	})
}

// syncBuffer is a log destination safe for the loop's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
