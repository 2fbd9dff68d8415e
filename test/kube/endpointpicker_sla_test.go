package kube

// SLA weights between an InferencePool and a backup pool, in plain Envoy
// rendered from envoy/inference-pool-sla.yaml: the virtual model's route,
// served by infergate's xDS, splits between the pool's ORIGINAL_DST cluster
// (the pod the real Endpoint Picker named) and an ordinary backup cluster.
// The weights are read from Envoy's own config dump and the controller's
// decision history, never from latencies the test times.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The pool's SLA sits far above its pods' TTFT (20 ms) and far below a
// slowed pod's (800 ms): a starved machine slows the pods for real, and the
// margin keeps that from reading as a breach. Two steps away (100 -> 55 ->
// 10, the probe weight the pool keeps) and two back.
const slaPoolConfig = `admin: {debug: {enabled: true}}
virtualModels:
- name: %s
  pools:
  - {cluster: inference-pool, priority: 0, endpointPicker: inference-pool.epp, metrics: [%s]}
  - {cluster: backup, priority: 1}
  sla: {ttftP95: 300ms}
  tuning: {window: 3s, minSamples: 5, interval: 250ms, step: 45, cooldown: 2s, probeWeight: 10}
`

func TestSLAMovesAnInferencePoolToItsBackup(t *testing.T) {
	eppBin := endpointPickerBin(t)
	c := startCluster(t)
	c.createNamespace(t, poolNS)
	applyYAML(t, c, "{apiVersion: v1, kind: ServiceAccount, metadata: {name: default, namespace: "+poolNS+"}}")
	pods := startModelServers(t, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"})
	var metrics []string
	for i, p := range pods {
		c.createReadyPod(t, fmt.Sprintf("vllm-%d", i), p.ip)
		metrics = append(metrics, "http://"+p.addr()+"/metrics")
	}
	applyYAML(t, c, fmt.Sprintf(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: %s, namespace: %s}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: %d}]
  endpointPickerRef: {name: %s-epp, port: {number: 9002}}
`, poolName, poolNS, pods[0].port, poolName))
	eppPort := startEndpointPicker(t, c, eppBin)
	// The backup: a hosted tier, here one more mock on its own port.
	backup := startModelServers(t, []string{"127.0.0.1"})[0]
	gate := startGateWith(t, "", fmt.Sprintf(slaPoolConfig, poolModel, strings.Join(metrics, ", ")))
	envoy := envoytest.Start(t, envoytest.Render(t, "envoy/inference-pool-sla.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": strconv.Itoa(gate.extproc), "EPP_PORT": strconv.Itoa(eppPort),
		"XDS_PORT": strconv.Itoa(gate.xds), "POOL_B_PORT": strconv.Itoa(backup.port),
	}))
	// Ready once Envoy has the route and the picker knows the pods.
	testutil.Eventually(t, 60*time.Second, func() bool {
		code, _, err := chatThrough(t.Context(), envoy.URL, premiumKey, "ready?", nil)
		return err == nil && code == http.StatusOK
	}, "a request through the gate, the picker and the xDS route")
	if w := envoyRouteWeights(t, envoy.AdminURL); w["inference-pool"] != 100 || w["backup"] != 0 {
		t.Fatalf("Envoy's route weights %v, want all on the InferencePool", w)
	}

	// Load: four callers streaming back to back.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var load sync.WaitGroup
	for i := range 4 {
		load.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				code, body, err := chatThrough(ctx, envoy.URL, premiumKey, prompt(100*i+n), nil)
				if ctx.Err() != nil {
					return
				}
				if err != nil || code != http.StatusOK {
					t.Errorf("status %d %v: %.200s", code, err, body)
					return
				}
			}
		})
	}

	// The pool's pods slow down: Envoy's route moves to the backup, down to
	// the probe weight the pool keeps, and the backup serves.
	setPodTTFT(pods, 800*time.Millisecond)
	slowed := time.Now()
	servedBefore := backup.completions.Load()
	testutil.Eventually(t, 45*time.Second, func() bool {
		w := envoyRouteWeights(t, envoy.AdminURL)
		return w["inference-pool"] == 10 && w["backup"] == 90
	}, "Envoy's route to move to the backup (inference-pool 10, backup 90)")
	testutil.Eventually(t, 10*time.Second, func() bool { return backup.completions.Load() > servedBefore },
		"the backup to serve the virtual model")
	t.Logf("on the backup (as Envoy routes) %v after the pods slowed down", time.Since(slowed).Round(time.Millisecond))

	// They recover: the route comes back.
	setPodTTFT(pods, podConfig.TTFT)
	recovered := time.Now()
	testutil.Eventually(t, 45*time.Second, func() bool {
		w := envoyRouteWeights(t, envoy.AdminURL)
		return w["inference-pool"] == 100 && w["backup"] == 0
	}, "Envoy's route to come back to the InferencePool")
	t.Logf("back on the InferencePool %v after the pods recovered", time.Since(recovered).Round(time.Millisecond))
	cancel()
	load.Wait()
	// The route turns the picker off for the backup's share: what the
	// backup served was not picked a pod for.
	if n := backup.picked.Load(); n != 0 {
		t.Errorf("%d of the backup's %d requests went through the picker (x-gateway-destination-endpoint set)", n, backup.completions.Load())
	}
	if served, picked := sum(servedBy(pods)), sumPicked(pods); picked != served {
		t.Errorf("the pods served %d requests, %d of them picked: the picker must choose each pod", served, picked)
	}

	// The controller's history: away in steps, then back in steps, one turn
	// (no flapping), each decision starting where the one before ended; the
	// moves away blame the pool's TTFT, and the pool's queue depth (its
	// pods' vLLM metrics, as the picker reads them) was observed.
	var states []struct {
		Name    string `json:"name"`
		History []struct {
			From   map[string]uint32 `json:"from"`
			To     map[string]uint32 `json:"to"`
			Reason string            `json:"reason"`
			Stats  map[string]struct {
				QueueDepth float64 `json:"queue_depth"`
			} `json:"stats"`
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(get(t, fmt.Sprintf("http://127.0.0.1:%d/debug/controller?format=json", gate.admin))), &states); err != nil || len(states) != 1 {
		t.Fatalf("/debug/controller?format=json: %v, %d models", err, len(states))
	}
	var path []uint32
	queueSeen := false
	for i, d := range states[0].History {
		if d.To["inference-pool"]+d.To["backup"] != 100 {
			t.Errorf("decision %d: weights %v do not sum to 100", i, d.To)
		}
		if i > 0 && !maps.Equal(d.From, states[0].History[i-1].To) {
			t.Errorf("decision %d starts from %v, the one before ended at %v", i, d.From, states[0].History[i-1].To)
		}
		if d.To["inference-pool"] < d.From["inference-pool"] && !strings.Contains(d.Reason, "TTFT") {
			t.Errorf("decision %d moved away for %q, not the pool's TTFT", i, d.Reason)
		}
		queueSeen = queueSeen || d.Stats["inference-pool"].QueueDepth >= 0
		if i == 0 {
			path = append(path, d.From["inference-pool"])
		}
		path = append(path, d.To["inference-pool"])
	}
	t.Logf("the InferencePool's weight, decision by decision: %v", path)
	if want := []uint32{100, 55, 10, 55, 100}; !slices.Equal(path, want) {
		t.Errorf("the InferencePool's weights went %v, want %v: away in two steps and back in two, no flapping", path, want)
	}
	if !queueSeen {
		t.Error("no decision saw the InferencePool's queue depth (its pods' vllm:num_requests_waiting)")
	}
}

func sumPicked(pods []*modelServer) int64 {
	var n int64
	for _, p := range pods {
		n += p.picked.Load()
	}
	return n
}

// setPodTTFT makes every pod answer its first token after d.
func setPodTTFT(pods []*modelServer, d time.Duration) {
	for _, p := range pods {
		cfg := p.mock.Config()
		cfg.TTFT = d
		p.mock.SetConfig(cfg)
	}
}

// envoyRouteWeights is the weight of each cluster in Envoy's route for the pool's
// virtual model, from its config dump of the routes it got over RDS.
func envoyRouteWeights(t *testing.T, adminURL string) map[string]int {
	t.Helper()
	return envoyRoutesWeights(t, adminURL, func(name string) bool { return name == poolModel })
}

// envoyRoutesWeights is the weight of each cluster of the routes route
// selects by name (a route to one cluster gives it 100).
func envoyRoutesWeights(t *testing.T, adminURL string, route func(name string) bool) map[string]int {
	t.Helper()
	var dump struct {
		Configs []struct {
			RouteConfig struct {
				VirtualHosts []struct {
					Routes []struct {
						Name  string `json:"name"`
						Route struct {
							Cluster          string `json:"cluster"`
							WeightedClusters struct {
								Clusters []struct {
									Name   string `json:"name"`
									Weight int    `json:"weight"`
								} `json:"clusters"`
							} `json:"weighted_clusters"`
						} `json:"route"`
					} `json:"routes"`
				} `json:"virtual_hosts"`
			} `json:"route_config"`
		} `json:"configs"`
	}
	if err := json.Unmarshal([]byte(get(t, adminURL+"/config_dump?resource=dynamic_route_configs")), &dump); err != nil {
		t.Fatalf("config dump: %v", err)
	}
	out := map[string]int{}
	for _, c := range dump.Configs {
		for _, vh := range c.RouteConfig.VirtualHosts {
			for _, r := range vh.Routes {
				if !route(r.Name) {
					continue
				}
				if r.Route.Cluster != "" {
					out[r.Route.Cluster] = 100
				}
				for _, wc := range r.Route.WeightedClusters.Clusters {
					out[wc.Name] = wc.Weight
				}
			}
		}
	}
	return out
}
