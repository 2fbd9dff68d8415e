package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// TestSmoke runs the whole harness with tiny durations, unpinned: every
// phase and every variant against real Envoy, infergate, the mock and
// Redis. It checks that the harness works and that correctness holds
// (no failed request, every body identical on every path), not speed.
func TestSmoke(t *testing.T) {
	opts := defaults()
	opts.Root = envoytest.RepoRoot
	opts.Envoy = envoytest.Binary(t)
	opts.GatewayCPUs, opts.ClientCPUs = "", ""
	opts.Work = t.TempDir()
	// Built once here, so the variant "previous" has a binary to compare
	// with (itself): every variant runs.
	opts.Infergate = filepath.Join(t.TempDir(), "infergate")
	// From the product's module (its go.sum), not this one's.
	if out, err := exec.Command("go", "build", "-C", envoytest.RepoRoot, "-o", opts.Infergate, "./cmd/infergate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	opts.Previous = opts.Infergate
	logs := &testutil.Buffer{}
	opts.Log = logs
	const warm, measure = 50 * time.Millisecond, 250 * time.Millisecond
	for i := range opts.Phases {
		p := &opts.Phases[i]
		p.Warmup, p.Measure = warm, measure
		p.Concurrency = min(p.Concurrency, 8)
		if p.Interval > 0 {
			p.Interval, p.Chunks = 2*time.Millisecond, 8
		}
	}
	for i := range opts.Variants {
		p := &opts.Variants[i]
		p.Warmup, p.Measure = warm, measure
		p.Concurrency = min(p.Concurrency, 4)
		if p.Interval > 0 {
			p.Interval, p.Chunks = 2*time.Millisecond, 8
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := run(ctx, opts)
	if err != nil {
		t.Fatalf("%v\nharness log:\n%s\nprocess logs in %s", err, logs.String(), opts.Work)
	}
	t.Logf("harness log:\n%s", logs.String())
	if len(rep.Phases) != len(opts.Phases) || len(rep.Variants) != len(variants()) {
		t.Fatalf("%d phases, %d variants", len(rep.Phases), len(rep.Variants))
	}
	for _, ph := range rep.Phases {
		if len(ph.Paths) != 3 || ph.BodiesCompared == 0 {
			t.Errorf("%s: %d paths, %d bodies compared", ph.Key, len(ph.Paths), ph.BodiesCompared)
		}
		for _, p := range ph.Paths {
			m := p.Metrics
			if m.Requests.Succeeded == 0 || m.Requests.Failed != 0 {
				t.Errorf("%s %s: %+v", ph.Key, p.Name, m.Requests)
			}
			if ph.Stream && (p.Stream == nil || p.Stream.Events == 0 || m.OutputTokens == 0) {
				t.Errorf("%s %s: no streamed events measured", ph.Key, p.Name)
			}
		}
		if ph.Stream {
			for _, u := range ph.CPU {
				if u.Tokens == 0 || u.CPUSeconds < 0 {
					t.Errorf("%s: CPU of %s: %+v", ph.Key, u.Name, u)
				}
			}
		}
	}
	for _, v := range rep.Variants {
		want := len(opts.Variants)
		if i := slices.IndexFunc(variants(), func(w variant) bool { return w.Key == v.Key }); variants()[i].phases != nil {
			want = len(variants()[i].phases(opts))
		}
		if len(v.Phases) != want {
			t.Errorf("variant %s: %d phases, want %d", v.Key, len(v.Phases), want)
		}
	}
	if len(rep.PeakRSS) != 3 || rep.PeakRSS[0].Bytes == 0 {
		t.Errorf("peak RSS %+v", rep.PeakRSS)
	}

	// The report renders, and replaces only its own section of the doc.
	doc := filepath.Join(t.TempDir(), "performance.md")
	os.WriteFile(doc, []byte("# Performance\n\nhand-written\n\n"+beginMarker+"\nold\n"+endMarker+"\n\nmore by hand\n"), 0o644)
	if err := updateDoc(doc, rep); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(doc)
	for _, want := range []string{"hand-written", "more by hand", "Added latency", "infergate adds", "The price of each choice", "Targets"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("doc lacks %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "\nold\n") {
		t.Error("the old section was kept")
	}
	if err := writeJSON(filepath.Join(t.TempDir(), "r.json"), rep); err != nil {
		t.Fatal(err)
	}
}

// The overhead configs are the drop-in as users get it: envoy/overhead.yaml
// carries envoy/snippet.yaml's filters, local replies and response headers
// unchanged, and plain Envoy differs from it only by not having them.
func TestOverheadConfigs(t *testing.T) {
	vars := map[string]string{"LISTEN_PORT": "1", "ADMIN_PORT": "2", "EXTPROC_PORT": "3", "POOL_A_PORT": "4"}
	load := func(rel string) map[string]any {
		s, err := render(filepath.Join(envoytest.RepoRoot, rel), vars)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	var snippet map[string]any
	b, _ := os.ReadFile(filepath.Join(envoytest.RepoRoot, "envoy/snippet.yaml"))
	if err := yaml.Unmarshal(b, &snippet); err != nil {
		t.Fatal(err)
	}
	gw, pl := load("envoy/overhead.yaml"), load("envoy/overhead-plain.yaml")
	hcm := func(doc map[string]any) map[string]any {
		v, err := dig(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
		if err != nil {
			t.Fatal(err)
		}
		return v.(map[string]any)
	}
	g, p := hcm(gw), hcm(pl)
	filters := g["http_filters"].([]any)
	infergate := len(snippet["http_filters"].([]any)) // the gate, the usage filter, the meter
	if !reflect.DeepEqual(filters[:infergate], snippet["http_filters"]) {
		t.Error("envoy/overhead.yaml's infergate filters differ from envoy/snippet.yaml's")
	}
	if !reflect.DeepEqual(g["local_reply_config"], snippet["local_reply_config"]) {
		t.Error("envoy/overhead.yaml's local_reply_config differs from envoy/snippet.yaml's")
	}
	vh, _ := dig(g, "route_config", "virtual_hosts", 0, "response_headers_to_add")
	if !reflect.DeepEqual(vh, snippet["response_headers_to_add"]) {
		t.Error("envoy/overhead.yaml's response_headers_to_add differ from envoy/snippet.yaml's")
	}
	if !reflect.DeepEqual(filters[infergate:], p["http_filters"]) {
		t.Error("the router differs")
	}
	for k, v := range p {
		if k != "http_filters" && k != "route_config" && !reflect.DeepEqual(g[k], v) {
			t.Errorf("connection manager setting %s differs between the two", k)
		}
	}
	for k := range g {
		if _, ok := p[k]; !ok && k != "local_reply_config" {
			t.Errorf("envoy/overhead.yaml has %s, plain does not", k)
		}
	}
	for _, key := range []string{"per_connection_buffer_limit_bytes", "address"} {
		a, _ := dig(gw, "static_resources", "listeners", 0, key)
		b, _ := dig(pl, "static_resources", "listeners", 0, key)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("listener %s differs", key)
		}
	}
	pa, _ := dig(gw, "static_resources", "clusters", clusterIndex(gw, "pool"))
	pb, _ := dig(pl, "static_resources", "clusters", clusterIndex(pl, "pool"))
	if pa == nil || !reflect.DeepEqual(pa, pb) {
		t.Error("the upstream cluster differs")
	}
	ig, _ := dig(gw, "static_resources", "clusters", clusterIndex(gw, "infergate"))
	sc, _ := dig(snippet, "clusters", 0)
	for _, k := range []string{"connect_timeout", "typed_extension_protocol_options"} {
		if !reflect.DeepEqual(ig.(map[string]any)[k], sc.(map[string]any)[k]) {
			t.Errorf("infergate cluster %s differs from envoy/snippet.yaml's", k)
		}
	}
}
