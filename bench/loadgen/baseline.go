package loadgen

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/bench/result"
)

// DefaultChecks are the metrics --baseline compares unless --tolerance
// names others.
var DefaultChecks = []string{
	"ttft_ms.p50", "ttft_ms.p99",
	"itl_ms.p50", "itl_ms.p99",
	"e2e_ms.p50", "e2e_ms.p99",
	"throughput.requests_per_s", "throughput.output_tokens_per_s",
}

// Tolerances are the allowed relative worsening per metric.
type Tolerances struct {
	Default   float64            // for DefaultChecks
	PerMetric map[string]float64 // overrides, and extra metrics to check
}

// ParseTolerance adds "10%" (or "0.1": the default) or "METRIC=5%" to t.
func (t *Tolerances) ParseTolerance(s string) error {
	metric, v, hasMetric := strings.Cut(s, "=")
	if !hasMetric {
		v = metric
	}
	f, err := parseFraction(v)
	if err != nil {
		return err
	}
	if !hasMetric {
		t.Default = f
		return nil
	}
	metric = strings.TrimSpace(metric)
	if _, ok := lookupMetric(result.Metrics{}, metric); !ok {
		return fmt.Errorf("unknown metric %q (want a numeric field of metrics, e.g. ttft_ms.p99)", metric)
	}
	if t.PerMetric == nil {
		t.PerMetric = map[string]float64{}
	}
	t.PerMetric[metric] = f
	return nil
}

func parseFraction(s string) (float64, error) {
	s = strings.TrimSpace(s)
	pct := strings.HasSuffix(s, "%")
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) {
		return 0, fmt.Errorf("want a tolerance like 10%% or 0.1, got %q", s)
	}
	if pct {
		f /= 100
	}
	return f, nil
}

// LoadReport reads a report written by --json.
func LoadReport(path string) (*result.Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r result.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.SchemaVersion != result.SchemaVersion {
		return nil, fmt.Errorf("%s: schema_version %d, this version reads %d", path, r.SchemaVersion, result.SchemaVersion)
	}
	return &r, nil
}

// CheckBaseline compares cur's targets with base's of the same name (or
// the only target of each) and reports every metric checked. A metric
// regressed when it got worse by more than its tolerance relative to the
// baseline: latencies and failures higher, rates lower.
func CheckBaseline(cur, base *result.Report, file string, tol Tolerances) (*result.BaselineCheck, error) {
	metrics := slices.Clone(DefaultChecks)
	for m := range tol.PerMetric {
		if !slices.Contains(metrics, m) {
			metrics = append(metrics, m)
		}
	}
	slices.Sort(metrics[len(DefaultChecks):])
	check := &result.BaselineCheck{File: file, Passed: true}
	for _, t := range cur.Targets {
		b, ok := baselineTarget(base, t.Name, len(cur.Targets))
		if !ok {
			continue
		}
		for _, m := range metrics {
			now, _ := lookupMetric(t.Metrics, m)
			was, _ := lookupMetric(b.Metrics, m)
			if was == 0 && strings.Contains(m, "_ms.") {
				continue // the baseline had no data for this latency
			}
			c := result.BaselineMetric{Target: t.Name, Metric: m, Baseline: was, Current: now, HigherIsBetter: higherIsBetter(m)}
			c.Tolerance = tol.Default
			if v, ok := tol.PerMetric[m]; ok {
				c.Tolerance = v
			}
			if c.HigherIsBetter {
				c.Passed = now >= was*(1-c.Tolerance)
			} else {
				c.Passed = now <= was*(1+c.Tolerance)
			}
			check.Passed = check.Passed && c.Passed
			check.Checks = append(check.Checks, c)
		}
	}
	if len(check.Checks) == 0 {
		return nil, fmt.Errorf("baseline %s: no target in common with this run", file)
	}
	return check, nil
}

func baselineTarget(base *result.Report, name string, curTargets int) (result.TargetResult, bool) {
	for _, t := range base.Targets {
		if t.Name == name {
			return t, true
		}
	}
	if curTargets == 1 && len(base.Targets) == 1 {
		return base.Targets[0], true
	}
	return result.TargetResult{}, false
}

// higherIsBetter is true for rates and success counts.
func higherIsBetter(metric string) bool {
	return strings.Contains(metric, "_per_s") || strings.HasPrefix(metric, "goodput.") ||
		metric == "requests.succeeded"
}

// lookupMetric reads a numeric field of m by its JSON path, e.g.
// "ttft_ms.p99" or "errors.by_class.http_5xx" (absent classes are 0).
func lookupMetric(m result.Metrics, path string) (float64, bool) {
	b, err := json.Marshal(m)
	if err != nil {
		return 0, false
	}
	if rest, ok := strings.CutPrefix(path, "errors.by_class."); ok && rest != "" {
		return gjson.GetBytes(b, "errors.by_class."+gjson.Escape(rest)).Num, true
	}
	v := gjson.GetBytes(b, path)
	return v.Num, v.Type == gjson.Number
}
