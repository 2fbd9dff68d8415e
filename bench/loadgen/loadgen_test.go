package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/bench/result"
)

// Tests that measure timings run in virtual time (virtual, pipenet_test.go):
// the numbers are the mock's, exactly, however busy the machine.

// newMock starts a mock upstream with cfg. conns counts the TCP
// connections it accepted.
func newMock(t *testing.T, cfg mock.Config, wrap func(http.Handler) http.Handler) (m *mock.Server, url string, conns *atomic.Int64) {
	t.Helper()
	m, srv, conns := mockServer(cfg, wrap)
	ts := httptest.NewUnstartedServer(srv.Handler)
	ts.Config.ConnState = srv.ConnState
	ts.Start()
	t.Cleanup(ts.Close)
	return m, ts.URL, conns
}

// mockServer is a mock upstream with cfg, wrapped, as an http.Server whose
// ConnState counts the connections it accepted in conns.
func mockServer(cfg mock.Config, wrap func(http.Handler) http.Handler) (m *mock.Server, srv *http.Server, conns *atomic.Int64) {
	m = mock.New(cfg, slog.New(slog.DiscardHandler))
	h := m.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	conns = new(atomic.Int64)
	srv = &http.Server{Handler: h, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}}
	return m, srv, conns
}

func fixed(n int) result.Range { return result.Range{Min: n, Max: n, Dist: "uniform"} }

// baseConfig is a small closed-loop run against urls (targets a, b, ...).
func baseConfig(urls ...string) Config {
	var ts []Target
	for i, u := range urls {
		ts = append(ts, Target{Name: string(rune('a' + i)), URL: u})
	}
	return Config{
		Targets:     ts,
		Concurrency: 2,
		Measure:     Bound{Requests: 8},
		Seed:        1,
		Timeout:     10 * time.Second,
		Workload: &Workload{
			Models: []result.Weight{{Value: "demo", Weight: 1}},
			Input:  fixed(8),
			Output: fixed(8),
			Stream: true,
		},
	}
}

func run(t *testing.T, cfg Config) *Recording {
	t.Helper()
	rec, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// exactly checks a measurement made in virtual time, where it is exact.
func exactly(t *testing.T, what string, got, want float64) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %.3f, want %g", what, got, want)
	}
}

// TestMeasuresMockCadence checks TTFT, ITL, TPOT and token counts against a
// mock streaming at a known cadence, and the request the generator sent.
func TestMeasuresMockCadence(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		m, url, conns := n.mock(t, mock.Config{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Measure = Bound{Requests: 10}
		cfg.Workload.Output = fixed(16)
		cfg.Workload.Keys = []Key{{Name: "acme", Key: "sk-acme", Weight: 1}}
		cfg.Workload.Headers = map[string]string{"x-bench": "1"}
		rec := run(t, cfg)
		got := rec.Result(0, result.SLO{})
		mt := got.Metrics

		if mt.Requests != (result.Counts{Sent: 10, Succeeded: 10}) || m.Served() != 10 {
			t.Fatalf("requests %+v, mock served %d", mt.Requests, m.Served())
		}
		exactly(t, "TTFT p50 (mock 30ms)", mt.TTFTMs.P50, 30)
		exactly(t, "ITL p50 (mock 5ms)", mt.ITLMs.P50, 5)
		exactly(t, "TPOT p50 (mock 5ms)", mt.TPOTMs.P50, 5)
		exactly(t, "E2E min (30 + 15×5 ms)", mt.E2EMs.Min, 105)
		if mt.ITLMs.N != 10*15 || mt.TPOTMs.N != 10 || mt.MaxStallMs.N != 10 {
			t.Errorf("ITL pooled %d gaps, TPOT %d, stalls %d; want 150, 10, 10", mt.ITLMs.N, mt.TPOTMs.N, mt.MaxStallMs.N)
		}
		if mt.OutputTokens != 160 || mt.TokenSource != "usage" || mt.InputTokens == 0 {
			t.Errorf("tokens: output %d from %q, input %d", mt.OutputTokens, mt.TokenSource, mt.InputTokens)
		}
		if mt.Throughput.RequestsPerS <= 0 || mt.Throughput.OutputTokensPerS != 16*mt.Throughput.RequestsPerS {
			t.Errorf("throughput %+v", mt.Throughput)
		}
		if p := mt.Throughput.PeakConcurrency; p < 1 || p > 2 {
			t.Errorf("peak concurrency %d with 2 users", p)
		}
		// Every CDF and the timeline are filled for the charts.
		for name, cdf := range map[string][][2]float64{"ttft": got.CDF.TTFTMs, "itl": got.CDF.ITLMs, "e2e": got.CDF.E2EMs} {
			if len(cdf) == 0 || len(cdf) > cdfPoints || cdf[len(cdf)-1][1] != 1 {
				t.Errorf("%s CDF: %d points, last %v", name, len(cdf), cdf[len(cdf)-1])
			}
			for i := 1; i < len(cdf); i++ {
				if cdf[i][0] < cdf[i-1][0] || cdf[i][1] < cdf[i-1][1] {
					t.Errorf("%s CDF not monotone at %d: %v then %v", name, i, cdf[i-1], cdf[i])
				}
			}
		}
		if len(got.Timeline) == 0 || got.Timeline[0].Phase != "measure" {
			t.Errorf("timeline %+v", got.Timeline)
		}
		if c := conns.Load(); c > 2 {
			t.Errorf("connections not reused: %d for 2 users", c)
		}

		h, body := m.LastRequest()
		if h.Get("x-bench") != "1" || h.Get("Authorization") != "Bearer sk-acme" {
			t.Errorf("headers not sent: %v", h)
		}
		var req struct {
			Model         string `json:"model"`
			MaxTokens     int    `json:"max_tokens"`
			MinTokens     int    `json:"min_tokens"`
			IgnoreEOS     bool   `json:"ignore_eos"`
			Stream        bool   `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
			Messages []chatMessage `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		if req.Model != "demo" || req.MaxTokens != 16 || req.MinTokens != 16 || !req.IgnoreEOS || !req.Stream ||
			!req.StreamOptions.IncludeUsage || len(req.Messages) != 1 || len(strings.Fields(req.Messages[0].Content)) != 8 {
			t.Errorf("unexpected request body %s", body)
		}
	})
}

// TestInterleavedTargets: every item goes to every target, back to back.
func TestInterleavedTargets(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		ma, urlA, connsA := n.mock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, nil)
		mb, urlB, connsB := n.mock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, nil)
		cfg := n.config(urlA, urlB)
		cfg.Concurrency = 3
		cfg.Measure = Bound{Requests: 20}
		rec := run(t, cfg)
		if ma.Served() != 20 || mb.Served() != 20 {
			t.Fatalf("served %d and %d, want 20 each", ma.Served(), mb.Served())
		}
		start := map[int][2]time.Time{}
		for ti, ss := range rec.Samples {
			if len(ss) != 20 {
				t.Fatalf("target %d: %d samples", ti, len(ss))
			}
			for _, s := range ss {
				if !s.OK() {
					t.Fatalf("target %d: %s", ti, s.Err)
				}
				st := start[s.Item]
				st[ti] = s.Start
				start[s.Item] = st
			}
		}
		// Back to back: in virtual time both of an item's requests leave at
		// the same instant.
		for k, st := range start {
			if !st[0].Equal(st[1]) {
				t.Errorf("item %d sent to a and b %v apart", k, st[1].Sub(st[0]))
			}
		}
		if len(start) != 20 {
			t.Errorf("%d items, want 20", len(start))
		}
		if a, b := connsA.Load(), connsB.Load(); a > 3 || b > 3 {
			t.Errorf("connections not reused: %d and %d for 3 users", a, b)
		}
		c := rec.Compare(0, 1)
		if c.Pairs != 20 {
			t.Errorf("compare paired %d requests, want 20", c.Pairs)
		}
	})
}

// TestInterleavedOrderRotates: item k goes first to target k mod n (seen
// in sequential mode, where each request waits for the one before).
func TestInterleavedOrderRotates(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		var urls []string
		for range 3 {
			_, u, _ := n.mock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, nil)
			urls = append(urls, u)
		}
		cfg := n.config(urls...)
		cfg.Concurrency, cfg.Sequential = 1, true
		cfg.Measure = Bound{Requests: 6}
		rec := run(t, cfg)
		first := map[int]Sample{}
		for _, ss := range rec.Samples {
			for _, s := range ss {
				if f, ok := first[s.Item]; !ok || s.Start.Before(f.Start) {
					first[s.Item] = s
				}
			}
		}
		for k := range 6 {
			if got := first[k].Target; got != k%3 {
				t.Errorf("item %d went first to target %d, want %d", k, got, k%3)
			}
		}
	})
}

// TestCompareKnownDelta: B's mock is 5 ms slower to first token than A's.
func TestCompareKnownDelta(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, urlA, _ := n.mock(t, mock.Config{TTFT: 10 * time.Millisecond, ITL: 2 * time.Millisecond}, nil)
		_, urlB, _ := n.mock(t, mock.Config{TTFT: 15 * time.Millisecond, ITL: 2 * time.Millisecond}, nil)
		cfg := n.config(urlA, urlB)
		cfg.Measure = Bound{Requests: 40}
		cfg.Workload.Output = fixed(4)
		rec := run(t, cfg)
		c := rec.Compare(0, 1)
		if c.A != "a" || c.B != "b" || c.Pairs != 40 {
			t.Fatalf("compare %s vs %s over %d pairs", c.A, c.B, c.Pairs)
		}
		d := c.DeltaTTFTMs
		t.Logf("ΔTTFT mean %.2f %v, median %.2f %v; ΔITL mean %.2f; ΔE2E mean %.2f",
			d.Mean, d.MeanCI95, d.P50, d.P50CI95, c.DeltaITLMs.Mean, c.DeltaE2EMs.Mean)
		exactly(t, "ΔTTFT median", d.P50, 5)
		// The interval must cover the known 5 ms (give or take the mock's own
		// millisecond of scheduling noise).
		if d.P50CI95[0] > 6 || d.P50CI95[1] < 4 || d.P50CI95[0] > d.P50 || d.P50CI95[1] < d.P50 {
			t.Errorf("median CI %v does not cover 5ms around %.2f", d.P50CI95, d.P50)
		}
		if d.MeanCI95[0] > d.Mean || d.MeanCI95[1] < d.Mean || d.MeanCI95[1]-d.MeanCI95[0] > 10 {
			t.Errorf("mean CI %v around %.2f", d.MeanCI95, d.Mean)
		}
		exactly(t, "ΔITL median", c.DeltaITLMs.P50, 0)
		exactly(t, "ΔE2E median", c.DeltaE2EMs.P50, 5)
		if len(d.Edges) != len(d.Counts) || len(d.Counts) == 0 {
			t.Errorf("histogram edges %d, counts %d", len(d.Edges), len(d.Counts))
		}
	})
}

// TestCoordinatedOmission: an open loop at 50 req/s against a target that
// serves 20 req/s, one request at a time. Latency from the intended send
// time shows the backlog that latency from the actual send hides.
func TestCoordinatedOmission(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, url, _ := n.mock(t, mock.Config{TTFT: 40 * time.Millisecond, ITL: time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Rate, cfg.Arrival, cfg.Concurrency = 50, Constant, 1
		cfg.Measure = Bound{Requests: 15}
		cfg.Workload.Output = fixed(1)
		rec := run(t, cfg)
		m := rec.Result(0, result.SLO{}).Metrics
		t.Logf("TTFT p50 %.1f, from intended p50 %.1f; lag p99 %.1f, queue p99 %.1f",
			m.TTFTMs.P50, m.TTFTIntendedMs.P50, m.ScheduleLagMs.P99, m.QueueMs.P99)
		exactly(t, "TTFT p50 (mock 40ms)", m.TTFTMs.P50, 40)
		if m.TTFTIntendedMs.P50 < m.TTFTMs.P50+50 || m.E2EIntendedMs.P99 < m.E2EMs.P99+100 {
			t.Errorf("latency from intended time (p50 %.1f, E2E p99 %.1f) does not show the backlog over %.1f / %.1f",
				m.TTFTIntendedMs.P50, m.E2EIntendedMs.P99, m.TTFTMs.P50, m.E2EMs.P99)
		}
		// Request k waits k × (40 − 20) ms: the last (k = 14) 280 ms.
		exactly(t, "schedule lag p99", m.ScheduleLagMs.P99, 280)
		exactly(t, "queue p99", m.QueueMs.P99, 280)
		if m.Throughput.PeakConcurrency != 1 {
			t.Errorf("peak concurrency %d with a cap of 1", m.Throughput.PeakConcurrency)
		}
		exactly(t, "sent rate (one at a time, 40 ms each)", m.Throughput.SentPerS, 25)
	})
}

// TestPhases: warm-up and cool-down requests load the target but are not
// measured; the first requests here are slow, and all are warm-up.
func TestPhases(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		var seen atomic.Int64
		m, url, _ := n.mock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if seen.Add(1) <= 3 {
					r.Header.Set("x-mock-ttft-ms", "300")
				}
				h.ServeHTTP(w, r)
			})
		})
		cfg := n.config(url)
		cfg.Concurrency = 1
		cfg.Warmup, cfg.Measure, cfg.Cooldown = Bound{Requests: 3}, Bound{Requests: 5}, Bound{Requests: 2}
		rec := run(t, cfg)
		got := rec.Result(0, result.SLO{})
		if got.Metrics.Requests.Sent != 5 || got.Metrics.TTFTMs.N != 5 {
			t.Errorf("measured %d requests (%d TTFTs), want 5", got.Metrics.Requests.Sent, got.Metrics.TTFTMs.N)
		}
		if got.Metrics.TTFTMs.Max != 5 {
			t.Errorf("TTFT max %.1f ms, want the mock's 5 (a slow warm-up request leaked in?)", got.Metrics.TTFTMs.Max)
		}
		var phases [3]int
		for _, s := range rec.Samples[0] {
			phases[s.Phase]++
		}
		if phases != [3]int{3, 5, 2} || m.Served() != 10 {
			t.Errorf("phases %v, served %d; want [3 5 2], 10", phases, m.Served())
		}
		if rec.MeasureFrom <= 0 || rec.CooldownFrom <= rec.MeasureFrom {
			t.Errorf("phase boundaries %s, %s", rec.MeasureFrom, rec.CooldownFrom)
		}
		if tl := got.Timeline; tl[0].Phase != "warmup" {
			t.Errorf("first second is %q, want warmup", tl[0].Phase)
		}
	})
}

// TestPhasesByDuration: an open loop at a constant 100 req/s with 100 ms
// of warm-up measures the 30 arrivals of the next 300 ms.
func TestPhasesByDuration(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, url, _ := n.mock(t, mock.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Rate, cfg.Arrival, cfg.Concurrency = 100, Constant, 0
		cfg.Warmup, cfg.Measure, cfg.Cooldown = Bound{Duration: 100 * time.Millisecond}, Bound{Duration: 300 * time.Millisecond}, Bound{Duration: 50 * time.Millisecond}
		cfg.Workload.Output = fixed(2)
		rec := run(t, cfg)
		m := rec.Result(0, result.SLO{}).Metrics
		if m.Requests.Sent != 30 {
			t.Errorf("measured %d requests, want 30", m.Requests.Sent)
		}
		if rec.MeasureFrom != 100*time.Millisecond || rec.CooldownFrom != 400*time.Millisecond {
			t.Errorf("phases at %s and %s, want 100ms and 400ms", rec.MeasureFrom, rec.CooldownFrom)
		}
	})
}

// TestGoodput: half the requests (drawn by a header mix) are slow; goodput
// counts exactly the fast ones.
func TestGoodput(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, url, _ := n.mock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Concurrency, cfg.Measure = 4, Bound{Requests: 20}
		cfg.Workload.Mixes = []HeaderChoice{{"x-mock-ttft-ms", "5", 1}, {"x-mock-ttft-ms", "150", 1}}
		rec := run(t, cfg)
		fast := 0
		for k := range 20 {
			req, err := cfg.Workload.Item(k)
			if err != nil {
				t.Fatal(err)
			}
			if req.Header.Get("x-mock-ttft-ms") == "5" {
				fast++
			}
		}
		if fast == 0 || fast == 20 {
			t.Fatalf("the header mix drew %d fast requests of 20", fast)
		}
		g := rec.Result(0, result.SLO{TTFTMs: 80}).Metrics.Goodput
		if g.Requests != fast || g.Fraction != float64(fast)/20 || g.RequestsPerS <= 0 {
			t.Errorf("goodput %+v, want %d requests", g, fast)
		}
		if g := rec.Result(0, result.SLO{}).Metrics.Goodput; g.Requests != 20 {
			t.Errorf("without SLOs every success is good: %+v", g)
		}
		if g := rec.Result(0, result.SLO{ITLMs: 0.001}).Metrics.Goodput; g.Requests != 0 {
			t.Errorf("an impossible TPOT SLO left %d good requests", g.Requests)
		}
	})
}

// TestErrorClasses checks each failure is counted in its class.
func TestErrorClasses(t *testing.T) {
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		return "http://" + l.Addr().String()
	}
	raw := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	mockWith := func(f mock.Faults, header string) (string, map[string]string) {
		m, url, _ := newMock(t, mock.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}, nil)
		m.SetFaults(f)
		h := map[string]string{}
		if k, v, ok := strings.Cut(header, ":"); ok {
			h[k] = v
		}
		return url, h
	}
	tok := `data: {"choices":[{"delta":{"content":"x"}}]}` + "\n\n"
	for _, tc := range []struct {
		name    string
		url     string
		headers map[string]string
		timeout time.Duration
		class   string
		n       int // failures of 8
		example string
	}{
		{name: "5xx half", class: ClassHTTP5xx, n: 4, example: "HTTP 503: mock: injected status 503"},
		{name: "429", class: ClassHTTP429, n: 8, example: "HTTP 429"},
		{name: "400", class: ClassHTTP4xx, n: 8, example: "HTTP 400"},
		{name: "connection refused", url: closed(), class: ClassConnection, n: 8},
		{name: "timeout", class: ClassTimeout, n: 8, timeout: 50 * time.Millisecond, example: "timed out after 50ms"},
		{name: "malformed", url: raw("data: {nope\n\n"), class: ClassStream, n: 8, example: "malformed stream event: {nope"},
		{name: "truncated", url: raw(tok + tok), class: ClassStream, n: 8, example: "stream ended without data: [DONE]"},
		{name: "error event", url: raw(tok + `data: {"error":{"message":"overloaded"}}` + "\n\n"), class: ClassStream, n: 8, example: "error event in stream: overloaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, headers := tc.url, tc.headers
			if url == "" {
				switch tc.name {
				case "5xx half":
					url, headers = mockWith(mock.Faults{ErrorRate: 0.5, ErrorStatus: 503}, "")
				case "429":
					url, headers = mockWith(mock.Faults{ErrorRate: 1, ErrorStatus: 429}, "")
				case "400":
					url, headers = mockWith(mock.Faults{}, "x-mock-status:400")
				case "timeout":
					url, headers = mockWith(mock.Faults{}, "x-mock-ttft-ms:2000")
				}
			}
			cfg := baseConfig(url)
			cfg.Workload.Headers = headers
			if tc.timeout > 0 {
				cfg.Timeout = tc.timeout
			}
			e := run(t, cfg).Result(0, result.SLO{}).Metrics.Errors
			if e.Total != tc.n || e.ByClass[tc.class] != tc.n || len(e.ByClass) != 1 {
				t.Errorf("errors %+v, want %d %s", e, tc.n, tc.class)
			}
			if !strings.Contains(e.Examples[tc.class], tc.example) {
				t.Errorf("example %q, want it to contain %q", e.Examples[tc.class], tc.example)
			}
		})
	}
}

// TestNonStreaming: without streaming TTFT is E2E and there is no ITL.
func TestNonStreaming(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, url, _ := n.mock(t, mock.Config{TTFT: 10 * time.Millisecond, ITL: 2 * time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Workload.Stream = false
		rec := run(t, cfg)
		m := rec.Result(0, result.SLO{}).Metrics
		if m.Requests.Succeeded != 8 || m.ITLMs.N != 0 || m.TPOTMs.N != 0 || m.TokenSource != "usage" || m.OutputTokens != 64 {
			t.Errorf("non-streaming: %+v", m)
		}
		if m.TTFTMs != m.E2EMs {
			t.Errorf("TTFT %+v differs from E2E %+v", m.TTFTMs, m.E2EMs)
		}
		exactly(t, "E2E p50 (10 + 7×2 ms)", m.E2EMs.P50, 24)
	})
}

func TestRunStopsOnCancel(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		m, url, _ := n.mock(t, mock.Config{TTFT: 2 * time.Second}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		cfg := n.config(url)
		cfg.Measure = Bound{Requests: 100}
		start := time.Now()
		rec, err := Run(ctx, cfg)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want deadline exceeded", err)
		}
		if d := time.Since(start); d != 100*time.Millisecond {
			t.Errorf("Run returned %s after the start, want 100ms (when its context ended)", d)
		}
		if len(rec.Samples[0]) != 0 || m.Served() > 2 {
			t.Errorf("aborted requests recorded: %d samples, %d served", len(rec.Samples[0]), m.Served())
		}
	})
}

func TestValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"no targets":    func(c *Config) { c.Targets = nil },
		"duplicate":     func(c *Config) { c.Targets = append(c.Targets, c.Targets[0]) },
		"bad url":       func(c *Config) { c.Targets[0].URL = "ftp://x" },
		"no model":      func(c *Config) { c.Workload.Models = nil },
		"concurrency":   func(c *Config) { c.Concurrency = 0 },
		"no bound":      func(c *Config) { c.Measure = Bound{} },
		"output tokens": func(c *Config) { c.Workload.Output = fixed(0) },
		"prefix share":  func(c *Config) { c.Workload.Prefix.Share = 2 },
		"ramp users":    func(c *Config) { c.Rate, c.RampUsers = 10, 1 },
		"arrival":       func(c *Config) { c.Rate, c.Arrival = 10, "lumpy" },
		"negative rate": func(c *Config) { c.Rate = -1 },
	} {
		cfg := baseConfig("http://127.0.0.1:1")
		mut(&cfg)
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestRampUsers: users start one by one, so the first requests run alone.
func TestRampUsers(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		_, url, _ := n.mock(t, mock.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Concurrency, cfg.RampUsers = 3, 10 // one user every 100 ms
		cfg.Measure = Bound{Duration: 250 * time.Millisecond}
		rec := run(t, cfg)
		ss := rec.Samples[0]
		if len(ss) == 0 {
			t.Fatal("no samples")
		}
		started := map[time.Duration]bool{}
		for _, s := range ss {
			if off := s.Intended.Sub(rec.Start); off == 0 || off == 100*time.Millisecond || off == 200*time.Millisecond {
				started[off] = true
			}
		}
		if len(started) != 3 {
			t.Errorf("users' first intended times %v, want 0, 100ms and 200ms", started)
		}
	})
}

func TestJudgeFailuresMissSLO(t *testing.T) {
	rec := &Recording{Targets: []Target{{Name: "t", URL: "http://x"}}, Samples: [][]Sample{make([]Sample, 100)}}
	for i := range rec.Samples[0] {
		s := &rec.Samples[0][i]
		s.Phase, s.TTFT, s.E2E = Measure, 10*time.Millisecond, 20*time.Millisecond
	}
	if ok, why := rec.Judge(0, result.SLO{TTFTMs: 50}); !ok {
		t.Errorf("all fast: %s", why)
	}
	rec.Samples[0][0].fail(ClassHTTP5xx, "HTTP 503")
	rec.Samples[0][1].fail(ClassHTTP5xx, "HTTP 503")
	ok, why := rec.Judge(0, result.SLO{TTFTMs: 50})
	if ok || why != "p99: 2 of 100 requests failed" {
		t.Errorf("2%% failed at p99: ok %v, why %q", ok, why)
	}
	if ok, why := rec.Judge(0, result.SLO{TTFTMs: 50, Percentile: 95}); !ok {
		t.Errorf("2%% failed at p95: %s", why)
	}
	if ok, why := rec.Judge(0, result.SLO{TTFTMs: 5, Percentile: 95}); ok || why != "ttft_ms p95 10.0 > 5" {
		t.Errorf("slow at p95: ok %v, why %q", ok, why)
	}
}

func TestTokenSource(t *testing.T) {
	for _, tc := range []struct {
		n    [4]int
		want string
	}{{[4]int{0, 3, 0, 0}, "usage"}, {[4]int{0, 0, 2, 0}, "events"}, {[4]int{0, 1, 1, 0}, "mixed"}, {[4]int{}, ""}} {
		if got := tokenSource(tc.n); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.n, got, tc.want)
		}
	}
}

// TestAPIsAgainstMock runs each API against the mock, streamed and not:
// the generator must find each stream's content events and usage, and its
// token counts must be the mock's own ledger.
func TestAPIsAgainstMock(t *testing.T) {
	for _, api := range APIs {
		for _, stream := range []bool{true, false} {
			if api == APIEmbeddings && !stream {
				continue // never streams: one run covers it
			}
			t.Run(fmt.Sprintf("%s stream=%v", api, stream), func(t *testing.T) {
				m, url, _ := newMock(t, mock.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond}, nil)
				cfg := baseConfig(url)
				cfg.Workload.API, cfg.Workload.Stream = api, stream
				cfg.Workload.Keys = []Key{{Name: "acme", Key: "sk-acme", Weight: 1}}
				mt := run(t, cfg).Result(0, result.SLO{}).Metrics
				if mt.Requests != (result.Counts{Sent: 8, Succeeded: 8}) {
					t.Fatalf("requests %+v: %v", mt.Requests, mt.Errors.Examples)
				}
				usage := m.Usage()
				if mt.InputTokens != usage.PromptTokens || mt.OutputTokens != usage.CompletionTokens || mt.TokenSource != "usage" {
					t.Errorf("tokens in %d out %d (%s), mock billed %+v", mt.InputTokens, mt.OutputTokens, mt.TokenSource, usage)
				}
				if mt.E2EMs.N != 8 {
					t.Errorf("E2E n %d", mt.E2EMs.N)
				}
				switch {
				case api == APIEmbeddings:
					if mt.TTFTMs.N != 0 || mt.ITLMs.N != 0 || mt.OutputTokens != 0 || mt.InputTokens != 8*8 {
						t.Errorf("embeddings: ttft n %d, itl n %d, tokens %d/%d", mt.TTFTMs.N, mt.ITLMs.N, mt.InputTokens, mt.OutputTokens)
					}
				case stream:
					if mt.TTFTMs.N != 8 || mt.ITLMs.N != 8*7 || mt.TPOTMs.N != 8 || mt.OutputTokens != 64 {
						t.Errorf("ttft n %d, itl n %d, tpot n %d, output %d", mt.TTFTMs.N, mt.ITLMs.N, mt.TPOTMs.N, mt.OutputTokens)
					}
				default:
					if mt.TTFTMs != mt.E2EMs || mt.ITLMs.N != 0 || mt.OutputTokens != 64 {
						t.Errorf("ttft %+v, e2e %+v, itl n %d", mt.TTFTMs, mt.E2EMs, mt.ITLMs.N)
					}
				}
				h, _ := m.LastRequest()
				key := h.Get("Authorization")
				if api == APIMessages {
					key = "Bearer " + h.Get("x-api-key")
				}
				if key != "Bearer sk-acme" {
					t.Errorf("key not sent: %v", h)
				}
			})
		}
	}
}
