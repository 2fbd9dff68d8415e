package command

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/bench/internal/pacer"
	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/testutil/pipenet"
)

// runBench runs `infergate-bench bench args...` in-process.
func runBench(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := Bench(context.Background(), args, &stdout, &stderr, "test")
	return stdout.String(), stderr.String(), err
}

// virtualBench runs f in a synctest bubble whose mocks (n.mock) and bench
// runs (n.run) share an in-memory network: the timings bench measures are
// then exact, however busy the machine.
func virtualBench(t *testing.T, f func(t *testing.T, n *benchNet)) {
	t.Helper()
	was := pacer.SetEnabled(false)
	defer pacer.SetEnabled(was)
	synctest.Test(t, func(t *testing.T) { f(t, &benchNet{}) })
}

type benchNet struct{ pipenet.Net }

// mock is benchMock on n.
func (n *benchNet) mock(t *testing.T, ttft time.Duration) (*mock.Server, string) {
	t.Helper()
	m := mock.New(mock.Config{TTFT: ttft, ITL: time.Millisecond}, slog.New(slog.DiscardHandler))
	srv := &http.Server{Handler: m.Handler()}
	l := n.Listen()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return m, "http://" + l.Addr().String()
}

// run is runBench with the targets on n.
func (n *benchNet) run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := bench(context.Background(), args, &stdout, &stderr, "test", n.Dial)
	return stdout.String(), stderr.String(), err
}

func benchMock(t *testing.T, ttft time.Duration) (*mock.Server, string) {
	t.Helper()
	m := mock.New(mock.Config{TTFT: ttft, ITL: time.Millisecond}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return m, srv.URL
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// get walks a decoded JSON value by keys (and indices, as ints).
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

// TestBenchBasicCall is the documented basic call, its table and its JSON.
func TestBenchBasicCall(t *testing.T) {
	m, url := benchMock(t, 5*time.Millisecond)
	path := filepath.Join(t.TempDir(), "bench.json")
	stdout, stderr, err := runBench(t, "--target", url, "--concurrency", "2", "--requests", "6",
		"--output-tokens", "8", "--json", path)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if m.Served() != 6 {
		t.Errorf("mock served %d, want 6", m.Served())
	}
	for _, want := range []string{"TTFT p50", "ITL p99", "TPOT p50", "E2E p99", "req/s", "output tok/s", "errors", "0/6"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "6/6 requests, 0 failed") {
		t.Errorf("no final progress line on stderr: %q", stderr)
	}

	doc := readJSON(t, path)
	for _, k := range []string{"schema_version", "tool", "version", "started_at", "duration_s", "parameters", "metrics", "targets"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("JSON lacks top-level %q", k)
		}
	}
	for _, metric := range []string{"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"} {
		for _, stat := range []string{"p50", "p90", "p95", "p99", "p999", "mean", "max"} {
			if v, ok := get(doc, "metrics", metric, stat).(float64); !ok || v <= 0 {
				t.Errorf("metrics.%s.%s = %v", metric, stat, get(doc, "metrics", metric, stat))
			}
		}
	}
	for _, p := range [][]any{
		{"metrics", "throughput", "requests_per_s"}, {"metrics", "throughput", "output_tokens_per_s"},
		{"metrics", "goodput", "fraction"}, {"metrics", "errors", "total"}, {"parameters", "concurrency"},
		{"parameters", "output_tokens", "max"}, {"targets", 0, "timeline", 0, "t_s"}, {"targets", 0, "cdf", "ttft_ms"},
	} {
		if get(doc, p...) == nil {
			t.Errorf("JSON lacks %v", p)
		}
	}
	if get(doc, "parameters", "output_tokens", "max") != 8.0 || get(doc, "metrics", "requests", "sent") != 6.0 ||
		get(doc, "metrics", "token_source") != "usage" || get(doc, "parameters", "mode") != "closed" {
		t.Errorf("parameters %v, requests %v", get(doc, "parameters"), get(doc, "metrics", "requests"))
	}
	if cdf, _ := get(doc, "targets", 0, "cdf", "itl_ms").([]any); len(cdf) == 0 || len(cdf) > 300 {
		t.Errorf("ITL CDF has %d points", len(cdf))
	}

	// The report round-trips through result.Report unchanged.
	var rep result.Report
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(&rep)
	var doc2 map[string]any
	if err := json.Unmarshal(again, &doc2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(doc, doc2) {
		t.Errorf("the JSON does not round-trip through result.Report:\n%s\n%s", b, again)
	}

	// --max-tokens is an alias.
	if _, stderr, err := runBench(t, "--target", url, "--requests", "2", "--max-tokens", "3", "--json", path); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if got := get(readJSON(t, path), "metrics", "output_tokens"); got != 6.0 {
		t.Errorf("--max-tokens 3: %v output tokens over 2 requests", got)
	}
}

// TestBenchBaseline: a run is compared with a stored report; a regression
// is named and fails the command.
func TestBenchBaseline(t *testing.T) {
	virtualBench(t, func(t *testing.T, n *benchNet) {
		_, url := n.mock(t, 5*time.Millisecond)
		dir := t.TempDir()
		base := filepath.Join(dir, "base.json")
		args := []string{"--target", "direct=" + url, "--concurrency", "1", "--requests", "4", "--output-tokens", "4"}
		if _, stderr, err := n.run(t, append(args, "--json", base)...); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		stdout, stderr, err := n.run(t, append(args, "--baseline", base, "--tolerance", "1000%")...)
		if err != nil || !strings.Contains(stdout, "baseline "+base+": passed") {
			t.Fatalf("same target, huge tolerance: %v\n%s%s", err, stdout, stderr)
		}

		// Make the baseline's TTFT p99 implausibly good.
		doc := readJSON(t, base)
		get(doc, "targets", 0, "metrics", "ttft_ms").(map[string]any)["p99"] = 0.001
		b, _ := json.Marshal(doc)
		os.WriteFile(base, b, 0o644)
		stdout, _, err = n.run(t, append(args, "--baseline", base, "--tolerance", "1000%", "--tolerance", "ttft_ms.p99=5%")...)
		if !errors.Is(err, errRegression) || !strings.Contains(err.Error(), "direct ttft_ms.p99") {
			t.Fatalf("err = %v, want a regression naming ttft_ms.p99", err)
		}
		if !strings.Contains(stdout, "REGRESSION") || !strings.Contains(stdout, "ttft_ms.p99") || !strings.Contains(stdout, "REGRESSED") {
			t.Errorf("stdout does not say which metric regressed:\n%s", stdout)
		}
	})
}

func TestBenchCompareSweepAndHTML(t *testing.T) {
	virtualBench(t, func(t *testing.T, n *benchNet) {
		// In virtual time the paired difference is exactly the mocks' 20 ms.
		_, urlA := n.mock(t, 5*time.Millisecond)
		_, urlB := n.mock(t, 25*time.Millisecond)
		dir := t.TempDir()
		path, html := filepath.Join(dir, "c.json"), filepath.Join(dir, "c.html")
		stdout, stderr, err := n.run(t, "--target", "a="+urlA, "--target", "b="+urlB, "--compare-targets", "b,a",
			"--requests", "8", "--output-tokens", "4", "--json", path, "--html", html)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if !strings.Contains(stdout, "paired a − b over 8 requests") || !strings.Contains(stdout, "ΔTTFT") {
			t.Errorf("no paired comparison:\n%s", stdout)
		}
		doc := readJSON(t, path)
		if get(doc, "compare", "a") != "b" || get(doc, "compare", "pairs") != 8.0 {
			t.Errorf("compare %v", get(doc, "compare"))
		}
		if d, _ := get(doc, "compare", "delta_ttft_ms", "p50").(float64); d != -20 {
			t.Errorf("a − b median ΔTTFT %.2f ms, want −20", d)
		}
		if fi, err := os.Stat(html); err != nil || fi.Size() == 0 {
			t.Errorf("--html wrote nothing: %v", err)
		}

		stdout, stderr, err = n.run(t, "--target", urlA, "--sweep", "concurrency=1,2", "--requests", "4",
			"--output-tokens", "2", "--slo-ttft", "2s", "--json", path)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if !strings.Contains(stdout, "knee: concurrency 2") || !strings.Contains(stderr, "bench [concurrency 2, 2/2]") {
			t.Errorf("sweep output:\n%s\n%s", stdout, stderr)
		}
		if get(readJSON(t, path), "sweep", "knee") != 1.0 {
			t.Errorf("sweep %v", get(readJSON(t, path), "sweep"))
		}
	})
}

func TestBenchFailures(t *testing.T) {
	m, url := benchMock(t, time.Millisecond)
	m.SetFaults(mock.Faults{ErrorRate: 1, ErrorStatus: 503})
	stdout, _, err := runBench(t, "--target", "down="+url, "--requests", "3")
	if err == nil || !strings.Contains(err.Error(), `every request to "down" failed`) || !strings.Contains(err.Error(), "503") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(stdout, "3 http_5xx") {
		t.Errorf("errors not shown by class:\n%s", stdout)
	}

	for _, args := range [][]string{
		{},
		{"--target", url, "--tolerance", "5%"},
		{"--target", url, "--target", "b=" + url, "--sweep", "concurrency=1,2"},
		{"--target", url, "--warmup", "soon"},
		{"--target", url, "--compare-targets", "a,b,c"},
		{"--target", url, "--rate", "-1"},
		{"--target", url, "--input-tokens", "0"},
		{"--target", url, "--model", "a@0"},
		{"--target", url, "--api-key", "k@x"},
		{"--target", url, "--slo-percentile", "101"},
		{"--target", url, "--rate", "5", "--arrival", "lumpy"},
		{"--target", url, "--rate", "5", "--ramp-users", "2"},
		{"--target", url, "--api", "grpc"},
	} {
		if _, _, err := runBench(t, args...); !errors.Is(err, flagset.ErrUsage) {
			t.Errorf("%v: err %v, want a usage error", args, err)
		}
	}
}

// TestBenchAPIs runs the command against the mock for each --api: the
// table has the API's metrics, and the mock saw that API's requests.
func TestBenchAPIs(t *testing.T) {
	for _, api := range []string{"completions", "responses", "messages", "embeddings"} {
		t.Run(api, func(t *testing.T) {
			m, url := benchMock(t, time.Millisecond)
			stdout, stderr, err := runBench(t, "--target", url, "--api", api, "--requests", "4", "--output-tokens", "5")
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if m.Served() != 4 || !strings.Contains(stdout, "0/4") {
				t.Errorf("mock served %d:\n%s", m.Served(), stdout)
			}
			// Embeddings have no TTFT ("-"); the others a value and tokens.
			noTTFT := regexp.MustCompile(`TTFT p50 +-\n`).MatchString(stdout)
			if api == "embeddings" != noTTFT || api == "embeddings" != strings.Contains(stdout, "input tok/s") ||
				api != "embeddings" && m.Usage().CompletionTokens != 20 {
				t.Errorf("%d tokens billed:\n%s", m.Usage().CompletionTokens, stdout)
			}
		})
	}
}

func TestParseAPIKey(t *testing.T) {
	for in, want := range map[string][3]string{
		"sk-1":          {"key1", "sk-1", "1"},
		"acme=sk-1@3":   {"acme", "sk-1", "3"},
		"acme=abc==":    {"acme", "abc==", "1"},
		"tenant=k@0.25": {"tenant", "k", "0.25"},
	} {
		k, err := parseAPIKey(in, 1)
		if err != nil || k.Name != want[0] || k.Key != want[1] {
			t.Errorf("%q: %+v, %v", in, k, err)
		}
	}
}
