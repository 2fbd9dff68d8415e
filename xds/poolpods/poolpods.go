// Package poolpods follows the model-server pods of a Gateway API Inference
// Extension InferencePool through the Kubernetes API, for the SLA
// controller's queue-depth scrape: the same pods, ports and metrics the
// pool's Endpoint Picker reads. The pool's selector and target ports are
// read once, at start; an informer on the pods of the pool's namespace that
// match the selector keeps the ready ones (its cache holds only those pods,
// trimmed to name, IP and readiness). The scrape asks for the URLs each
// time: a pod that stops being ready or goes away drops out, a new one
// joins, without a restart.
package poolpods

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Pool names an InferencePool and where its servers publish their metrics.
type Pool struct {
	Namespace, Name string
	// MetricsPath is the model servers' Prometheus path; "" is /metrics.
	MetricsPath string
}

func (p Pool) String() string { return "inferencepool " + p.Namespace + "/" + p.Name }

// The resources read.
var (
	inferencePools = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	pods           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// maxPorts is the InferencePool CRD's bound on targetPorts.
const maxPorts = 8

// Follower keeps an InferencePool's ready pods.
type Follower struct {
	pool  Pool
	path  string
	ports []int
	store cache.Store
	ctl   cache.Controller
}

// New reads the pool's selector and target ports, so a wrong name or a
// missing permission fails at start. Nothing is watched until Run.
func New(ctx context.Context, client dynamic.Interface, p Pool) (*Follower, error) {
	obj, err := client.Resource(inferencePools).Namespace(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: %w", p, err)
	}
	sel, ports, err := spec(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	f := &Follower{pool: p, path: p.MetricsPath, ports: ports}
	if f.path == "" {
		f.path = "/metrics"
	}
	api := client.Resource(pods).Namespace(p.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return api.Watch(ctx, o)
		},
	}
	f.store, f.ctl = cache.NewInformerWithOptions(cache.InformerOptions{
		// A fake client says it cannot stream the initial list.
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, client),
		ObjectType:    &unstructured.Unstructured{},
		Handler:       cache.ResourceEventHandlerFuncs{},
		Transform:     trim,
	})
	return f, nil
}

// spec reads an InferencePool's label selector and target ports.
func spec(obj *unstructured.Unstructured) (selector string, ports []int, _ error) {
	match, _, err := unstructured.NestedStringMap(obj.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return "", nil, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if len(match) == 0 {
		// An empty selector would follow every pod of the namespace.
		return "", nil, errors.New("spec.selector.matchLabels is empty")
	}
	sel, err := labels.ValidatedSelectorFromSet(match)
	if err != nil {
		return "", nil, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	list, _, err := unstructured.NestedSlice(obj.Object, "spec", "targetPorts")
	if err != nil || len(list) == 0 || len(list) > maxPorts {
		return "", nil, fmt.Errorf("spec.targetPorts: want 1 to %d ports (%v)", maxPorts, err)
	}
	for _, tp := range list {
		m, _ := tp.(map[string]any)
		n, ok := m["number"].(int64)
		if !ok || n < 1 || n > 65535 {
			return "", nil, fmt.Errorf("spec.targetPorts: %v is not a port number", m["number"])
		}
		ports = append(ports, int(n))
	}
	return sel.String(), ports, nil
}

// Run follows the pods until ctx is done.
func (f *Follower) Run(ctx context.Context) { f.ctl.RunWithContext(ctx) }

// URLs are the metrics URLs of the pool's ready pods, one per target port
// (the Endpoint Picker counts each port as an endpoint), sorted.
func (f *Follower) URLs() []string {
	var out []string
	for _, obj := range f.store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		ip, ok := readyIP(u)
		if !ok {
			continue
		}
		for _, port := range f.ports {
			out = append(out, "http://"+net.JoinHostPort(ip, strconv.Itoa(port))+f.path)
		}
	}
	slices.Sort(out)
	return out
}

// readyIP is a pod's IP when it serves: Ready, not being deleted (the
// Endpoint Picker's rule), with an IP.
func readyIP(pod *unstructured.Unstructured) (string, bool) {
	if pod.GetDeletionTimestamp() != nil {
		return "", false
	}
	ip, _, _ := unstructured.NestedString(pod.Object, "status", "podIP")
	if _, err := netip.ParseAddr(ip); err != nil {
		return "", false
	}
	conds, _, _ := unstructured.NestedSlice(pod.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return ip, true
		}
	}
	return "", false
}

// trim keeps what readyIP reads, so the cache holds a few fields per pod
// instead of whole pods. It is idempotent, as informers require.
func trim(obj any) (any, error) {
	pod, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // a tombstone of a deleted pod
	}
	md := map[string]any{"name": pod.GetName(), "namespace": pod.GetNamespace(), "resourceVersion": pod.GetResourceVersion(), "uid": string(pod.GetUID())}
	if ts, ok, _ := unstructured.NestedString(pod.Object, "metadata", "deletionTimestamp"); ok {
		md["deletionTimestamp"] = ts
	}
	status := map[string]any{}
	if ip, ok, _ := unstructured.NestedString(pod.Object, "status", "podIP"); ok {
		status["podIP"] = ip
	}
	conds, _, _ := unstructured.NestedSlice(pod.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Ready" {
			status["conditions"] = []any{map[string]any{"type": "Ready", "status": m["status"]}}
			break
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": md, "status": status,
	}}, nil
}

// WaitSynced waits until the pods have been listed once, or ctx is done;
// it reports whether they were.
func (f *Follower) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), f.ctl.HasSynced)
}
