package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// TestPeers runs both peer lanes briefly, unpinned, beside the three
// paths: c=1 and streams at c=4. The harness installs the peers itself
// (scripts/install-peers.sh) when they are not there yet, so a first run
// also downloads them. Every peer request must succeed with direct's
// content, Portkey's bodies byte for byte.
func TestPeers(t *testing.T) {
	opts := defaults()
	opts.Root = envoytest.RepoRoot
	opts.Envoy = envoytest.Binary(t)
	opts.GatewayCPUs, opts.ClientCPUs = "", ""
	opts.Work = t.TempDir()
	opts.Peers = allPeers
	opts.Only = []string{"c1", "stream-c64"}
	logs := &testutil.Buffer{}
	opts.Log = logs
	for i := range opts.Phases {
		p := &opts.Phases[i]
		p.Warmup, p.Measure = 100*time.Millisecond, 500*time.Millisecond
		p.Concurrency = min(p.Concurrency, 4)
		if p.Interval > 0 {
			p.Interval, p.Chunks = 2*time.Millisecond, 8
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := run(ctx, opts)
	if err != nil {
		t.Fatalf("%v\nharness log:\n%s\nprocess logs in %s", err, logs.String(), opts.Work)
	}
	t.Logf("harness log:\n%s", logs.String())
	if len(rep.Peers) != len(allPeers) {
		t.Fatalf("%d peers reported, want %d", len(rep.Peers), len(allPeers))
	}
	for _, info := range rep.Peers {
		if info.Error != "" || info.Version == "" {
			t.Fatalf("peer %s (version %q) did not run: %s", info.Key, info.Version, info.Error)
		}
	}
	if len(rep.Phases) != 2 {
		t.Fatalf("%d phases, want 2", len(rep.Phases))
	}
	for _, ph := range rep.Phases {
		for _, key := range allPeers {
			p := ph.path(key)
			if p == nil || p.Peer == nil {
				t.Fatalf("%s: no %s lane", ph.Key, key)
			}
			c := p.Peer
			if c.Requests == 0 || c.Failed != 0 || c.Compared == 0 || c.ContentDiffered != 0 || c.Changed != 0 || len(c.Errors) > 0 {
				t.Errorf("%s %s: %+v", ph.Key, key, *c)
			}
			if key == peerPortkey && c.ByteIdentical != c.Compared {
				t.Errorf("%s %s: %d of %d bodies byte-identical", ph.Key, key, c.ByteIdentical, c.Compared)
			}
			if ph.Stream && (p.Stream == nil || p.Stream.Events == 0) {
				t.Errorf("%s %s: no streamed events measured", ph.Key, key)
			}
			if cpuPer1k(ph, key) <= 0 && ph.Stream {
				t.Errorf("%s %s: no CPU measured", ph.Key, key)
			}
		}
		if c := ph.compare(direct, peerLiteLLM); ph.Key == "c1" && (c == nil || c.Pairs == 0) {
			t.Errorf("c1: no paired requests between direct and LiteLLM")
		}
	}
	for _, info := range rep.Peers {
		measured := 0
		for _, q := range info.Ratios {
			if q.Missing == "" {
				measured++
			}
		}
		if measured < 4 { // c=1 latency (2) and CPU per 1k tokens (2); rps-c64 did not run
			t.Errorf("peer %s: %d ratios measured: %+v", info.Key, measured, info.Ratios)
		}
	}
	md := markdown(rep)
	for _, want := range []string{"**Peers**", "LiteLLM proxy", "Portkey gateway", "infergate over each peer", "**auth:**"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if err := writeJSON(t.TempDir()+"/r.json", rep); err != nil {
		t.Fatal(err)
	}
}
