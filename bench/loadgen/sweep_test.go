package loadgen

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/bench/result"
)

// kneeServer answers in 2 ms while at most four requests are in flight and
// in 80 ms beyond: a target whose latency jumps past concurrency 4.
func kneeServer(t *testing.T, n *pipeNet) string {
	var inFlight atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
		delay := 2 * time.Millisecond
		if n > 4 {
			delay = 80 * time.Millisecond
		}
		time.Sleep(delay)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"x"}}]}`+"\n\n"+
			`data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n")
	})}
	return n.serve(t, srv)
}

func TestSweepKnee(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		cfg := n.config(kneeServer(t, n))
		cfg.Measure = Bound{Requests: 16}
		spec, err := ParseSweep("concurrency=8,1,2,4")
		if err != nil {
			t.Fatal(err)
		}
		var levels []float64
		sw, recs, err := Sweep(context.Background(), cfg, spec, result.SLO{TTFTMs: 40}, func(_ int, load float64) {
			levels = append(levels, load)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(levels, []float64{1, 2, 4, 8}) || len(recs) != 4 || len(sw.Points) != 4 {
			t.Fatalf("levels %v, %d recordings, %d points", levels, len(recs), len(sw.Points))
		}
		for _, p := range sw.Points {
			t.Logf("concurrency %g: TTFT p99 %.1f ms, meets %v %s", p.Load, p.Metrics.TTFTMs.P99, p.MeetsSLO, p.Why)
		}
		if sw.Knee != 2 || sw.KneeLoad != 4 || sw.Variable != "concurrency" {
			t.Errorf("knee %d at %g, want index 2 at concurrency 4", sw.Knee, sw.KneeLoad)
		}
		if p := sw.Points[3]; p.MeetsSLO || p.Why == "" || p.Metrics.Requests.Sent != 16 {
			t.Errorf("concurrency 8 should miss the SLO: %+v", p)
		}
	})
}

func TestParseSweep(t *testing.T) {
	for in, want := range map[string]SweepSpec{
		"concurrency=1,2,4":     {"concurrency", []float64{1, 2, 4}},
		"concurrency=1:64:2":    {"concurrency", []float64{1, 2, 4, 8, 16, 32, 64}},
		"concurrency=1:10:1.5":  {"concurrency", []float64{1, 2, 3, 5, 8}},
		"rate=0.5,2, 1":         {"rate", []float64{0.5, 1, 2}},
		"rate=10:40:2":          {"rate", []float64{10, 20, 40}},
		"concurrency=4,4,2":     {"concurrency", []float64{2, 4}},
		"concurrency=1.4,2.6,3": {"concurrency", []float64{1, 3}},
	} {
		got, err := ParseSweep(in)
		if err != nil || got.Variable != want.Variable || !slices.Equal(got.Levels, want.Levels) {
			t.Errorf("%q: got %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "users=1,2", "rate=", "rate=1,-2", "rate=1:0:2", "rate=1:8:1", "concurrency=0"} {
		if _, err := ParseSweep(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestKnee(t *testing.T) {
	pts := []result.SweepPoint{{Load: 1, MeetsSLO: true}, {Load: 2, MeetsSLO: false}, {Load: 4, MeetsSLO: true}, {Load: 8}}
	if k := Knee(pts); k != 2 {
		t.Errorf("knee %d, want 2 (the highest load that met the SLO)", k)
	}
	if k := Knee(pts[3:]); k != -1 {
		t.Errorf("knee %d, want -1", k)
	}
}

// TestSweepFindsMockKnee sweeps concurrency against the mock's capacity
// model and checks the knee is where the model puts it. With MaxBatch B, a
// closed loop of C ≤ B users never waits: TTFT is the mock's 30 ms. Beyond
// B, C − B requests wait for a slot, a whole service time S = TTFT +
// (N−1)·ITL = 30 + 7·10 = 100 ms (the users start together), so their TTFT
// is 130 ms. An 80 ms TTFT SLO at p99 then holds up to C = B = 8 and fails
// above; throughput grows up to B and stays there (B/S = 80 requests/s).
// The run is in virtual time (an in-memory network in a synctest bubble), so
// these are the numbers measured, exactly, on any machine.
func TestSweepFindsMockKnee(t *testing.T) {
	virtual(t, func(t *testing.T, n *pipeNet) {
		const batch = 8
		_, url, _ := n.mock(t, mock.Config{MaxBatch: batch, TTFT: 30 * time.Millisecond, ITL: 10 * time.Millisecond}, nil)
		cfg := n.config(url)
		cfg.Measure = Bound{Requests: 32}
		cfg.Workload.Output = fixed(8)
		spec, err := ParseSweep("concurrency=4,8,12,16")
		if err != nil {
			t.Fatal(err)
		}
		sw, _, err := Sweep(context.Background(), cfg, spec, result.SLO{TTFTMs: 80, Percentile: 99}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// What the model says, level by level: TTFT p99 and requests/s.
		want := map[float64][2]float64{4: {30, 40}, 8: {30, 80}, 12: {130, 80}, 16: {130, 80}}
		for _, p := range sw.Points {
			m := p.Metrics
			t.Logf("concurrency %2g: TTFT p50 %6.1f p99 %6.1f ms, %5.1f req/s, meets %v %s",
				p.Load, m.TTFTMs.P50, m.TTFTMs.P99, m.Throughput.RequestsPerS, p.MeetsSLO, p.Why)
			if m.Requests.Failed != 0 {
				t.Errorf("concurrency %g: %d requests failed (%v)", p.Load, m.Requests.Failed, m.Errors.Examples)
			}
			if got := [2]float64{m.TTFTMs.P99, m.Throughput.RequestsPerS}; got != want[p.Load] {
				t.Errorf("concurrency %g: TTFT p99 %g ms, %g req/s; want %g ms, %g req/s", p.Load, got[0], got[1], want[p.Load][0], want[p.Load][1])
			}
		}
		if sw.KneeLoad != batch {
			t.Errorf("knee at concurrency %g, want %d (MaxBatch)", sw.KneeLoad, batch)
		}
		for _, p := range sw.Points[2:] {
			if p.MeetsSLO || !strings.HasPrefix(p.Why, "ttft_ms p99") {
				t.Errorf("concurrency %g should miss the TTFT SLO: meets %v, %q", p.Load, p.MeetsSLO, p.Why)
			}
		}
	})
}
