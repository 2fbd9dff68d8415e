package loadgen

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/result"
)

// kneeServer answers in 2 ms while at most four requests are in flight and
// in 80 ms beyond: a target whose latency jumps past concurrency 4.
func kneeServer(t *testing.T) string {
	var inFlight atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestSweepKnee(t *testing.T) {
	cfg := baseConfig(kneeServer(t))
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
