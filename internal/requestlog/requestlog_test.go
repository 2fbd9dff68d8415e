package requestlog

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

func stamp(i int) *request.Stamp {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)
	s := &request.Stamp{
		RequestID: fmt.Sprintf("req-%d", i), TraceID: fmt.Sprintf("%032x", i+1), Model: "llama", Pool: "pool-a",
		Tenant: "acme", Status: 200, Decision: "allow", Stream: true, Complete: true,
		Start: start, Sent: start.Add(3 * time.Millisecond),
		Gateway: request.GatewayTime{Total: 2 * time.Millisecond, Gate: time.Millisecond,
			Timings: request.Timings{Auth: 100 * time.Microsecond, Policy: 300 * time.Microsecond, Checks: time.Millisecond}},
		TTFT: 50 * time.Millisecond, E2E: 250 * time.Millisecond,
		Gaps: []time.Duration{20 * time.Millisecond, 21 * time.Millisecond, 19 * time.Millisecond, 40 * time.Millisecond},
	}
	s.Total = s.Gateway.Total + s.Gateway.Checks + s.E2E
	if i%3 == 0 {
		s.Status, s.Pool = 503, "pool-b"
	}
	return s
}

func TestRingKeepsTheNewest(t *testing.T) {
	r := NewRing(4)
	for i := range 6 {
		r.Record(context.Background(), stamp(i))
	}
	got := r.Recent(nil)
	var ids []string
	for _, s := range got {
		ids = append(ids, s.RequestID)
	}
	if strings.Join(ids, ",") != "req-5,req-4,req-3,req-2" {
		t.Errorf("recent %v", ids)
	}
	if _, ok := r.Find("req-1"); ok {
		t.Error("evicted request found")
	}
	if s, ok := r.Find(stamp(4).TraceID); !ok || s.RequestID != "req-4" {
		t.Error("not found by trace id")
	}
}

func TestFilter(t *testing.T) {
	s := stamp(0) // 503 on pool-b
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Status: "5xx"}, true},
		{Filter{Status: "2xx"}, false},
		{Filter{Status: "503"}, true},
		{Filter{Pool: "pool-a"}, false},
		{Filter{Tenant: "acme", Model: "llama"}, true},
		{Filter{Slow: 300 * time.Millisecond}, false},
		{Filter{Slow: 200 * time.Millisecond}, true},
	} {
		if got := tc.f.Match(s); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.f, got, tc.want)
		}
	}
}

// The waterfall's top-level phases tile the request: gateway, then
// moderation, then model, ending at the total.
func TestPhasesTileTheRequest(t *testing.T) {
	s := stamp(1)
	var end float64
	for _, p := range Phases(s) {
		if p.Depth != 0 {
			continue
		}
		if p.FromMs != end {
			t.Errorf("%s starts at %v, the previous phase ended at %v", p.Name, p.FromMs, end)
		}
		end = p.FromMs + p.DurMs
	}
	if end != stats.Ms(s.Total) {
		t.Errorf("phases end at %v, total %v", end, stats.Ms(s.Total))
	}
	bins := Histogram(s.Gaps, 10)
	n := 0
	for _, b := range bins {
		n += b.Count
	}
	if n != len(s.Gaps) || bins[len(bins)-1].Count != 1 {
		t.Errorf("histogram %+v", bins)
	}
}

func TestHandler(t *testing.T) {
	r := NewRing(10)
	for i := range 6 {
		r.Record(context.Background(), stamp(i))
	}
	srv := httptest.NewServer(Handler(r, "http://jaeger/trace/{trace_id}"))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/debug/requests?status=5xx")
	if code != 200 || !strings.Contains(body, "req-3") || strings.Contains(body, "req-4") {
		t.Errorf("filtered list %d: %.300s", code, body)
	}
	code, body = get("/debug/requests?format=json&pool=pool-a")
	var recs []Record
	if code != 200 || json.Unmarshal([]byte(body), &recs) != nil || len(recs) != 4 || recs[0].GapsMs != nil {
		t.Errorf("json list %d: %.300s", code, body)
	}
	code, body = get("/debug/requests/req-4")
	if code != 200 || !strings.Contains(body, `data-phase="stream (decode)"`) ||
		!strings.Contains(body, "http://jaeger/trace/"+stamp(4).TraceID) || !strings.Contains(body, `id="itl"`) {
		t.Errorf("detail %d: %.500s", code, body)
	}
	code, body = get("/debug/requests/req-4?format=json")
	var rec Record
	if code != 200 || json.Unmarshal([]byte(body), &rec) != nil || len(rec.GapsMs) != 4 || rec.TotalMs != 253 {
		t.Errorf("detail json %d: %.300s", code, body)
	}
	if code, _ = get("/debug/requests/nope"); code != 404 {
		t.Errorf("unknown id: %d", code)
	}
	if code, _ = get("/debug/requests?slow_ms=abc"); code != 400 {
		t.Errorf("bad slow_ms: %d", code)
	}
}

// The ring keeps a bounded sample of each request's gaps: a long answer
// does not make the page's memory grow with it.
func TestRingBoundsGaps(t *testing.T) {
	r := NewRing(2)
	gaps := make([]time.Duration, 16384)
	for i := range gaps {
		gaps[i] = time.Duration(i)
	}
	r.Record(context.Background(), &request.Stamp{RequestID: "long", Gaps: gaps})
	got, _ := r.Find("long")
	if len(got.Gaps) != maxKeptGaps || got.Gaps[0] != 0 || got.Gaps[maxKeptGaps-1] != time.Duration((maxKeptGaps-1)*16384/maxKeptGaps) {
		t.Fatalf("kept %d gaps (first %v, last %v), want %d spread evenly", len(got.Gaps), got.Gaps[0], got.Gaps[len(got.Gaps)-1], maxKeptGaps)
	}
}
