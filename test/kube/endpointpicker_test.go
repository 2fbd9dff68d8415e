package kube

// infergate in front of a real Endpoint Picker: the Gateway API Inference
// Extension's EPP (built from the module proxy, pinned in
// scripts/install-test-deps.sh) discovers three vLLM-speaking model servers
// through the real kube-apiserver (Pod objects whose status the test sets,
// an InferencePool), scrapes their metrics, and picks the pod of each request
// that infergate's gate let through, in one plain Envoy rendered from
// envoy/inference-pool.yaml.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

const (
	poolNS    = "inference"
	poolName  = "vllm-llama"
	poolModel = "llama-3-8b"
	// The callers' API keys (the gate stores their hashes).
	premiumKey = "sk-premium-acme"
	freeKey    = "sk-free-initech"
)

// Each model server runs this: a bounded batch and a queue behind it, so
// vllm:num_requests_running and vllm:num_requests_waiting are what a
// request meets. Short times: the test counts, it does not time.
var podConfig = mock.Config{TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond, MaxTokens: 8, MaxBatch: 4, KVCacheTokens: 4096}

func TestInfergateInFrontOfEndpointPicker(t *testing.T) {
	eppBin := endpointPickerBin(t)
	c := startCluster(t)
	c.createNamespace(t, poolNS)
	// Without a controller-manager nobody makes the namespace's default
	// service account, which admitting a Pod needs.
	applyYAML(t, c, "{apiVersion: v1, kind: ServiceAccount, metadata: {name: default, namespace: "+poolNS+"}}")
	pods := startModelServers(t, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"})
	port := pods[0].port
	for i, p := range pods {
		c.createReadyPod(t, fmt.Sprintf("vllm-%d", i), p.ip)
	}
	applyYAML(t, c, fmt.Sprintf(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: %s, namespace: %s}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: %d}]
  endpointPickerRef: {name: %s-epp, port: {number: 9002}}
`, poolName, poolNS, port, poolName))
	eppPort := startEndpointPicker(t, c, eppBin)
	gate := startGate(t, "")
	envoy := envoytest.Start(t, envoytest.Render(t, "envoy/inference-pool.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": strconv.Itoa(gate.extproc), "EPP_PORT": strconv.Itoa(eppPort),
	}))
	// The picker knows every pod once it scrapes each.
	testutil.Eventually(t, 60*time.Second, func() bool {
		return !slices.ContainsFunc(pods, func(p *modelServer) bool { return p.scrapes.Load() < 2 })
	}, "the endpoint picker to scrape all three pods")

	// The gate first: a request without a key goes nowhere.
	before := servedBy(pods)
	if code, body := sendChat(t, envoy.URL, "", "no key", nil); code != http.StatusUnauthorized {
		t.Errorf("without a key: %d %s, want the gate's 401", code, body)
	}
	if after := servedBy(pods); !slices.Equal(before, after) {
		t.Errorf("a request the gate refused reached a pod: served %v -> %v", before, after)
	}

	// One pod loaded: its batch full and a queue behind it, by requests
	// sent to it directly (a first token ten minutes away). Once the
	// picker has scraped it twice since, it knows.
	loaded := pods[0]
	hold, release := context.WithCancel(t.Context())
	var held sync.WaitGroup
	for i := range 2 * podConfig.MaxBatch {
		held.Go(func() {
			req, _ := http.NewRequestWithContext(hold, http.MethodPost, "http://"+loaded.addr()+"/v1/chat/completions",
				strings.NewReader(chatRequest(fmt.Sprintf("held %d", i))))
			req.Header.Set("x-mock-ttft-ms", "600000")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				drain(resp)
			}
		})
	}
	t.Cleanup(func() { release(); held.Wait() })
	testutil.Eventually(t, 30*time.Second, func() bool {
		g := loaded.gauges(t)
		return g["vllm:num_requests_running"] == float64(podConfig.MaxBatch) && g["vllm:num_requests_waiting"] == float64(podConfig.MaxBatch)
	}, "the loaded pod to run a full batch with a queue behind it")
	since := loaded.scrapes.Load()
	testutil.Eventually(t, 30*time.Second, func() bool { return loaded.scrapes.Load() >= since+2 },
		"the endpoint picker to scrape the loaded pod")

	// Through the whole chain, one after another, each with a client's
	// forged Inference Extension headers: the pod that served is the one
	// the stamp names, and the stream is the model server's, byte for byte.
	const n = 24
	forged := map[string]string{
		"x-gateway-inference-fairness-id": "forged-by-client",
		"x-gateway-inference-objective":   "forged-by-client",
		"x-gateway-destination-endpoint":  loaded.addr(),
	}
	counts := map[string]int{}
	for i := range n {
		before := servedBy(pods)
		rid := fmt.Sprintf("epp-%d", i)
		hdr := map[string]string{"x-request-id": rid}
		for k, v := range forged {
			hdr[k] = v
		}
		code, body := sendChat(t, envoy.URL, premiumKey, prompt(i), hdr)
		if code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
		after := servedBy(pods)
		served := -1
		for j := range pods {
			if after[j] == before[j]+1 {
				served = j
			}
		}
		if served < 0 || sum(after)-sum(before) != 1 {
			t.Fatalf("request %d: pods served %v -> %v, want one more at one pod", i, before, after)
		}
		counts[pods[served].ip]++
		// The gate asks for usage in the stream (stream_options), so the
		// reference is the pod's answer to the body it received.
		if _, got := pods[served].mock.LastRequest(); body != referenceStream(t, got) {
			t.Errorf("request %d: the stream differs from the model server's\n got %q\nwant %q", i, body, referenceStream(t, got))
		}
		st := gate.stampOf(t, rid)
		if st.Upstream != pods[served].addr() || st.Pool != "inference-pool" || st.Tenant != "acme" || !st.Complete {
			t.Errorf("request %d: stamp %+v, want upstream %s (the pod that served), pool inference-pool, tenant acme, complete", i, st, pods[served].addr())
		}
	}
	t.Logf("distribution of %d requests with %s loaded (batch %d full, %d waiting): %v", n, loaded.ip, podConfig.MaxBatch, podConfig.MaxBatch, counts)
	if counts[loaded.ip] >= n/len(pods) {
		t.Errorf("the loaded pod served %d of %d requests, not fewer than round robin's %d: %v", counts[loaded.ip], n, n/len(pods), counts)
	}
	// The picker passes these headers on to the pod unchanged (without the
	// config's strip filter every pod receives them), so what no pod
	// received, the picker did not read either.
	for _, p := range pods {
		if seen := p.headerValues(); slices.Contains(seen, "forged-by-client") {
			t.Errorf("pod %s received a client's forged Inference Extension header: %v", p.ip, seen)
		}
	}
	release()
	held.Wait()

	streamsInLockstep(t, envoy.URL, pods, chatRequest("in lock step"), map[string]string{"authorization": "Bearer " + premiumKey})

	// The tiers, before a second picker of the same pool whose flow control
	// layer is on: while the pool is saturated it holds requests in
	// priority bands and dispatches the highest band first. The objectives
	// exist in the pool's namespace, as an install would create them, before
	// it starts (a request naming one it has not read yet would run at
	// priority 0).
	applyYAML(t, c, fmt.Sprintf(`
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: %[1]s}
spec: {priority: 10, poolRef: {name: %[2]s}}
`, poolNS, poolName))
	applyYAML(t, c, fmt.Sprintf(`
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: sheddable, namespace: %[1]s}
spec: {priority: -1, poolRef: {name: %[2]s}}
`, poolNS, poolName))
	fc := startFlowControlPicker(t, c, eppBin)
	fcEnvoy := envoytest.Start(t, envoytest.Render(t, "envoy/inference-pool.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": strconv.Itoa(gate.extproc), "EPP_PORT": strconv.Itoa(fc.grpc),
	}))
	testutil.Eventually(t, 60*time.Second, func() bool { return fc.metric(t, "inference_pool_ready_pods") == float64(len(pods)) },
		"the flow-control picker to scrape all three pods")
	// Without identity headers the picker sees both tiers alike: one
	// priority, one flow, first come first served.
	if order := premiumAmongQueued(t, fcEnvoy.URL, fc, pods, "fc-plain"); order != 6 {
		t.Errorf("without identity headers the picker dispatched the premium request %d of 7 (queued after six free ones, one flow, first come first served): want 7", order+1)
	}
	reportTierTTFT(t, fcEnvoy.URL, gate, pods, "flow control on, no identity headers")

	// The same pool and picker behind a gate whose policy tells the picker
	// who is calling: premium critical (priority 10), free sheddable (-1).
	tiered := startGate(t, tierObjectives)
	tieredEnvoy := envoytest.Start(t, envoytest.Render(t, "envoy/inference-pool.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": strconv.Itoa(tiered.extproc), "EPP_PORT": strconv.Itoa(fc.grpc),
	}))
	if order := premiumAmongQueued(t, tieredEnvoy.URL, fc, pods, "fc-tiered"); order != 0 {
		t.Errorf("with the gate's identity headers the picker dispatched the premium request %d of 7, behind free ones queued before it: want it first (its band, priority 10, before the sheddable one)", order+1)
	}
	reportTierTTFT(t, tieredEnvoy.URL, tiered, pods, "flow control on, identity headers from the gate")
	// What the picker was told reached the pods too (it passes the headers
	// on): the gate's objectives, each tier's own.
	for _, want := range []string{"critical", "sheddable"} {
		if !slices.ContainsFunc(pods, func(p *modelServer) bool { return slices.Contains(p.headerValues(), want) }) {
			t.Errorf("no pod received the gate's objective %q", want)
		}
	}
}

// tierObjectives is the smallest policy that tells an Endpoint Picker who
// is calling: the key's tier picks the InferenceObjective, and the fairness
// id defaults to the tenant.
const tierObjectives = `package infergate.authz

default allow := true

objective := {"premium": "critical", "free": "sheddable"}[input.labels.tier]
`

// streamsInLockstep proves, by causality, that nothing in the chain (the
// gate, the picker's FULL_DUPLEX_STREAMED response, the meter) holds events
// back: the pod writes event k+1 only once the client has received event k
// (mock's x-mock-lockstep), so a filter that buffered would stall the
// stream at once, on any machine.
// streamsInLockstep streams reqBody (with hdr; "host" sets the Host) through
// base in lock step with the pod that serves it.
func streamsInLockstep(t *testing.T, base string, pods []*modelServer, reqBody string, hdr map[string]string) {
	t.Helper()
	const id = "epp-lockstep"
	var gates []*mock.Lockstep // every pod's: the picker chooses which one serves
	for _, p := range pods {
		gates = append(gates, p.mock.Lockstep(id))
		t.Cleanup(func() { p.mock.Forget(id) })
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		if k == "host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	req.Header.Set("x-mock-lockstep", id)
	// The client asks no usage: the gateway removes the usage event the
	// gate asked the pod for, and the pod acknowledges it itself.
	req.Header.Set("x-mock-lockstep-unseen", "usage")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("lock-step stream: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("lock-step stream: %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	events := 0
	var body strings.Builder
	for {
		line, err := r.ReadString('\n')
		body.WriteString(line)
		if line == "\n" { // an event's end: let the pod write the next
			for _, g := range gates {
				g.Ack(events)
			}
			events++
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the lock-step stream stalled after %d events (something between the pod and the client holds events back): %v", events, err)
		}
	}
	served := slices.IndexFunc(pods, func(p *modelServer) bool { return len(p.mock.Lockstep(id).Emitted()) > 0 })
	if served < 0 {
		t.Fatal("no pod wrote the lock-step stream")
	}
	if _, sent := pods[served].mock.LastRequest(); body.String() != referenceStream(t, sent) {
		t.Errorf("the lock-step stream differs from the model server's\n got %q\nwant %q", body.String(), referenceStream(t, sent))
	}
	if n := len(pods[served].mock.Lockstep(id).Emitted()); events != n-1 || n < 10 {
		t.Errorf("the client read %d events, the pod wrote %d, want all but the usage event (at least 10)", events, n)
	}
}

// premiumAmongQueued is where the picker's flow control dispatches a
// premium request among free ones queued in it before it: by order and
// count, not time. Every pod's batch is full with a request waiting behind
// it (sent to the pods directly, a first token ten minutes away), so the
// picker holds whatever comes; six free requests are queued in it, one at
// a time, then a premium one; none reaches a pod; then the pods are freed
// and all seven reach one, once each. It returns the premium request's
// place (from 0) in the order the picker dispatched the seven, from the
// log of its dispatch loop (one goroutine, a line per dispatch, written
// before the request goes on). The order they reached the pods is logged,
// not asserted: the loop dispatches one request a millisecond tick, and
// which of two dispatched a tick apart reaches a pod first is the
// machine's.
func premiumAmongQueued(t *testing.T, base string, fc *flowControlPicker, pods []*modelServer, prefix string) int {
	t.Helper()
	hold, release := context.WithCancel(t.Context())
	var held sync.WaitGroup
	defer func() { release(); held.Wait() }()
	for _, p := range pods {
		for i := range podConfig.MaxBatch + 1 {
			held.Go(func() {
				req, _ := http.NewRequestWithContext(hold, http.MethodPost, "http://"+p.addr()+"/v1/chat/completions",
					strings.NewReader(chatRequest(fmt.Sprintf("%s held %d", prefix, i))))
				req.Header.Set("x-mock-ttft-ms", "600000")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					drain(resp)
				}
			})
		}
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		return !slices.ContainsFunc(pods, func(p *modelServer) bool {
			g := p.gauges(t)
			return g["vllm:num_requests_running"] != float64(podConfig.MaxBatch) || g["vllm:num_requests_waiting"] != 1
		}) && fc.metric(t, "inference_pool_average_queue_size") >= 1
	}, "every pod's batch full with one waiting, and the picker to know (the pool saturated)")

	const enqueued = "inference_extension_flow_control_request_enqueue_duration_seconds_count"
	queuedBefore := fc.metric(t, enqueued, `outcome="NotYetFinalized"`)
	var ids []string
	done := make(chan string, 7)
	send := func(key, id string) {
		ids = append(ids, id)
		go func() {
			code, body, err := chatThrough(t.Context(), base, key, id, map[string]string{"x-request-id": id, "x-mock-tokens": "4"})
			if err != nil || code != http.StatusOK {
				done <- fmt.Sprintf("%s: %d %v %.200s", id, code, err, body)
				return
			}
			done <- ""
		}()
		testutil.Eventually(t, 30*time.Second, func() bool {
			return fc.metric(t, enqueued, `outcome="NotYetFinalized"`) >= queuedBefore+float64(len(ids))
		}, "the picker to queue "+id)
	}
	for i := range 6 {
		send(freeKey, fmt.Sprintf("%s-free-%d", prefix, i))
	}
	premium := prefix + "-premium"
	send(premiumKey, premium)
	if early := arrivalOrder(pods, prefix+"-"); len(early) > 0 {
		t.Fatalf("%v reached a pod while the pool was saturated: the picker did not hold them", early)
	}

	release() // the pods' batches empty; the picker sees it at its next scrape
	for range ids {
		if failed := <-done; failed != "" {
			t.Errorf("a queued request did not complete: %s", failed)
		}
	}
	arrived := arrivalOrder(pods, prefix+"-")
	dispatched := fc.dispatched(t, prefix+"-")
	t.Logf("%s: queued %v; the picker dispatched %v; the pods received %v", prefix, ids, dispatched, arrived)
	if !slices.Equal(slices.Sorted(slices.Values(arrived)), slices.Sorted(slices.Values(ids))) {
		t.Errorf("%s: the pods received %v, want each of %v once", prefix, arrived, ids)
	}
	if !slices.Equal(slices.Sorted(slices.Values(dispatched)), slices.Sorted(slices.Values(ids))) {
		t.Fatalf("%s: the picker's log dispatched %v, want each of %v once", prefix, dispatched, ids)
	}
	return slices.Index(dispatched, premium)
}

// reportTierTTFT measures, and does not assert (timing is the machine's),
// the TTFT p95 of a premium caller's requests while the free tier's load
// keeps every pod's batch full and queues behind it, from the stamps, and
// how many free requests the picker refused (429). Three free workers a
// batch slot: the pods' queues stay full and the picker holds the rest.
// Without identity headers the picker's flow control queues both tiers
// alike, in one flow; with them, it dispatches the critical band before
// the sheddable one.
func reportTierTTFT(t *testing.T, base string, gate *gateProc, pods []*modelServer, variant string) {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	var free sync.WaitGroup
	var freeIDs sync.Map
	var freeN, shed atomic.Int64
	workers := 3 * len(pods) * podConfig.MaxBatch
	for w := range workers {
		free.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				rid := fmt.Sprintf("free-%d-%d", w, i)
				code, _, err := chatThrough(ctx, base, freeKey, fmt.Sprintf("free %d %d", w, i), map[string]string{"x-request-id": rid, "x-mock-tokens": "32"})
				switch {
				case err == nil && code == http.StatusOK:
					freeIDs.Store(rid, true)
					freeN.Add(1)
				case err == nil && code == http.StatusTooManyRequests:
					// Shed by the picker: back off a little, as a client
					// would, rather than spin.
					shed.Add(1)
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	t.Cleanup(func() { stop(); free.Wait() })
	testutil.Eventually(t, 30*time.Second, func() bool {
		waiting := 0.0
		for _, p := range pods {
			waiting += p.gauges(t)["vllm:num_requests_waiting"]
		}
		return waiting > 0 && freeN.Load() >= int64(workers)
	}, "the free tier's load to queue at the pods")
	var premiumIDs, freeIDList []string
	for i := range 40 { // enough that the p95 is not the one slowest
		rid := fmt.Sprintf("premium-%d", i)
		if code, body := sendChat(t, base, premiumKey, fmt.Sprintf("premium %d", i), map[string]string{"x-request-id": rid}); code != http.StatusOK {
			t.Fatalf("premium request %d under load: %d %s", i, code, body)
		}
		premiumIDs = append(premiumIDs, rid)
	}
	stop()
	free.Wait()
	freeIDs.Range(func(k, _ any) bool {
		freeIDList = append(freeIDList, k.(string))
		return true
	})
	stamps := gate.stampsOf(t, slices.Concat(premiumIDs, freeIDList))
	var premium, freeTTFT []float64
	for _, id := range premiumIDs {
		premium = append(premium, stamps[id].TTFTms)
	}
	for _, id := range freeIDList {
		freeTTFT = append(freeTTFT, stamps[id].TTFTms)
	}
	t.Logf("TTFT p95 with the pool saturated by the free tier (%d workers over %d slots), %s: premium %.1f ms (%d requests), free %.1f ms (%d requests, %d shed)",
		workers, len(pods)*podConfig.MaxBatch, variant, p95(premium), len(premium), p95(freeTTFT), len(freeTTFT), shed.Load())
}

func p95(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[(len(v)*95+99)/100-1]
}

// modelServer is one simulated vLLM pod: the lab's mock on its own loopback
// address, counting what reaches it.
type modelServer struct {
	ip   string
	port int
	mock *mock.Server

	completions atomic.Int64 // inference requests
	picked      atomic.Int64 // of them, with an Endpoint Picker's x-gateway-destination-endpoint
	scrapes     atomic.Int64 // GET /metrics
	mu          sync.Mutex
	ieHeaders   map[string]bool // the distinct values of the x-gateway-inference-* headers received
	arrivals    []arrival       // the inference requests, as they came (the first maxArrivals)
}

// arrival is an inference request a model server received: its
// x-request-id, and its place among every server's in this package.
type arrival struct {
	seq int64
	id  string
}

const maxArrivals = 100000

// arrivalSeq orders the arrivals at all model servers.
var arrivalSeq atomic.Int64

// arrivalOrder is the x-request-ids starting with prefix that reached any
// of pods, in the order they did.
func arrivalOrder(pods []*modelServer, prefix string) []string {
	var all []arrival
	for _, p := range pods {
		p.mu.Lock()
		for _, a := range p.arrivals {
			if strings.HasPrefix(a.id, prefix) {
				all = append(all, a)
			}
		}
		p.mu.Unlock()
	}
	slices.SortFunc(all, func(a, b arrival) int { return int(a.seq - b.seq) })
	ids := make([]string, len(all))
	for i, a := range all {
		ids[i] = a.id
	}
	return ids
}

func (m *modelServer) addr() string { return net.JoinHostPort(m.ip, strconv.Itoa(m.port)) }

func (m *modelServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/metrics":
		m.scrapes.Add(1)
	case r.Method == http.MethodPost:
		m.completions.Add(1)
		if r.Header.Get("x-gateway-destination-endpoint") != "" {
			m.picked.Add(1)
		}
		m.mu.Lock()
		if len(m.arrivals) < maxArrivals {
			m.arrivals = append(m.arrivals, arrival{arrivalSeq.Add(1), r.Header.Get("x-request-id")})
		}
		for k, vs := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-gateway-inference-") {
				if m.ieHeaders == nil {
					m.ieHeaders = map[string]bool{}
				}
				for _, v := range vs {
					if len(m.ieHeaders) < 1000 {
						m.ieHeaders[v] = true
					}
				}
			}
		}
		m.mu.Unlock()
	}
	m.mock.Handler().ServeHTTP(w, r)
}

func (m *modelServer) headerValues() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.ieHeaders))
}

// gauges reads the mock's unlabelled vLLM gauges in process, without
// counting as a scrape.
func (m *modelServer) gauges(t *testing.T) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.mock.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && strings.HasPrefix(f[0], "vllm:") {
			out[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return out
}

// startModelServers serves one mock per address, all on the same port (as
// an InferencePool's targetPorts has them), stopped when the test ends.
func startModelServers(t testing.TB, ips []string) []*modelServer {
	t.Helper()
	for attempt := 1; ; attempt++ {
		var lis []net.Listener
		port := 0
		for _, ip := range ips {
			l, err := net.Listen("tcp4", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				break
			}
			port = l.Addr().(*net.TCPAddr).Port
			lis = append(lis, l)
		}
		if len(lis) < len(ips) {
			for _, l := range lis {
				l.Close()
			}
			if attempt == 5 {
				t.Fatalf("no port free on all of %v", ips)
			}
			continue
		}
		var out []*modelServer
		for i, l := range lis {
			m := &modelServer{ip: ips[i], port: port, mock: mock.New(podConfig, nil)}
			srv := &http.Server{Handler: m, ReadHeaderTimeout: 5 * time.Second}
			go srv.Serve(l) //nolint:errcheck // Close ends it
			t.Cleanup(func() { srv.Close() })
			out = append(out, m)
		}
		return out
	}
}

func servedBy(pods []*modelServer) []int64 {
	out := make([]int64, len(pods))
	for i, p := range pods {
		out[i] = p.completions.Load()
	}
	return out
}

func sum(v []int64) int64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return s
}

// createReadyPod stores a Pod of the pool with the status a kubelet would
// have given it: Running, Ready, at ip. Nothing runs it; the mock at ip is
// the pod.
func (c *cluster) createReadyPod(t testing.TB, name, ip string) {
	t.Helper()
	c.createPod(t, poolNS, name, ip, "", map[string]string{"app": "vllm"})
}

// createPod stores a pod running as service account sa (the default when
// empty), with labels, and the status a kubelet would have given it:
// Running, Ready, at ip.
func (c *cluster) createPod(t testing.TB, ns, name, ip, sa string, labels map[string]string) {
	t.Helper()
	pods := c.kube.CoreV1().Pods(ns)
	pod, err := pods.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	if _, err := pods.UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("pod %s status: %v", name, err)
	}
}

// endpointPickerBin is the pinned EPP scripts/install-test-deps.sh built.
func endpointPickerBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("EPP_BIN")
	if bin == "" {
		bin = filepath.Join(repoRoot, ".tools", "bin", "epp-v1.4.0")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the endpoint picker is not built (%v): run scripts/install-test-deps.sh, or set EPP_BIN", err)
	}
	return bin
}

// startEndpointPicker runs the EPP for the InferencePool against the API
// server, plaintext gRPC (as envoy/inference-pool.yaml expects), and returns
// its ext_proc port.
func startEndpointPicker(t testing.TB, c *cluster, bin string) int {
	t.Helper()
	// A pod with one request waiting counts as saturated (the default is
	// five): the pods here have four slots, and the tiers' test needs
	// the picker to shed the sheddable tier at that load.
	grpcPort, _ := runEndpointPicker(t, c, bin, []string{"SD_QUEUE_DEPTH_THRESHOLD=1"}, nil)
	return grpcPort
}

// runEndpointPicker runs the EPP for the InferencePool with env and args
// added, its standard error to stderr (nil: the process's log), and
// returns its ext_proc and metrics ports.
func runEndpointPicker(t testing.TB, c *cluster, bin string, env []string, stderr io.Writer, args ...string) (grpcPort, metricsPort int) {
	t.Helper()
	serveOnFreePorts(t, "epp", 3, 60*time.Second, nil, func(ports []int) (*exec.Cmd, string) {
		grpcPort, metricsPort = ports[0], ports[2]
		cmd := exec.Command(bin, append([]string{"--pool-name", poolName, "--pool-namespace", poolNS,
			"--grpc-port", strconv.Itoa(ports[0]), "--grpc-health-port", strconv.Itoa(ports[1]), "--metrics-port", strconv.Itoa(ports[2]),
			"--secure-serving=false", "--tracing=false", "--metrics-endpoint-auth=false", "--enable-pprof=false"}, args...)...)
		cmd.Stderr = stderr
		return withEnv(cmd, append([]string{"KUBECONFIG=" + c.kubeconfig}, env...)...), fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2])
	})
	return grpcPort, metricsPort
}

// flowControlConfig is the picker's configuration with its flow control
// layer on (v1.4.0: apix/config/v1alpha1, pkg/epp/flowcontrol). A
// configuration replaces the default one whole, so its scheduling profile
// is spelled out as v1.4.0's default (pkg/epp/config/loader/defaults.go).
// A pod with one request waiting counts as saturated (the pods here have
// four slots). While the pool is (the pods' average reaches 1), flow
// control holds every request, sheddable or not, in its priority's band;
// as it stops being, the dispatch loop takes the highest band first
// (registry/shard.go sorts them), within a band the flow whose head is
// oldest (global-strict-fairness-policy) and within a flow the first to
// come (fcfs-ordering-policy). Priority is the InferenceObjective's named
// by x-gateway-inference-objective (0 without one), the flow is
// x-gateway-inference-fairness-id ("default-flow" without one). The bands
// are the objectives' and no objective's; another priority would get one
// from the default template.
const flowControlConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: prefix-cache-scorer}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
saturationDetector: {queueDepthThreshold: 1}
flowControl:
  priorityBands:
  - {priority: 10}
  - {priority: 0}
  - {priority: -1}
`

// flowControlPicker is an EPP of the pool with flow control on.
type flowControlPicker struct {
	grpc    int
	metrics string // its Prometheus endpoint
	log     string // its log, at trace verbosity: the dispatch loop logs each dispatch
}

// startFlowControlPicker runs a picker on flowControlConfig that scrapes
// the pods every 10 ms, logs at trace verbosity (to a file: it logs every
// millisecond while it holds requests) and refreshes its pool gauges every
// 50 ms. The scrape interval is the saturation signal's lag, and while the
// last scrape says the pool has room the dispatch loop lets everything it
// holds go: at the default 50 ms the bursts are larger, the pods' own
// queues take them, and the premium tier waits there behind the free one
// (measured: premium TTFT p95 359 ms with identity headers, 483 ms
// without; at 10 ms 177 and 400 ms).
func startFlowControlPicker(t testing.TB, c *cluster, bin string) *flowControlPicker {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), "epp-flow-control.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("flow-control picker log (tail):\n%s", b[max(0, len(b)-32<<10):])
		}
	})
	grpcPort, metricsPort := runEndpointPicker(t, c, bin, nil, log,
		"--config-text", flowControlConfig, "--v", "5", "--refresh-metrics-interval", "10ms", "--refresh-prometheus-metrics-interval", "50ms")
	return &flowControlPicker{grpc: grpcPort, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), log: log.Name()}
}

// metric sums the picker's samples of name whose labels include every one
// of labels (`key="value"`).
func (p *flowControlPicker) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		series := line[:i]
		if n, _, _ := strings.Cut(series, "{"); n != name || slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(series, l) }) {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// dispatchedRE is the line the dispatch loop of v1.4.0 logs, at trace
// verbosity, as it lets a request go on to scheduling
// (pkg/epp/flowcontrol/controller/internal/processor.go, dispatchItem).
var dispatchedRE = regexp.MustCompile(`Item dispatched\..*"reqID": ?"([^"]+)"`)

// dispatched is the request ids starting with prefix that the picker's
// flow control dispatched, in its order.
func (p *flowControlPicker) dispatched(t testing.TB, prefix string) []string {
	t.Helper()
	f, err := os.Open(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		if m := dispatchedRE.FindSubmatch(sc.Bytes()); m != nil && strings.HasPrefix(string(m[1]), prefix) {
			ids = append(ids, string(m[1]))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// gateProc is `infergate serve` with two callers' keys.
type gateProc struct {
	extproc, admin, xds int
	requests            *testutil.Buffer
}

// startGate starts infergate serving the pool's model; policy, when set,
// is its authz.rego.
func startGate(t testing.TB, policy string) *gateProc {
	t.Helper()
	return startGateWith(t, policy, fmt.Sprintf("models: [%s]\n", poolModel))
}

// startGateWith starts infergate with models, the catalog part of its
// configuration (models or virtualModels); with virtual models it serves
// their routes over xDS on g.xds.
func startGateWith(t testing.TB, policy, models string) *gateProc {
	t.Helper()
	dir := t.TempDir()
	hash := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	keys := fmt.Sprintf("keys:\n- {id: acme-prod, sha256: %s, tenant: acme, labels: {tier: premium}}\n- {id: initech-free, sha256: %s, tenant: initech, labels: {tier: free}}\n",
		hash(premiumKey), hash(freeKey))
	if err := os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("auth: {keys: %s}\nratelimit: {embedded: {path: %s}}\n", filepath.Join(dir, "keys.yaml"), filepath.Join(dir, "ledger.db")) + models
	if policy != "" {
		pdir := filepath.Join(dir, "policy")
		if err := os.MkdirAll(pdir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pdir, "authz.rego"), []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("policy: {dir: %s}\n", pdir)
	}
	g := &gateProc{requests: &testutil.Buffer{}}
	serveOnFreePorts(t, "infergate", 3, 20*time.Second, g.requests, func(ports []int) (*exec.Cmd, string) {
		g.extproc, g.admin, g.xds = ports[0], ports[1], ports[2]
		full := cfg
		if strings.Contains(models, "virtualModels:") {
			full += fmt.Sprintf("xds: {listen: 127.0.0.1:%d}\n", g.xds)
		}
		if err := os.WriteFile(filepath.Join(dir, "infergate.yaml"), []byte(full), 0o600); err != nil {
			t.Fatal(err)
		}
		return exec.Command(infergateBin(t), "serve", "--config", filepath.Join(dir, "infergate.yaml"),
				"--extproc-listen", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", ports[1])),
			fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])
	})
	return g
}

// podStamp is what a request-log line says about where a request went.
type podStamp struct {
	RequestID string  `json:"request_id"`
	Tenant    string  `json:"tenant"`
	Pool      string  `json:"pool"`
	Upstream  string  `json:"upstream"`
	Complete  bool    `json:"complete"`
	TTFTms    float64 `json:"ttft_ms"`
}

// stampsOf waits for the request-log lines of every id in rids and
// returns them by id: one pass over the log a try, not one an id (a load
// run's ids are thousands).
func (g *gateProc) stampsOf(t *testing.T, rids []string) map[string]podStamp {
	t.Helper()
	out := make(map[string]podStamp, len(rids))
	testutil.Eventually(t, 10*time.Second, func() bool {
		clear(out)
		want := make(map[string]bool, len(rids))
		for _, id := range rids {
			want[id] = true
		}
		var st podStamp
		for line := range strings.Lines(g.requests.String()) {
			if st = (podStamp{}); json.Unmarshal([]byte(line), &st) == nil && want[st.RequestID] {
				out[st.RequestID] = st
			}
		}
		return len(out) == len(want)
	}, fmt.Sprintf("the request log lines of %d requests", len(rids)))
	return out
}

// stampOf waits for the request-log line of request id rid.
func (g *gateProc) stampOf(t *testing.T, rid string) podStamp {
	t.Helper()
	var st podStamp
	testutil.Eventually(t, 10*time.Second, func() bool {
		for line := range strings.Lines(g.requests.String()) {
			if json.Unmarshal([]byte(line), &st) == nil && st.RequestID == rid {
				return true
			}
		}
		return false
	}, "the request log line of "+rid)
	return st
}

func prompt(i int) string { return fmt.Sprintf("tell me story number %d", i) }

func chatRequest(p string) string {
	return fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":%q}]}`, poolModel, p)
}

// sendChat streams a chat completion through Envoy with key (none if
// empty) and returns the status and the whole body.
func sendChat(t *testing.T, base, key, p string, hdr map[string]string) (int, string) {
	t.Helper()
	code, body, err := chatThrough(t.Context(), base, key, p, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

func chatThrough(ctx context.Context, base, key, p string, hdr map[string]string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hung chain fails, it does not stall
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatRequest(p)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("content-type", "application/json")
	if key != "" {
		req.Header.Set("authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("POST through Envoy: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("reading the stream: %w", err)
	}
	return resp.StatusCode, string(b), nil
}

// referenceStream is the bytes a model server answers body with, asked
// directly (the mock's answer is a function of the request alone).
func referenceStream(t *testing.T, body []byte) string {
	t.Helper()
	rec := httptest.NewRecorder()
	mock.New(podConfig, nil).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
	if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte("[DONE]")) {
		t.Fatalf("reference stream of %s: %d %s", body, rec.Code, rec.Body)
	}
	return string(unasked(t, rec.Body.Bytes()))
}

// unasked is what a client that did not ask for usage gets of a pool's
// stream answered with it (stream_options.include_usage, which the gate
// asks for the meter): the gateway's usage filter removes the usage-only
// event ("choices": []). It fails t if the pool sent none.
func unasked(t *testing.T, stream []byte) []byte {
	t.Helper()
	var out []byte
	for _, e := range strings.SplitAfter(string(stream), "\n\n") {
		if !strings.Contains(e, `"choices":[]`) {
			out = append(out, e...)
		}
	}
	if len(out) == len(stream) {
		t.Fatalf("the pool sent no usage event:\n%s", stream)
	}
	return out
}

// Every header the pinned picker reads or trusts (pkg/epp/metadata of the
// module the test runs) is removed from the client's request by
// envoy/inference-pool.yaml before the gate and the picker: a new one in a
// later release fails here, not in production.
func TestInferencePoolConfigStripsThePickersHeaders(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(moduleDir(t, "sigs.k8s.io/gateway-api-inference-extension@v1.4.0"), "pkg/epp/metadata/consts.go"))
	if err != nil {
		t.Fatal(err)
	}
	read := regexp.MustCompile(`"(x-gateway-[a-z0-9-]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(read) < 5 {
		t.Fatalf("pkg/epp/metadata names %d x-gateway-* headers; the file changed shape", len(read))
	}
	var boot struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							HTTPFilters []struct {
								Name        string `json:"name"`
								TypedConfig struct {
									Mutations struct {
										RequestMutations []struct {
											Remove string `json:"remove"`
										} `json:"request_mutations"`
									} `json:"mutations"`
								} `json:"typed_config"`
							} `json:"http_filters"`
						} `json:"typed_config"`
					} `json:"filters"`
				} `json:"filter_chains"`
			} `json:"listeners"`
		} `json:"static_resources"`
	}
	conf := envoytest.Render(t, "envoy/inference-pool.yaml", map[string]string{"LISTEN_PORT": "1", "ADMIN_PORT": "2", "EXTPROC_PORT": "3", "EPP_PORT": "4"})
	if err := yaml.Unmarshal([]byte(conf), &boot); err != nil {
		t.Fatal(err)
	}
	filters := boot.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters
	var names, removed []string
	for _, f := range filters {
		names = append(names, f.Name)
		if f.Name == "strip-inference-headers" {
			for _, m := range f.TypedConfig.Mutations.RequestMutations {
				removed = append(removed, m.Remove)
			}
		}
	}
	if want := []string{"strip-inference-headers", "infergate.gate", "inference-pool.epp", "infergate.usage", "infergate.meter", "envoy.filters.http.router"}; !slices.Equal(names, want) {
		t.Errorf("filters %v, want %v", names, want)
	}
	for _, m := range read {
		if !slices.Contains(removed, m[1]) {
			t.Errorf("the picker reads %s, which envoy/inference-pool.yaml does not remove from the client's request (removes %v)", m[1], removed)
		}
	}
}
