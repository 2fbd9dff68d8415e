package kube

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/xds/weightsink"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

var (
	httpRoutes      = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	virtualServices = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
)

// The SLA controller's HTTPRoute sink against the real API server, as the
// chart's service account with the chart's Role: it sets the weights on
// the chart's own route, converges through resourceVersion conflicts, and
// may touch nothing else.
func TestHTTPRouteSinkAsTheChartsServiceAccount(t *testing.T) {
	c := startCluster(t)
	const ns = "llm"
	for _, n := range []string{ns, "envoy-gateway-system"} {
		c.createNamespace(t, n)
	}
	vals := chartVariantNamed(t, "scaled, Envoy Gateway, TLS from a Secret")
	rel, err := c.helmInstall(t, ns, "infergate", vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	sa := c.serviceAccountOf(t, rel.Manifest)
	var puts atomic.Int32
	var beforePut func()
	cfg := c.tokenConfig(t, ns, sa)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut {
				if puts.Add(1) == 1 && beforePut != nil {
					beforePut()
				}
			}
			return rt.RoundTrip(r)
		})
	})
	kube, err := weightsink.NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sink := &weightsink.HTTPRoute{Kube: kube, Namespace: ns, Name: "infergate"}
	if err := sink.Load(t.Context()); err != nil {
		t.Fatalf("load as %s: %v", sa, err)
	}
	if got := sink.Resolve("httproute/llm/infergate/rule/0/backend/1"); got != "vllm-h100" {
		t.Errorf("Envoy Gateway's locality resolves to %q, want vllm-h100", got)
	}

	// A writer that gets in between the sink's read and its write: the real
	// storage refuses the sink's stale resourceVersion (409), the sink reads
	// again, and the other writer's change survives.
	admin := c.dyn.Resource(httpRoutes).Namespace(ns)
	beforePut = func() { annotate(t, admin, "infergate", "other-writer", "1") }
	if err := sink.Apply(t.Context(), map[string]map[string]uint32{"llama-3-70b": {"vllm-a100": 30, "vllm-h100": 70}}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	route := c.get(t, admin, "infergate")
	if w := backendWeights(route, 0); w != "vllm-a100=30 vllm-h100=70" {
		t.Errorf("weights %s after a conflict", w)
	}
	if route.GetAnnotations()["other-writer"] != "1" || puts.Load() != 2 {
		t.Errorf("the conflicting write was lost or not retried: annotations %v, %d PUTs", route.GetAnnotations(), puts.Load())
	}

	// Writers racing the sink, as a gateway controller writing the route's
	// status does (each write moves the resourceVersion), only much busier:
	// two writers, 5-15 ms apart each. Every apply lands, no write is lost.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var writes atomic.Int32
	for i := range 2 {
		wg.Go(func() { writes.Add(raceWriter(t.Context(), admin, "infergate", fmt.Sprintf("writer-%d", i), stop)) })
	}
	for i := range 20 {
		time.Sleep(20 * time.Millisecond)
		a := uint32(5 * i)
		if err := sink.Apply(t.Context(), map[string]map[string]uint32{"llama-3-70b": {"vllm-a100": a, "vllm-h100": 100 - a}}); err != nil {
			t.Errorf("apply %d with writers racing: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	route = c.get(t, admin, "infergate")
	if w := backendWeights(route, 0); w != "vllm-a100=95 vllm-h100=5" {
		t.Errorf("weights %s after racing writers, want the last apply's", w)
	}
	if route.GetAnnotations()["other-writer"] != "1" {
		t.Error("a racing apply dropped another writer's change")
	}
	retried := puts.Load() - 21
	t.Logf("%d sink writes (%d after a conflict) among %d racing writes", puts.Load(), retried, writes.Load())
	if retried == 1 {
		t.Error("no apply met a conflict: the racing writers did not race")
	}

	// helm upgrade merges three ways: a changed value elsewhere leaves the
	// weights the controller set.
	vals["config"].(map[string]any)["log"] = map[string]any{"level": "debug"}
	if _, err := c.helmUpgrade(t, ns, "infergate", vals); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	if w := backendWeights(c.get(t, admin, "infergate"), 0); w != "vllm-a100=95 vllm-h100=5" {
		t.Errorf("helm upgrade reset the controller's weights: %s", w)
	}

	// The Role is enough (above) and no more.
	other := routeObject(ns, "other")
	if err := c.apply(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	otherSink := &weightsink.HTTPRoute{Kube: kube, Namespace: ns, Name: "other"}
	if err := otherSink.Load(t.Context()); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "httproute llm/other") {
		t.Errorf("another route's load: %v, want forbidden, naming the route", err)
	}
	asSA := dynamic.NewForConfigOrDie(c.tokenConfig(t, ns, sa))
	forbidden(t, "list routes", func() error {
		_, err := asSA.Resource(httpRoutes).Namespace(ns).List(t.Context(), metav1.ListOptions{})
		return err
	})
	forbidden(t, "update another route", func() error {
		_, err := asSA.Resource(httpRoutes).Namespace(ns).Update(t.Context(), c.get(t, admin, "other"), metav1.UpdateOptions{})
		return err
	})
	forbidden(t, "create a route", func() error {
		_, err := asSA.Resource(httpRoutes).Namespace(ns).Create(t.Context(), routeObject(ns, "new"), metav1.CreateOptions{})
		return err
	})
	forbidden(t, "delete its route", func() error {
		return asSA.Resource(httpRoutes).Namespace(ns).Delete(t.Context(), "infergate", metav1.DeleteOptions{})
	})
	forbidden(t, "patch its route", func() error {
		_, err := asSA.Resource(httpRoutes).Namespace(ns).Patch(t.Context(), "infergate", "application/merge-patch+json", []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		return err
	})
	forbidden(t, "read a Secret", func() error {
		_, err := c.kubeAs(t, ns, sa).CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{})
		return err
	})
	forbidden(t, "update the route in another namespace", func() error {
		_, err := asSA.Resource(httpRoutes).Namespace("envoy-gateway-system").Get(t.Context(), "infergate", metav1.GetOptions{})
		return err
	})
}

// The VirtualService sink, the same way (Istio).
func TestVirtualServiceSinkAsTheChartsServiceAccount(t *testing.T) {
	c := startCluster(t)
	const ns = "llm"
	for _, n := range []string{ns, "istio-system", "models"} {
		c.createNamespace(t, n)
	}
	rel, err := c.helmInstall(t, ns, "infergate", chartVariantNamed(t, "scaled, Istio, VirtualService weights"))
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	sa := c.serviceAccountOf(t, rel.Manifest)
	for _, name := range []string{"llama", "other"} {
		if err := c.apply(t.Context(), virtualServiceObject(ns, name)); err != nil {
			t.Fatal(err)
		}
	}
	kube, err := weightsink.NewKube(c.tokenConfig(t, ns, sa))
	if err != nil {
		t.Fatal(err)
	}
	sink := &weightsink.VirtualService{Kube: kube, Namespace: ns, Name: "llama"}
	if err := sink.Load(t.Context()); err != nil {
		t.Fatalf("load as %s: %v", sa, err)
	}
	admin := c.dyn.Resource(virtualServices).Namespace(ns)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 2 {
		wg.Go(func() { raceWriter(t.Context(), admin, "llama", fmt.Sprintf("writer-%d", i), stop) })
	}
	for i := range 10 {
		a := uint32(10 * i)
		if err := sink.Apply(t.Context(), map[string]map[string]uint32{"llama-3-70b": {"vllm-a.models.svc.cluster.local": a, "vllm-b.models.svc.cluster.local": 100 - a}}); err != nil {
			t.Errorf("apply %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	route, _, _ := unstructured.NestedSlice(c.get(t, admin, "llama").Object, "spec", "http")
	var got []string
	for _, d := range route[0].(map[string]any)["route"].([]any) {
		got = append(got, fmt.Sprint(d.(map[string]any)["weight"]))
	}
	if strings.Join(got, " ") != "90 10" {
		t.Errorf("weights %v, want the last apply's 90 10", got)
	}
	other := &weightsink.VirtualService{Kube: kube, Namespace: ns, Name: "other"}
	if err := other.Apply(t.Context(), map[string]map[string]uint32{"llama-3-70b": {"vllm-a.models.svc.cluster.local": 0, "vllm-b.models.svc.cluster.local": 100}}); !apierrors.IsForbidden(err) {
		t.Errorf("another VirtualService: %v, want forbidden", err)
	}
}

func chartVariantNamed(t *testing.T, name string) map[string]any {
	t.Helper()
	for _, v := range chartVariants(t) {
		if v.name == name {
			return v.vals
		}
	}
	t.Fatalf("no chart variant %q", name)
	return nil
}

// serviceAccountOf is the subject the chart's weights RoleBinding grants.
func (c *cluster) serviceAccountOf(t *testing.T, manifest string) string {
	t.Helper()
	for _, obj := range decodeObjects(t, []byte(manifest)) {
		if obj.GetKind() == "RoleBinding" && strings.HasSuffix(obj.GetName(), "-weights") {
			subjects, _, _ := unstructured.NestedSlice(obj.Object, "subjects")
			if len(subjects) == 1 {
				return subjects[0].(map[string]any)["name"].(string)
			}
		}
	}
	t.Fatal("the chart rendered no weights RoleBinding with one subject")
	return ""
}

// tokenConfig is a client configuration authenticated as the service
// account, with a token from the TokenRequest API (what the kubelet
// projects into the pod).
func (c *cluster) tokenConfig(t *testing.T, ns, sa string) *rest.Config {
	t.Helper()
	expiry := int64(600)
	tok, err := c.kube.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, sa, err)
	}
	return &rest.Config{Host: c.admin.Host, BearerToken: tok.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.admin.CAData, ServerName: c.admin.ServerName}}
}

func (c *cluster) kubeAs(t *testing.T, ns, sa string) kubernetes.Interface {
	t.Helper()
	return kubernetes.NewForConfigOrDie(c.tokenConfig(t, ns, sa))
}

func (c *cluster) get(t *testing.T, ri dynamic.ResourceInterface, name string) *unstructured.Unstructured {
	t.Helper()
	obj, err := ri.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func forbidden(t *testing.T, what string, call func() error) {
	t.Helper()
	if err := call(); !apierrors.IsForbidden(err) {
		t.Errorf("%s as the controller: %v, want forbidden", what, err)
	}
}

func annotate(t *testing.T, ri dynamic.ResourceInterface, name, key, value string) {
	t.Helper()
	if err := annotateRetry(t.Context(), ri, name, key, value); err != nil {
		t.Error(err)
	}
}

// raceWriter annotates the object every 5-15 ms until stop, and returns
// how many writes landed.
func raceWriter(ctx context.Context, ri dynamic.ResourceInterface, name, key string, stop chan struct{}) int32 {
	var n int32
	for {
		select {
		case <-stop:
			return n
		case <-time.After(time.Duration(5+rand.IntN(10)) * time.Millisecond):
		}
		if annotateRetry(ctx, ri, name, key, fmt.Sprint(n)) == nil {
			n++
		}
	}
}

// annotateRetry is another writer: read, change an annotation, replace.
func annotateRetry(ctx context.Context, ri dynamic.ResourceInterface, name, key, value string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		a := obj.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[key] = value
		obj.SetAnnotations(a)
		_, err = ri.Update(ctx, obj, metav1.UpdateOptions{})
		return err
	})
}

// backendWeights lists rule i's backendRefs as "name=weight ...".
func backendWeights(route *unstructured.Unstructured, i int) string {
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	var s []string
	for _, ref := range rules[i].(map[string]any)["backendRefs"].([]any) {
		r := ref.(map[string]any)
		s = append(s, fmt.Sprintf("%v=%v", r["name"], r["weight"]))
	}
	return strings.Join(s, " ")
}

func routeObject(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"rules": []any{map[string]any{
			"matches":     []any{map[string]any{"headers": []any{map[string]any{"name": "x-infergate-model", "value": "llama-3-70b"}}}},
			"backendRefs": []any{map[string]any{"name": "vllm-a100", "port": int64(8000), "weight": int64(100)}},
		}}},
	}}
}

func virtualServiceObject(ns, name string) *unstructured.Unstructured {
	dest := func(host string, weight int64) any {
		return map[string]any{"destination": map[string]any{"host": host}, "weight": weight}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"hosts": []any{"llm.example.com"}, "http": []any{
			map[string]any{
				"match": []any{map[string]any{"headers": map[string]any{"x-infergate-model": map[string]any{"exact": "llama-3-70b"}}}},
				"route": []any{dest("vllm-a.models.svc.cluster.local", 100), dest("vllm-b.models.svc.cluster.local", 0)},
			},
			map[string]any{"route": []any{dest("vllm-a.models.svc.cluster.local", 100)}},
		}},
	}}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// GitOps tools may apply server-side. The weights live in HTTPRoute's
// rules, an atomic list: once the controller has written them it owns all
// the rules, so re-applying the chart's route conflicts (naming the
// controller), and a forced apply puts the chart's weights back until the
// controller's next change. The README tells GitOps users to ignore the
// weights.
func TestServerSideApplyMeetsTheController(t *testing.T) {
	c := startCluster(t)
	const ns = "llm"
	for _, n := range []string{ns, "envoy-gateway-system"} {
		c.createNamespace(t, n)
	}
	manifest, err := c.helmRender(t, ns, "infergate", chartVariantNamed(t, "scaled, Envoy Gateway, TLS from a Secret"))
	if err != nil {
		t.Fatal(err)
	}
	var route *unstructured.Unstructured
	for _, obj := range decodeObjects(t, []byte(manifest)) {
		if obj.GetKind() == "HTTPRoute" {
			route = obj
		}
	}
	if route == nil {
		t.Fatal("the chart rendered no HTTPRoute")
	}
	route.SetNamespace(ns)
	body, err := route.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	routes := c.dyn.Resource(httpRoutes).Namespace(ns)
	gitops := func(force bool) error {
		_, err := routes.Patch(t.Context(), route.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "gitops", Force: &force})
		return err
	}
	if err := gitops(false); err != nil {
		t.Fatalf("server-side apply of the chart's route: %v", err)
	}
	kube, err := weightsink.NewKube(c.admin)
	if err != nil {
		t.Fatal(err)
	}
	sink := &weightsink.HTTPRoute{Kube: kube, Namespace: ns, Name: route.GetName()}
	if err := sink.Apply(t.Context(), map[string]map[string]uint32{"llama-3-70b": {"vllm-a100": 30, "vllm-h100": 70}}); err != nil {
		t.Fatal(err)
	}
	err = gitops(false)
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "infergate-controller") || !strings.Contains(err.Error(), ".spec.rules") {
		t.Errorf("re-applying after the controller: %v, want a conflict over .spec.rules naming infergate-controller", err)
	}
	if w := backendWeights(c.get(t, routes, route.GetName()), 0); w != "vllm-a100=30 vllm-h100=70" {
		t.Errorf("a refused apply changed the weights: %s", w)
	}
	if err := gitops(true); err != nil {
		t.Fatal(err)
	}
	if w := backendWeights(c.get(t, routes, route.GetName()), 0); w != "vllm-a100=80 vllm-h100=20" {
		t.Errorf("a forced apply: weights %s, want the chart's 80/20 back", w)
	}
}
