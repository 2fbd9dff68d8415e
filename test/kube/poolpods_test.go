package kube

// The SLA controller follows an InferencePool's pods through the real
// kube-apiserver, as the chart's service account with the chart's Roles:
// it scrapes the ready pods' vLLM metrics (the same the Endpoint Picker
// reads) for the pool's queue depth, drops a pod that turns NotReady,
// takes in a new one without a restart, and writes the weights the queue
// drives into the chart's InferencePool route.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/loadsignal"
	"github.com/infergate/infergate/xds/poolpods"
	"github.com/infergate/infergate/xds/routing"
)

// The chart's example (ci/inferencepools-values.yaml): a model split
// between a pool in the release's namespace and one in "models".
const (
	followedModel = "llama-3.1-8b-instruct"
	mainPool      = "vllm-llama3-8b"
	spotPool      = "vllm-llama3-8b-spot"
)

func TestControllerFollowsInferencePoolPods(t *testing.T) {
	c := startCluster(t)
	for _, ns := range []string{llmNS, "models", egNamespace} {
		c.createNamespace(t, ns)
	}
	rel, err := c.helmInstall(t, llmNS, relName, ciValues(t, "inferencepools"))
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	sa := c.serviceAccountOf(t, rel.Manifest)
	route := relName + "-inference"

	// Four model servers on one port (the pool's targetPort), each holding
	// one request running and a known queue behind it.
	servers := startModelServers(t, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
	port := servers[0].port
	waiting := []int{1, 2, 4, 8}
	for i, s := range servers {
		holdQueue(t, s, waiting[i])
	}
	pool := func(ns, name string) string {
		return fmt.Sprintf(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: %[2]s}}
  targetPorts: [{number: %[3]d}]
  endpointPickerRef: {name: %[2]s-epp, port: {number: 9002}}
`, ns, name, port)
	}
	applyYAML(t, c, pool(llmNS, mainPool)+"\n---\n"+pool("models", spotPool)+
		// What a controller-manager would have made, for the pods.
		"\n---\n{apiVersion: v1, kind: ServiceAccount, metadata: {name: default, namespace: "+llmNS+"}}")
	for i, s := range servers[:3] {
		c.createPodOf(t, llmNS, mainPool, fmt.Sprintf("%s-%d", mainPool, i), s.ip)
	}
	// A pod of another app in the same namespace, ready: not the pool's.
	c.createPodOf(t, llmNS, "other", "other-0", servers[3].ip)

	// The controller, in process, configured as the chart's example, with
	// the chart's service account's token.
	t.Setenv("KUBECONFIG", writeKubeconfig(t, c.tokenConfig(t, llmNS, sa)))
	ctx, cancel := context.WithCancel(t.Context())
	opts := routing.Options{
		VirtualModels: []routing.VirtualModel{{
			Name: followedModel,
			Pools: []routing.Pool{
				{Cluster: mainPool, Priority: 0, InferencePool: &poolpods.Pool{Namespace: llmNS, Name: mainPool}},
				{Cluster: "models/" + spotPool, Priority: 1, InferencePool: &poolpods.Pool{Namespace: "models", Name: spotPool}},
			},
			SLA:    controller.SLA{QueueDepth: 10},
			Tuning: controller.Tuning{Interval: 100 * time.Millisecond},
		}},
		WeightSink: routing.WeightSinkOptions{Type: "httpRoute", Namespace: llmNS, Name: route},
	}
	var logs syncLog
	svc, err := routing.New(ctx, opts, slog.New(slog.NewTextHandler(&logs, nil)), noop.NewMeterProvider().Meter("test"), nil)
	if err != nil {
		cancel()
		t.Fatalf("routing as %s: %v", sa, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := svc.Run(ctx, nil); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The first weights land on the InferencePool backendRefs, each pool
	// addressed by namespace and name.
	routes := c.dyn.Resource(httpRoutes).Namespace(llmNS)
	if w := poolRefWeights(c.get(t, routes, route)); w != "llm/vllm-llama3-8b=100 models/vllm-llama3-8b-spot=0" {
		t.Errorf("the controller's first weights on the InferencePool route: %s", w)
	}

	queue := func(what string, want float64) {
		t.Helper()
		var got controller.PoolStats
		testutil.Eventually(t, 30*time.Second, func() bool {
			got = poolState(t, svc, mainPool)
			return got.QueueDepth == want
		}, what)
		if spot := poolState(t, svc, "models/"+spotPool); spot.QueueDepth != -1 {
			t.Errorf("%s: the spot pool, with no pod, has queue %v; want no load (-1)", what, spot.QueueDepth)
		}
	}
	queue("the three ready pods' queues, summed", 1+2+4)

	c.setPodReady(t, llmNS, mainPool+"-1", false)
	queue("the NotReady pod drops out", 1+4)

	c.createPodOf(t, llmNS, mainPool, mainPool+"-3", servers[3].ip)
	queue("a new ready pod joins", 1+4+8)

	// 13 waiting breaches queueDepth 10: the controller moves the model
	// toward the spot pool, on the route.
	testutil.Eventually(t, 30*time.Second, func() bool {
		return poolRefWeights(c.get(t, routes, route)) == "llm/vllm-llama3-8b=90 models/vllm-llama3-8b-spot=10"
	}, "the queue's breach moves weight on the InferencePool route")
	st := poolState(t, svc, mainPool)
	if !st.Breached || !strings.Contains(st.Why, "queue depth") {
		t.Errorf("the pool is not breached by its queue: %+v", st)
	}
	// The chart's Roles are enough (above) and no more: the named pools
	// only, read only, pods only where a followed pool lives.
	kubeSA := c.kubeAs(t, llmNS, sa)
	dynSA := dynamic.NewForConfigOrDie(c.tokenConfig(t, llmNS, sa))
	forbidden(t, "read another InferencePool", func() error {
		_, err := dynSA.Resource(inferencePools).Namespace(llmNS).Get(t.Context(), "other", metav1.GetOptions{})
		return err
	})
	forbidden(t, "update its InferencePool", func() error {
		_, err := dynSA.Resource(inferencePools).Namespace(llmNS).Update(t.Context(), c.get(t, c.dyn.Resource(inferencePools).Namespace(llmNS), mainPool), metav1.UpdateOptions{})
		return err
	})
	forbidden(t, "list pods where no followed pool is", func() error {
		_, err := kubeSA.CoreV1().Pods(egNamespace).List(t.Context(), metav1.ListOptions{})
		return err
	})
	forbidden(t, "change a pod", func() error {
		_, err := kubeSA.CoreV1().Pods(llmNS).UpdateStatus(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: mainPool + "-0"}}, metav1.UpdateOptions{})
		return err
	})
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the controller logged errors:\n%s", logs.String())
	}
}

// holdQueue sends the model server one request that runs and n that wait,
// each held until the test ends, and waits until its metrics say so.
func holdQueue(t *testing.T, s *modelServer, n int) {
	t.Helper()
	cfg := s.mock.Config()
	cfg.MaxBatch, cfg.TTFT = 1, time.Hour
	s.mock.SetConfig(cfg)
	for range n + 1 {
		go func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+s.addr()+"/v1/chat/completions",
				strings.NewReader(chatRequest("hold")))
			req.Header.Set("content-type", "application/json")
			// The mock answers the headers at once: reading the body holds
			// the request (closing it would end it) until the test ends.
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	url := "http://" + s.addr() + "/metrics"
	testutil.Eventually(t, 30*time.Second, func() bool {
		l, err := loadsignal.Scrape(t.Context(), http.DefaultClient, []string{url})
		return err == nil && l.Running == 1 && l.Waiting == float64(n)
	}, fmt.Sprintf("%s: 1 running, %d waiting", s.ip, n))
}

// createPodOf stores a Pod labelled app: app, with the status a kubelet
// would give it: Running, Ready, at ip.
func (c *cluster) createPodOf(t *testing.T, ns, app, name, ip string) {
	t.Helper()
	pods := c.kube.CoreV1().Pods(ns)
	pod, err := pods.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if _, err := pods.UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("pod %s status: %v", name, err)
	}
	c.setPodReady(t, ns, name, true)
}

// setPodReady sets the pod's Ready condition, as a kubelet does when its
// readiness probe passes or fails.
func (c *cluster) setPodReady(t *testing.T, ns, name string, ready bool) {
	t.Helper()
	pods := c.kube.CoreV1().Pods(ns)
	pod, err := pods.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	if _, err := pods.UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("pod %s ready=%v: %v", name, ready, err)
	}
}

// poolState is the pool as the controller judged it at its last tick
// (its /debug/controller page, as JSON).
func poolState(t *testing.T, svc *routing.Service, pool string) controller.PoolStats {
	t.Helper()
	rec := httptest.NewRecorder()
	svc.DebugHandler(rec, httptest.NewRequest(http.MethodGet, "/debug/controller?format=json", nil))
	var states []controller.ModelState
	if err := json.Unmarshal(rec.Body.Bytes(), &states); err != nil || len(states) != 1 {
		t.Fatalf("/debug/controller: %v\n%s", err, rec.Body)
	}
	st, ok := states[0].Pools[pool]
	if !ok {
		return controller.PoolStats{QueueDepth: -2} // not judged yet
	}
	return st
}

// poolRefWeights lists the first rule's InferencePool backendRefs as
// "namespace/name=weight ..." (the route's namespace when a ref has none).
func poolRefWeights(route *unstructured.Unstructured) string {
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	var s []string
	for _, ref := range rules[0].(map[string]any)["backendRefs"].([]any) {
		r := ref.(map[string]any)
		ns, _ := r["namespace"].(string)
		if ns == "" {
			ns = route.GetNamespace()
		}
		if r["kind"] != "InferencePool" {
			continue
		}
		s = append(s, ns+"/"+fmt.Sprint(r["name"])+"="+strconv.FormatInt(r["weight"].(int64), 10))
	}
	return strings.Join(s, " ")
}

var inferencePools = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// syncLog is a log destination safe for the controller's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
