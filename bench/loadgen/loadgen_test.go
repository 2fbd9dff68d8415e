package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
)

// newMock starts a mock upstream (TTFT 30ms, ITL 5ms). conns counts the
// TCP connections it accepted.
func newMock(t *testing.T, wrap func(http.Handler) http.Handler) (m *mock.Server, url string, conns *atomic.Int64) {
	t.Helper()
	m = mock.New(mock.Config{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond}, slog.New(slog.DiscardHandler))
	h := m.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	conns = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return m, srv.URL, conns
}

func TestRunInterleavedAgainstMock(t *testing.T) {
	ma, urlA, connsA := newMock(t, nil)
	mb, urlB, connsB := newMock(t, nil)
	opts := Options{
		Targets:     []Target{{"a", urlA}, {"b", urlB}},
		Model:       "demo",
		Concurrency: 3, // odd, so workers cannot split evenly between targets
		Requests:    7,
		MaxTokens:   16,
		Prompt:      "hello",
		Headers:     map[string]string{"x-bench": "1"},
		Timeout:     5 * time.Second,
	}
	start := time.Now()
	res, err := Run(context.Background(), opts)
	wall := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}

	for name, m := range map[string]*mock.Server{"a": ma, "b": mb} {
		if got := m.Served(); got != int64(opts.Requests) {
			t.Errorf("mock %s served %d requests, want %d", name, got, opts.Requests)
		}
		if got := len(res[name]); got != opts.Requests {
			t.Errorf("target %s has %d samples, want %d", name, got, opts.Requests)
		}
		for _, s := range res[name] {
			if s.Err != "" || s.Status != http.StatusOK {
				t.Errorf("target %s: status %d, err %q", name, s.Status, s.Err)
			}
			if s.OutputTokens != opts.MaxTokens || len(s.Gaps) != opts.MaxTokens-1 {
				t.Errorf("target %s: %d output tokens and %d gaps, want %d and %d",
					name, s.OutputTokens, len(s.Gaps), opts.MaxTokens, opts.MaxTokens-1)
			}
			if s.Bytes == 0 || s.E2E < s.TTFT {
				t.Errorf("target %s: bytes %d, ttft %s, e2e %s", name, s.Bytes, s.TTFT, s.E2E)
			}
		}
	}

	// Keep-alive: no more connections per target than workers.
	if a, b := connsA.Load(), connsB.Load(); a > int64(opts.Concurrency) || b > int64(opts.Concurrency) {
		t.Errorf("connections not reused: %d and %d for %d workers", a, b, opts.Concurrency)
	}

	h, body := ma.LastRequest()
	if h.Get("x-bench") != "1" {
		t.Errorf("custom header not sent: %v", h)
	}
	var req struct {
		Stream        bool `json:"stream"`
		MaxTokens     int  `json:"max_tokens"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []chatMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	if !req.Stream || !req.StreamOptions.IncludeUsage || req.MaxTokens != 16 ||
		len(req.Messages) != 1 || req.Messages[0] != (chatMessage{"user", "hello"}) {
		t.Errorf("unexpected request body %s", body)
	}

	// Interleaved: each target's requests start before the other's end.
	a, b := res["a"], res["b"]
	if !a[0].Start.Before(b[len(b)-1].Start) || !b[0].Start.Before(a[len(a)-1].Start) {
		t.Errorf("targets ran one after the other: a %s..%s, b %s..%s",
			a[0].Start.Format(time.StampMicro), a[len(a)-1].Start.Format(time.StampMicro),
			b[0].Start.Format(time.StampMicro), b[len(b)-1].Start.Format(time.StampMicro))
	}

	var sums []Summary
	for _, tg := range opts.Targets {
		s := Summarize(tg.Name, res[tg.Name], wall)
		sums = append(sums, s)
		if s.Requests != opts.Requests || s.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors", tg.Name, s.Requests, s.Errors)
		}
		// Loose bounds: the box running the test may be small and busy.
		if s.TTFT.P50 < 30*time.Millisecond || s.TTFT.P50 > 300*time.Millisecond {
			t.Errorf("%s: TTFT p50 %s, want about 30ms", tg.Name, s.TTFT.P50)
		}
		if s.ITL.P50 < 2*time.Millisecond || s.ITL.P50 > 20*time.Millisecond {
			t.Errorf("%s: ITL p50 %s, want about 5ms", tg.Name, s.ITL.P50)
		}
		if s.ITL.N != opts.Requests*(opts.MaxTokens-1) {
			t.Errorf("%s: ITL pooled %d gaps, want %d", tg.Name, s.ITL.N, opts.Requests*(opts.MaxTokens-1))
		}
		if s.RequestsPerSec <= 0 || s.OutputTokensPerSec != s.RequestsPerSec*float64(opts.MaxTokens) {
			t.Errorf("%s: %.1f req/s, %.1f tok/s", tg.Name, s.RequestsPerSec, s.OutputTokensPerSec)
		}
	}

	var out bytes.Buffer
	WriteTable(&out, sums)
	for _, want := range []string{"TTFT p50", "ITL p99", "E2E p95", "output tok/s", "errors", " a ", " b ", "delta", "0/7"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

func TestRunCountsErrors(t *testing.T) {
	_, okURL, _ := newMock(t, nil)
	bad, badURL, _ := newMock(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("x-mock-status", "500")
			h.ServeHTTP(w, r)
		})
	})
	opts := Options{
		Targets:     []Target{{"ok", okURL}, {"bad", badURL}},
		Model:       "demo",
		Concurrency: 2,
		Requests:    4,
		MaxTokens:   4,
		Timeout:     5 * time.Second,
	}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if bad.Served() != 4 {
		t.Errorf("bad target served %d, want 4", bad.Served())
	}
	for _, s := range res["bad"] {
		if s.Status != 500 || s.Err != "HTTP 500: mock: injected status 500" {
			t.Errorf("bad target sample: status %d, err %q", s.Status, s.Err)
		}
	}
	okSum, badSum := Summarize("ok", res["ok"], time.Second), Summarize("bad", res["bad"], time.Second)
	if okSum.Errors != 0 || badSum.Errors != 4 || badSum.Requests != 4 {
		t.Errorf("errors: ok %d, bad %d/%d", okSum.Errors, badSum.Errors, badSum.Requests)
	}
	if badSum.TTFT.N != 0 || badSum.RequestsPerSec != 0 {
		t.Errorf("failed requests leaked into latency or throughput: %+v", badSum)
	}
	var out bytes.Buffer
	WriteTable(&out, []Summary{okSum, badSum})
	if !strings.Contains(out.String(), "4/4") || !strings.Contains(out.String(), "+4") {
		t.Errorf("table does not show the errors:\n%s", out.String())
	}
}

// TestReadStream covers stream shapes the mock never produces.
func TestReadStream(t *testing.T) {
	role := `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	tok := `data: {"choices":[{"delta":{"content":"x"}}]}` + "\n\n"
	for _, tc := range []struct {
		name, body string
		tokens     int
		err        string
	}{
		{"no usage counts content events", role + tok + tok + tok + "data: [DONE]\n\n", 3, ""},
		{"usage wins", role + tok + `data: {"choices":[],"usage":{"completion_tokens":7}}` + "\n\ndata: [DONE]\n\n", 7, ""},
		{"crlf and comments", ": ping\r\n" + strings.ReplaceAll(tok, "\n", "\r\n") + "data: [DONE]\r\n\r\n", 1, ""},
		{"truncated", role + tok, 1, "stream ended without data: [DONE]"},
		{"role only", role + "data: [DONE]\n\n", 0, "stream carried no content"},
		{"error event", tok + `data: {"error":{"message":"overloaded"}}` + "\n\n", 1, "error event in stream: overloaded"},
		{"malformed", "data: {nope\n\n", 0, "malformed stream event: {nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			res, err := Run(context.Background(), Options{
				Targets: []Target{{"t", srv.URL}}, Model: "m", Concurrency: 1, Requests: 1, MaxTokens: 8,
			})
			if err != nil {
				t.Fatal(err)
			}
			s := res["t"][0]
			if s.Err != tc.err || s.OutputTokens != tc.tokens {
				t.Errorf("got err %q, %d tokens; want err %q, %d tokens", s.Err, s.OutputTokens, tc.err, tc.tokens)
			}
			if s.Bytes != len(tc.body) {
				t.Errorf("counted %d bytes, want %d", s.Bytes, len(tc.body))
			}
		})
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	m, url, _ := newMock(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, Options{
		Targets: []Target{{"slow", url}}, Model: "m", Concurrency: 2, Requests: 100, MaxTokens: 8,
		Headers: map[string]string{"x-mock-ttft-ms": "2000"},
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("Run took %s to notice cancellation", time.Since(start))
	}
	if len(res["slow"]) != 0 || m.Served() > 2 {
		t.Errorf("aborted requests recorded: %d samples, %d served", len(res["slow"]), m.Served())
	}
}

func TestTimeout(t *testing.T) {
	_, url, _ := newMock(t, nil)
	res, err := Run(context.Background(), Options{
		Targets: []Target{{"t", url}}, Model: "m", Concurrency: 1, Requests: 1, MaxTokens: 8,
		Timeout: 50 * time.Millisecond, Headers: map[string]string{"x-mock-ttft-ms": "2000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := res["t"][0]; !strings.Contains(s.Err, "timed out after 50ms") {
		t.Errorf("err = %q, want a timeout", s.Err)
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	got := percentiles(d)
	want := Percentiles{P50: 50 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond, N: 100}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	got = percentiles([]time.Duration{3, 1, 2})
	if want := (Percentiles{P50: 2, P95: 3, P99: 3, Max: 3, N: 3}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := percentiles(nil); got != (Percentiles{}) {
		t.Errorf("empty: got %+v", got)
	}
}

func TestValidate(t *testing.T) {
	good := Options{Targets: []Target{{"a", "http://x"}}, Model: "m", Concurrency: 1, Requests: 1, MaxTokens: 1}
	for name, mut := range map[string]func(*Options){
		"no targets":  func(o *Options) { o.Targets = nil },
		"no model":    func(o *Options) { o.Model = "" },
		"duplicate":   func(o *Options) { o.Targets = append(o.Targets, Target{"a", "http://y"}) },
		"concurrency": func(o *Options) { o.Concurrency = 0 },
		"requests":    func(o *Options) { o.Requests = 0 },
		"max tokens":  func(o *Options) { o.MaxTokens = 0 },
	} {
		o := good
		mut(&o)
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
