package loadgen

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/bench/result"
)

func reportWith(targets ...result.TargetResult) *result.Report {
	r := &result.Report{SchemaVersion: result.SchemaVersion, Targets: targets}
	r.Metrics = targets[0].Metrics
	return r
}

func target(name string, ttftP99, rps float64) result.TargetResult {
	m := result.Metrics{}
	m.TTFTMs = result.Dist{N: 10, P50: ttftP99 / 2, P99: ttftP99}
	m.ITLMs = result.Dist{N: 10, P50: 5, P99: 9}
	m.E2EMs = result.Dist{N: 10, P50: 100, P99: 200}
	m.Throughput.RequestsPerS, m.Throughput.OutputTokensPerS = rps, 10*rps
	return result.TargetResult{Name: name, Metrics: m}
}

func TestCheckBaseline(t *testing.T) {
	base := reportWith(target("direct", 100, 50), target("gateway", 110, 50))
	tol := Tolerances{Default: 0.10}

	check, err := CheckBaseline(reportWith(target("direct", 105, 48), target("gateway", 119, 46)), base, "base.json", tol)
	if err != nil || !check.Passed || len(check.Checks) != 2*len(DefaultChecks) {
		t.Fatalf("within 10%%: %+v, %v", check, err)
	}

	check, _ = CheckBaseline(reportWith(target("direct", 100, 50), target("gateway", 125, 44)), base, "base.json", tol)
	var failed []string
	for _, c := range check.Checks {
		if !c.Passed {
			failed = append(failed, c.Target+" "+c.Metric)
		}
	}
	if check.Passed || strings.Join(failed, ",") != "gateway ttft_ms.p50,gateway ttft_ms.p99,gateway throughput.requests_per_s,gateway throughput.output_tokens_per_s" {
		t.Errorf("regressions %v", failed)
	}

	// A per-metric tolerance overrides the default and can add a metric.
	tol = Tolerances{Default: 0.5}
	if err := tol.ParseTolerance("ttft_ms.p99=5%"); err != nil {
		t.Fatal(err)
	}
	if err := tol.ParseTolerance("requests.failed=0"); err != nil {
		t.Fatal(err)
	}
	cur := reportWith(target("direct", 106, 50), target("gateway", 110, 50))
	cur.Targets[0].Metrics.Requests.Failed = 1
	check, _ = CheckBaseline(cur, base, "base.json", tol)
	failed = nil
	for _, c := range check.Checks {
		if !c.Passed {
			failed = append(failed, c.Target+" "+c.Metric)
		}
	}
	if check.Passed || strings.Join(failed, ",") != "direct ttft_ms.p99,direct requests.failed" {
		t.Errorf("regressions %v", failed)
	}

	// One target on each side pairs whatever the names.
	if check, err := CheckBaseline(reportWith(target("new", 100, 50)), reportWith(target("old", 100, 50)), "b", Tolerances{}); err != nil || !check.Passed {
		t.Errorf("single targets: %+v, %v", check, err)
	}
	if _, err := CheckBaseline(reportWith(target("x", 1, 1), target("y", 1, 1)), base, "b", tol); err == nil {
		t.Error("no target in common: no error")
	}
}

func TestParseTolerance(t *testing.T) {
	var tol Tolerances
	for in, want := range map[string]float64{"10%": 0.1, "0.25": 0.25, "ttft_ms.p999=2.5%": 0.025, "errors.by_class.http_5xx=0": 0} {
		if err := tol.ParseTolerance(in); err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		got := tol.Default
		if k, _, ok := strings.Cut(in, "="); ok {
			got = tol.PerMetric[k]
		}
		if got != want {
			t.Errorf("%q: %g, want %g", in, got, want)
		}
	}
	for _, bad := range []string{"", "ten", "-5%", "nope.p99=5%", "ttft_ms=5%"} {
		if err := tol.ParseTolerance(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestLoadReportRoundTrip(t *testing.T) {
	r := reportWith(target("t", 100, 50))
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(got)
	if !bytes.Equal(b, again) {
		t.Errorf("round trip changed the report:\n%s\n%s", b, again)
	}
	os.WriteFile(path, []byte(`{"schema_version": 99}`), 0o644)
	if _, err := LoadReport(path); err == nil {
		t.Error("a future schema version was accepted")
	}
}
