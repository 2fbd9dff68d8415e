package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// A pool whose model servers report a queue longer than the SLA allows
// loses traffic, whatever its latency looks like so far: the controller
// scrapes the pool's vLLM-style /metrics (the mock's capacity model keeps a
// real batch and queue) and judges vllm:num_requests_waiting.
func TestSLAQueueDepthFromPoolMetrics(t *testing.T) {
	s := startStackFor(t, "envoy/sla.yaml", func(s *stack) string {
		return `
admin: {debug: {enabled: true}}
virtualModels:
- name: llama
  pools:
  - {cluster: pool-a, priority: 0, metrics: ["http://` + s.PoolA.Addr + `/metrics"]}
  - {cluster: pool-b, priority: 1, metrics: ["http://` + s.PoolB.Addr + `/metrics"]}
  sla: {ttftP95: 10s, queueDepth: 3}
  tuning: {window: 2s, minSamples: 8, interval: 250ms, step: 20, cooldown: 30s, probeWeight: 2}
`
	}, 1)
	// pool-a runs two requests at a time; eight clients make six wait.
	cfg := s.PoolA.Config()
	cfg.MaxBatch = 2
	s.PoolA.SetConfig(cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("llama", 4, true, ""), map[string]string{"x-mock-itl-ms": "20"})
				if r.Status != 200 && ctx.Err() == nil {
					t.Errorf("status %d: %s", r.Status, r.Body)
					return
				}
			}
		})
	}
	start := time.Now()
	// As traffic leaves, pool-a's queue shortens; it need not drain fully.
	testutil.Eventually(t, 10*time.Second, func() bool { _, b := weights(t, s.Gateway.AdminURL); return b >= 40 }, "traffic to leave the queueing pool")
	t.Logf("backup at 40%% or more %v after pool-a started queueing", time.Since(start).Round(time.Millisecond))
	cancel()
	wg.Wait()

	resp, err := http.Get(s.Gateway.AdminURL + "/debug/controller?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var states []struct {
		History []struct {
			Reason string `json:"reason"`
		} `json:"history"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&states); err != nil || len(states) != 1 || len(states[0].History) == 0 {
		t.Fatalf("controller state: %v %+v", err, states)
	}
	if why := states[0].History[0].Reason; !strings.Contains(why, "queue depth") {
		t.Errorf("first shift's reason %q does not name the queue", why)
	}
}
