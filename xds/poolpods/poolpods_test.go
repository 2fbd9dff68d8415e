package poolpods

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/infergate/infergate/internal/testutil"
)

func inferencePool(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
}

func pod(name, ip, ready string) *unstructured.Unstructured {
	status := map[string]any{"phase": "Running"}
	if ip != "" {
		status["podIP"] = ip
	}
	if ready != "" {
		status["conditions"] = []any{
			map[string]any{"type": "PodScheduled", "status": "True"},
			map[string]any{"type": "Ready", "status": ready},
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "models", "labels": map[string]any{"app": "vllm"}},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "vllm", "image": "vllm/vllm-openai", "env": []any{map[string]any{"name": "X", "value": strings.Repeat("x", 1000)}}}}},
		"status":   status,
	}}
}

func TestSpec(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      map[string]any
		sel, err  string
		wantPorts []int
	}{
		{name: "two ports", spec: map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm", "tier": "a"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}},
		}, sel: "app=vllm,tier=a", wantPorts: []int{8000, 8001}},
		{name: "no selector", spec: map[string]any{
			"targetPorts": []any{map[string]any{"number": int64(8000)}},
		}, err: "matchLabels is empty"},
		{name: "no ports", spec: map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
		}, err: "spec.targetPorts"},
		{name: "port out of range", spec: map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts": []any{map[string]any{"number": int64(70000)}},
		}, err: "70000 is not a port number"},
		{name: "port not a number", spec: map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts": []any{map[string]any{"number": "8000"}},
		}, err: "not a port number"},
		{name: "bad label value", spec: map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "a,b=c"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}},
		}, err: "matchLabels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel, ports, err := spec(inferencePool("models", "p", tc.spec))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || sel != tc.sel || !slices.Equal(ports, tc.wantPorts) {
				t.Fatalf("spec: %q %v %v, want %q %v", sel, ports, err, tc.sel, tc.wantPorts)
			}
		})
	}
}

// A pod serves when Ready, not being deleted, with an IP; trim keeps
// exactly what decides that, and trimming twice changes nothing.
func TestReadyIP(t *testing.T) {
	deleting := pod("d", "10.0.0.9", "True")
	deleting.SetDeletionTimestamp(&metav1.Time{Time: time.Unix(1, 0)})
	for _, tc := range []struct {
		pod  *unstructured.Unstructured
		want string
	}{
		{pod("a", "10.0.0.7", "True"), "10.0.0.7"},
		{pod("b", "fd00::7", "True"), "fd00::7"},
		{pod("c", "10.0.0.8", "False"), ""},
		{pod("e", "", "True"), ""},          // scheduled, no IP yet
		{pod("f", "10.0.0.10", ""), ""},     // no Ready condition
		{pod("g", "not-an-ip", "True"), ""}, // never trusted into a URL
		{deleting, ""},
	} {
		trimmed, _ := trim(tc.pod)
		again, _ := trim(trimmed)
		for _, p := range []*unstructured.Unstructured{tc.pod, trimmed.(*unstructured.Unstructured), again.(*unstructured.Unstructured)} {
			ip, ok := readyIP(p)
			if ip != tc.want || ok != (tc.want != "") {
				t.Errorf("pod %s: %q %v, want %q", tc.pod.GetName(), ip, ok, tc.want)
			}
		}
		if _, ok := trimmed.(*unstructured.Unstructured).Object["spec"]; ok {
			t.Errorf("pod %s: trimmed pod keeps its spec", tc.pod.GetName())
		}
	}
}

// Through an informer on a fake API: the URLs follow pods that join,
// become NotReady and go away.
func TestFollowerFollows(t *testing.T) {
	scheme := runtime.NewScheme()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{pods: "PodList", inferencePools: "InferencePoolList"},
		inferencePool("models", "vllm", map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}},
		}),
		pod("a", "10.0.0.7", "True"), pod("b", "10.0.0.8", "False"))
	if _, err := New(t.Context(), client, Pool{Namespace: "models", Name: "missing"}); err == nil || !strings.Contains(err.Error(), "inferencepool models/missing") {
		t.Fatalf("a missing pool: %v", err)
	}
	f, err := New(t.Context(), client, Pool{Namespace: "models", Name: "vllm", MetricsPath: "/vllm/metrics"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go f.Run(ctx)
	if !f.WaitSynced(ctx) {
		t.Fatal("never synced")
	}
	want := func(what string, urls ...string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.URLs(), urls) }, what)
	}
	want("the ready pod, both ports", "http://10.0.0.7:8000/vllm/metrics", "http://10.0.0.7:8001/vllm/metrics")

	api := client.Resource(pods).Namespace("models")
	if _, err := api.Create(ctx, pod("c", "10.0.0.9", "True"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a new pod joins", "http://10.0.0.7:8000/vllm/metrics", "http://10.0.0.7:8001/vllm/metrics",
		"http://10.0.0.9:8000/vllm/metrics", "http://10.0.0.9:8001/vllm/metrics")
	if _, err := api.Update(ctx, pod("a", "10.0.0.7", "False"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a NotReady pod drops out", "http://10.0.0.9:8000/vllm/metrics", "http://10.0.0.9:8001/vllm/metrics")
	if err := api.Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("no ready pod: no URL")
}
