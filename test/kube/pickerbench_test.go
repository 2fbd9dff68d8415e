package kube

// What infergate's gate adds in front of the Inference Extension's Endpoint
// Picker, and without it: a measurement, not a test (`make bench-picker`
// writes it into docs/performance.md). A benchmark rather than a test
// because timing is the machine's and asserts nothing: `go test` (make
// kube-test) compiles it but runs it only when asked with -bench, and it
// lives here because the picker discovers its pods through this module's
// kube-apiserver.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/bench/loadgen"
	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The four paths, each its own Envoy on the same pods: the shipped
// envoy/inference-pool.yaml and it with filters taken out. Without the
// picker the route's cluster is a plain one to the first pod.
var pickerPaths = []struct {
	name        string
	drop        []string // http_filters removed from the shipped chain
	plainRouted bool     // the inference-pool cluster is a static one to pod 0, not ORIGINAL_DST
}{
	{"plain Envoy", []string{"infergate.gate", "infergate.meter", "inference-pool.epp"}, true},
	{"Envoy + infergate", []string{"inference-pool.epp"}, true},
	{"Envoy + picker", []string{"infergate.gate", "infergate.meter"}, false},
	{"Envoy + infergate + picker", nil, false},
}

// The paired differences reported, b − a, by path index.
var pickerDeltas = []struct {
	what string
	a, b int
}{
	{"the gate without the picker (Envoy + infergate − plain Envoy)", 0, 1},
	{"the gate with the picker chained (Envoy + infergate + picker − Envoy + picker)", 2, 3},
	{"the picker itself, for reference (Envoy + picker − plain Envoy)", 0, 2},
}

type pickerPhase struct {
	title         string
	stream        bool
	concurrency   int
	warmup, items int // workload items; each goes to every path
}

// Every item goes to the four paths one after another (loadgen's
// Sequential), in an order that rotates item by item: the paths never
// compete with each other for the two cores, and each pair of requests
// met the same moment of a busy machine. At c=4 four users do so at once.
var pickerPhases = []pickerPhase{
	{"non-streaming, c=1", false, 1, 20, 200},
	{"streaming, c=1", true, 1, 20, 200},
	{"non-streaming, c=4", false, 4, 40, 400},
	{"streaming, c=4", true, 4, 40, 400},
}

// The pods answer at once (TTFT 0) and stream 16 tokens 2 ms apart: the
// gateway's time is then most of what is measured.
const pickerTokens = 16

func BenchmarkGateWithEndpointPicker(b *testing.B) {
	eppBin := endpointPickerBin(b)
	c := startCluster(b)
	c.createNamespace(b, poolNS)
	applyYAML(b, c, "{apiVersion: v1, kind: ServiceAccount, metadata: {name: default, namespace: "+poolNS+"}}")
	pods := startModelServers(b, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"})
	for i, p := range pods {
		c.createReadyPod(b, fmt.Sprintf("vllm-%d", i), p.ip)
	}
	applyYAML(b, c, fmt.Sprintf(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: %s, namespace: %s}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: %d}]
  endpointPickerRef: {name: %s-epp, port: {number: 9002}}
`, poolName, poolNS, pods[0].port, poolName))
	eppPort := startEndpointPicker(b, c, eppBin)
	gate := startGate(b, "")
	targets := make([]loadgen.Target, len(pickerPaths))
	for i, p := range pickerPaths {
		conf := pickerEnvoyConfig(b, gate.extproc, eppPort, pods[0].addr(), p.drop, p.plainRouted)
		targets[i] = loadgen.Target{Name: p.name, URL: envoytest.Start(b, conf).URL}
	}
	testutil.Eventually(b, 60*time.Second, func() bool {
		return !slices.ContainsFunc(pods, func(p *modelServer) bool { return p.scrapes.Load() < 2 })
	}, "the endpoint picker to scrape all three pods")

	load := [2]string{loadAverage()}
	start := time.Now().UTC()
	var rows []pickerRow
	for _, ph := range pickerPhases {
		b.Logf("%s: %d items (+%d warm-up) to each of %d paths", ph.title, ph.items, ph.warmup, len(targets))
		rec, err := loadgen.Run(b.Context(), pickerLoad(ph, targets))
		if err != nil {
			b.Fatalf("%s: %v", ph.title, err)
		}
		failed, err := pickerCheck(rec)
		if err != nil {
			b.Fatalf("%s: %v", ph.title, err)
		}
		row := pickerRow{phase: ph, failed: failed}
		for i := range targets {
			row.paths = append(row.paths, rec.Result(i, result.SLO{}).Metrics)
		}
		for _, d := range pickerDeltas {
			row.deltas = append(row.deltas, rec.Compare(d.a, d.b))
		}
		rows = append(rows, row)
	}
	load[1] = loadAverage()
	md := pickerMarkdown(start, time.Since(start), load, rows)
	b.Log("\n" + md)
	if doc := os.Getenv("PICKER_DOC"); doc != "" {
		if err := replaceSection(doc, md); err != nil {
			b.Fatal(err)
		}
	}
	// The headline for benchstat: the gate's median added TTFT at c=1,
	// streaming, without and with the picker.
	for _, r := range rows {
		if r.phase.stream && r.phase.concurrency == 1 {
			b.ReportMetric(r.deltas[0].DeltaTTFTMs.P50, "gate-ttft-ms")
			b.ReportMetric(r.deltas[1].DeltaTTFTMs.P50, "gate-with-picker-ttft-ms")
		}
	}
}

func pickerLoad(ph pickerPhase, targets []loadgen.Target) loadgen.Config {
	hdr := map[string]string{"x-mock-ttft-ms": "0", "x-mock-tokens": strconv.Itoa(pickerTokens)}
	if ph.stream {
		hdr["x-mock-itl-ms"] = "2"
	}
	return loadgen.Config{
		Targets:     targets,
		Concurrency: ph.concurrency,
		Sequential:  true,
		Warmup:      loadgen.Bound{Requests: ph.warmup},
		Measure:     loadgen.Bound{Requests: ph.items},
		Workload: &loadgen.Workload{
			Models:  []result.Weight{{Value: poolModel, Weight: 1}},
			Keys:    []loadgen.Key{{Name: "acme", Key: premiumKey, Weight: 1}},
			Prompt:  "tell me a short story",
			Input:   result.Range{Min: 1, Max: 1, Dist: "uniform"},
			Output:  result.Range{Min: pickerTokens, Max: pickerTokens, Dist: "uniform"},
			Stream:  ph.stream,
			NoHints: true,
			Headers: hdr,
		},
		Seed:    1,
		Timeout: 30 * time.Second,
	}
}

// pickerCheck counts each path's failed requests and fails the run when a
// path failed more than 1% of them, or answered with other than the pods'
// tokens: numbers from a broken path mean nothing. A rare failure on a
// starved machine (the gate's 1 s message timeout) is reported and left out
// of the pairs.
func pickerCheck(rec *loadgen.Recording) ([]int, error) {
	failed := make([]int, len(rec.Samples))
	var errs []error
	for i, samples := range rec.Samples {
		var last string
		for k := range samples {
			switch s := &samples[k]; {
			case !s.OK():
				failed[i]++
				last = fmt.Sprintf("item %d (%s): %s", s.Item, s.Phase, s.Err)
			case s.OutputTokens != pickerTokens:
				errs = append(errs, fmt.Errorf("%s item %d: %d tokens, want the pods' %d", rec.Targets[i].Name, s.Item, s.OutputTokens, pickerTokens))
			}
		}
		if failed[i]*100 > len(samples) {
			errs = append(errs, fmt.Errorf("%s failed %d of %d requests, last %s", rec.Targets[i].Name, failed[i], len(samples), last))
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	return failed, errors.Join(errs...)
}

// pickerEnvoyConfig is envoy/inference-pool.yaml without the filters in
// drop and, if plainRouted, with its pool cluster a static one to pod.
func pickerEnvoyConfig(t testing.TB, extproc, epp int, pod string, drop []string, plainRouted bool) string {
	t.Helper()
	var doc map[string]any
	rendered := envoytest.Render(t, "envoy/inference-pool.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": strconv.Itoa(extproc), "EPP_PORT": strconv.Itoa(epp),
	})
	if err := yaml.Unmarshal([]byte(rendered), &doc); err != nil {
		t.Fatal(err)
	}
	sr := doc["static_resources"].(map[string]any)
	hcm := sr["listeners"].([]any)[0].(map[string]any)["filter_chains"].([]any)[0].(map[string]any)["filters"].([]any)[0].(map[string]any)["typed_config"].(map[string]any)
	hcm["http_filters"] = slices.DeleteFunc(hcm["http_filters"].([]any), func(f any) bool {
		return slices.Contains(drop, f.(map[string]any)["name"].(string))
	})
	if plainRouted {
		host, port, _ := strings.Cut(pod, ":")
		portN, _ := strconv.Atoi(port)
		clusters := sr["clusters"].([]any)
		for i, cl := range clusters {
			if cl.(map[string]any)["name"] == "inference-pool" {
				clusters[i] = map[string]any{
					"name": "inference-pool", "type": "STATIC", "connect_timeout": "5s",
					"load_assignment": map[string]any{"cluster_name": "inference-pool", "endpoints": []any{map[string]any{"lb_endpoints": []any{
						map[string]any{"endpoint": map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": host, "port_value": portN}}}},
					}}}},
				}
			}
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

type pickerRow struct {
	phase  pickerPhase
	failed []int // per path, warm-up included
	paths  []result.Metrics
	deltas []result.Compare
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}

func pickerMarkdown(start time.Time, took time.Duration, load [2]string, rows []pickerRow) string {
	var s strings.Builder
	fmt.Fprintf(&s, "Measured %s (%s) on a %d-CPU machine shared with other work: load average (1 / 5 / 15 min) %s before, %s after. "+
		"Reproduce: `make bench-picker`.\n\n", start.Format("2006-01-02 15:04 MST"), took.Round(time.Second), runtime.NumCPU(), load[0], load[1])
	s.WriteString("Per path (ms; failed: requests that did not complete, warm-up included, left out of the pairs):\n\n| load | path | TTFT p50 | TTFT p95 | total p50 | total p95 | failed |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		for i, m := range r.paths {
			fmt.Fprintf(&s, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %d |\n", r.phase.title, pickerPaths[i].name, m.TTFTMs.P50, m.TTFTMs.P95, m.E2EMs.P50, m.E2EMs.P95, r.failed[i])
		}
	}
	s.WriteString("\nAdded latency, paired by request (b − a of the same item, back to back; ms, median [95% CI] and mean [95% CI]):\n\n" +
		"| load | what | pairs | TTFT Δ median | TTFT Δ mean | total Δ median | total Δ mean |\n|---|---|---|---|---|---|---|\n")
	ci := func(v float64, c [2]float64) string { return fmt.Sprintf("%+.2f [%+.2f, %+.2f]", v, c[0], c[1]) }
	for _, r := range rows {
		for i, d := range r.deltas {
			fmt.Fprintf(&s, "| %s | %s | %d | %s | %s | %s | %s |\n", r.phase.title, pickerDeltas[i].what, d.Pairs,
				ci(d.DeltaTTFTMs.P50, d.DeltaTTFTMs.P50CI95), ci(d.DeltaTTFTMs.Mean, d.DeltaTTFTMs.MeanCI95),
				ci(d.DeltaE2EMs.P50, d.DeltaE2EMs.P50CI95), ci(d.DeltaE2EMs.Mean, d.DeltaE2EMs.MeanCI95))
		}
	}
	return s.String()
}

// The generated part of docs/performance.md's picker section; the rest of
// the file is written by hand.
const (
	pickerBegin = "<!-- picker:begin: generated by make bench-picker; edit outside these markers -->"
	pickerEnd   = "<!-- picker:end -->"
)

// replaceSection writes md between the picker markers of the file at path,
// which must have them.
func replaceSection(path, md string) error {
	old, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return err
	}
	before, rest, found := strings.Cut(string(old), pickerBegin)
	_, after, foundEnd := strings.Cut(rest, pickerEnd)
	if !found || !foundEnd {
		return fmt.Errorf("%s has no %s … %s section", path, pickerBegin, pickerEnd)
	}
	return os.WriteFile(path, []byte(before+pickerBegin+"\n"+md+pickerEnd+after), 0o644)
}
