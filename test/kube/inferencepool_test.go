package kube

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/infergate/infergate/internal/testutil"
)

// The chart's InferencePool route, for real: the API server (with the
// Inference Extension's v1.4.0 CRDs) accepts the InferencePools it names,
// the InferenceObjectives the example policies send (sheddable, critical),
// the ReferenceGrant a pool in another namespace needs, and, strictly
// validated, the chart's HTTPRoute with its weighted InferencePool
// backendRefs. Envoy Gateway v1.9.1 in Kubernetes mode then accepts the
// route and reports its InferencePool references unresolved (InvalidKind):
// it routes to an InferencePool only through an extension server that
// declares the kind (extensionManager.backendResources).
func TestChartInferencePoolRoute(t *testing.T) {
	c := startCluster(t)
	for _, ns := range []string{llmNS, "models", egNamespace} {
		c.createNamespace(t, ns)
	}
	pool := func(ns, name string) string {
		return fmt.Sprintf(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: %[2]s}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: %[2]s-epp, port: {number: 9002}}
`, ns, name)
	}
	objective := func(ns, name, pool string, priority int) string {
		return fmt.Sprintf(`
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: %s, namespace: %s}
spec: {priority: %d, poolRef: {name: %s}}
`, name, ns, priority, pool)
	}
	applyYAML(t, c, strings.Join([]string{
		pool(llmNS, "vllm-llama3-8b"), pool("models", "vllm-llama3-8b-spot"), pool(llmNS, "vllm-llama3-70b"),
		objective(llmNS, "sheddable", "vllm-llama3-8b", -1), objective(llmNS, "critical", "vllm-llama3-8b", 10),
		fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: infergate-routes, namespace: models}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: %s}]
  to: [{group: inference.networking.k8s.io, kind: InferencePool}]
`, llmNS),
	}, "\n---\n"))

	startEnvoyGateway(t, c)
	applyGateway(t, c, freePort(t))

	vals := ciValues(t, "inferencepools")
	rendered, err := c.helmRender(t, llmNS, relName, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	route := find(t, decodeObjects(t, []byte(rendered)), "HTTPRoute", relName+"-inference")
	ri, err := c.resource(route)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ri.Create(t.Context(), route.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
		t.Fatalf("the InferencePool route refused with strict field validation: %v", err)
	}
	if _, err := c.helmInstall(t, llmNS, relName, vals); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	routes := c.dyn.Resource(schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}).Namespace(llmNS)
	stored, err := routes.Get(t.Context(), relName+"-inference", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, rule := range nested[[]any](stored.Object, "spec", "rules") {
		for _, ref := range nested[[]any](rule.(map[string]any), "backendRefs") {
			r := ref.(map[string]any)
			refs = append(refs, fmt.Sprintf("%v/%v %v/%v %v", r["group"], r["kind"], r["namespace"], r["name"], r["weight"]))
		}
	}
	want := []string{
		"inference.networking.k8s.io/InferencePool <nil>/vllm-llama3-8b 90",
		"inference.networking.k8s.io/InferencePool models/vllm-llama3-8b-spot 10",
		"inference.networking.k8s.io/InferencePool <nil>/vllm-llama3-70b 100",
	}
	if strings.Join(refs, "; ") != strings.Join(want, "; ") {
		t.Errorf("stored backendRefs:\n%s\nwant:\n%s", strings.Join(refs, "\n"), strings.Join(want, "\n"))
	}

	// Envoy Gateway's verdict, in the route's status.
	var conds map[string]string
	testutil.Eventually(t, time.Minute, func() bool {
		r, err := routes.Get(t.Context(), relName+"-inference", metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds = map[string]string{}
		for _, p := range nested[[]any](r.Object, "status", "parents") {
			for _, c := range nested[[]any](p.(map[string]any), "conditions") {
				c := c.(map[string]any)
				conds[fmt.Sprint(c["type"])] = fmt.Sprintf("%v/%v: %v", c["status"], c["reason"], c["message"])
			}
		}
		return conds["Accepted"] != "" && conds["ResolvedRefs"] != ""
	}, "Envoy Gateway's verdict on the InferencePool route")
	t.Logf("Envoy Gateway on the InferencePool route: %v", conds)
	if !strings.HasPrefix(conds["Accepted"], "True/Accepted") || !strings.HasPrefix(conds["ResolvedRefs"], "False/InvalidKind") {
		t.Errorf("conditions %v; want Accepted, and the InferencePool refs InvalidKind", conds)
	}
}
