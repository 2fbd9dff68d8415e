package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/release"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
)

// The chart's variants, installed for real: every object accepted by the
// API server (the CRDs' OpenAPI schemas and CEL rules, RBAC's escalation
// check, built-in validation), upgraded with a changed value, and
// uninstalled without a trace.
func TestChartInstallUpgradeUninstall(t *testing.T) {
	c := startCluster(t)
	const ns = "llm"
	// The namespaces the variants' objects reach into exist in a user's
	// cluster: Envoy Gateway's, Istio's and the model servers'.
	for _, n := range []string{ns, "envoy-gateway-system", "istio-system", "models"} {
		c.createNamespace(t, n)
	}
	for _, v := range chartVariants(t) {
		t.Run(v.name, func(t *testing.T) {
			before := c.snapshot(t)
			// Helm does not ask for strict field validation, so the API
			// server would drop a field the schema lacks (a CRD prunes it)
			// with only a warning: each object is first sent strictly.
			rendered, err := c.helmRender(t, ns, "infergate", v.vals)
			if err != nil {
				t.Fatalf("helm template: %q", err)
			}
			for _, obj := range decodeObjects(t, []byte(rendered)) {
				if obj.GetNamespace() == "" && c.namespaced(t, obj) {
					obj.SetNamespace(ns)
				}
				ri, err := c.resource(obj)
				if err != nil {
					t.Fatal(err)
				}
				_, err = ri.Create(t.Context(), obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
				if err != nil {
					t.Errorf("%s %s refused with strict field validation: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
			rel, err := c.helmInstall(t, ns, "infergate", v.vals)
			t.Cleanup(func() { // a failed release, or the ledger's kept claim, blocks the next
				_ = c.helmUninstall(t, ns, "infergate")
				c.deleteClaim(ns, "infergate-ledger")
			})
			if err != nil {
				t.Fatalf("helm install: %q", err)
			}
			objs := decodeObjects(t, []byte(rel.Manifest))
			for _, obj := range objs {
				ri, err := c.resource(obj)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ri.Get(t.Context(), obj.GetName(), metav1.GetOptions{}); err != nil {
					t.Errorf("%s %s not in the API after install: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
			t.Logf("%d objects installed: %s", len(objs), kindsOf(objs))
			if w := apiWarnings.take(); len(w) > 0 {
				t.Errorf("the API server warned on install: %q", w)
			}

			// A changed value reaches the cluster: the log level in the
			// config, and the pods' checksum annotation that rolls them.
			vals := maps.Clone(v.vals)
			cfg, _ := vals["config"].(map[string]any)
			cfg = maps.Clone(cfg)
			if cfg == nil {
				cfg = map[string]any{}
			}
			cfg["log"] = map[string]any{"level": "debug"}
			vals["config"] = cfg
			checksum := c.configChecksum(t, ns)
			up, err := c.helmUpgrade(t, ns, "infergate", vals)
			if err != nil {
				t.Fatalf("helm upgrade: %v", err)
			}
			if w := apiWarnings.take(); len(w) > 0 {
				t.Errorf("the API server warned on upgrade: %q", w)
			}
			if up.Version != 2 || up.Info.Status != release.StatusDeployed {
				t.Errorf("upgrade: revision %d, %s", up.Version, up.Info.Status)
			}
			cm, err := c.kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "infergate-config", metav1.GetOptions{})
			if err != nil || !strings.Contains(cm.Data["config.yaml"], "level: debug") {
				t.Errorf("the upgraded config is not in the cluster (%v):\n%s", err, cm.Data["config.yaml"])
			}
			if after := c.configChecksum(t, ns); after == checksum {
				t.Errorf("the pods' config checksum did not change on upgrade (%q)", after)
			}

			if err := c.helmUninstall(t, ns, "infergate"); err != nil {
				t.Fatalf("helm uninstall: %v", err)
			}
			// The ledger's claim outlives the release by design
			// (helm.sh/resource-policy: keep: an uninstall must not forget
			// the money); nothing else does (the cleanup deletes it, as an
			// operator would, for the next variant).
			left := slices.DeleteFunc(diffSnapshots(before, c.snapshot(t)), func(k string) bool {
				return k == "persistentvolumeclaims "+ns+"/infergate-ledger"
			})
			if len(left) > 0 {
				t.Errorf("helm uninstall left %d objects behind: %v", len(left), left)
			}
		})
	}
}

// Values the chart refuses never reach the API server: no object, no
// release record.
func TestChartRefusesBadValuesBeforeTheAPI(t *testing.T) {
	c := startCluster(t)
	const ns = "llm"
	c.createNamespace(t, ns)
	before := c.snapshot(t)
	for name, vals := range map[string]map[string]any{
		"schema: a typo":                             {"serviceMonitr": map[string]any{"enabled": true}},
		"schema: an unknown mode":                    {"mode": "split"},
		"template: scaled, no Redis":                 {"mode": "scaled"},
		"template: istio sidecar without a selector": {"istio": map[string]any{"enabled": true, "sidecar": map[string]any{"enabled": true}}},
	} {
		if _, err := c.helmInstall(t, ns, "infergate", vals); err == nil {
			t.Errorf("%s: installed", name)
		}
	}
	if left := diffSnapshots(before, c.snapshot(t)); len(left) > 0 {
		t.Errorf("refused installs wrote %d objects: %v", len(left), left)
	}
}

type chartVariant struct {
	name string
	vals map[string]any
}

// chartVariants are the chart's ci values (the variants it promises) and
// combinations they do not cover.
func chartVariants(t *testing.T) []chartVariant {
	eg := ciValues(t, "envoygateway")
	return []chartVariant{
		{"default", ciValues(t, "default")},
		{"envoygateway", eg},
		{"istio", ciValues(t, "istio")},
		{"scaled", ciValues(t, "scaled")},
		{"mtls", ciValues(t, "mtls")},
		{"scaled, Envoy Gateway, TLS from a Secret", map[string]any{
			"mode":  "scaled",
			"redis": map[string]any{"address": "redis:6379"},
			"config": map[string]any{"virtualModels": []any{map[string]any{"name": "llama-3-70b",
				"pools": []any{map[string]any{"cluster": "vllm-a100"}, map[string]any{"cluster": "vllm-h100", "priority": 1}}}},
				"weightSink": map[string]any{"type": "httpRoute", "httpRoute": map[string]any{"namespace": "llm", "name": "infergate"}}},
			"extproc":      map[string]any{"tls": map[string]any{"enabled": true, "secretName": "extproc-certs"}},
			"envoyGateway": eg["envoyGateway"],
		}},
		{"Envoy Gateway on a Gateway, no example route", map[string]any{
			"envoyGateway": map[string]any{"enabled": true, "route": map[string]any{"enabled": false},
				"targetRefs": []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg"}}},
		}},
		{"scaled, Istio, VirtualService weights", map[string]any{
			"mode":  "scaled",
			"redis": map[string]any{"address": "redis:6379"},
			"istio": ciValues(t, "istio")["istio"],
			"config": map[string]any{"virtualModels": []any{map[string]any{"name": "llama-3-70b",
				"pools": []any{map[string]any{"cluster": "vllm-a"}, map[string]any{"cluster": "vllm-b", "priority": 1}}}},
				"weightSink": map[string]any{"type": "virtualService", "virtualService": map[string]any{"namespace": "llm", "name": "llama"}}},
		}},
	}
}

func kindsOf(objs []*unstructured.Unstructured) string {
	count := map[string]int{}
	for _, o := range objs {
		count[o.GetKind()]++
	}
	var s []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		s = append(s, fmt.Sprintf("%d %s", count[k], k))
	}
	return strings.Join(s, ", ")
}

// configChecksum is the checksum annotations on the Deployments' pod
// templates, which change with the config and roll the pods.
func (c *cluster) configChecksum(t *testing.T, ns string) string {
	t.Helper()
	ds, err := c.kube.AppsV1().Deployments(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(ds.Items) == 0 {
		t.Fatalf("no Deployments (%v)", err)
	}
	var sums []string
	for _, d := range ds.Items {
		for k, v := range d.Spec.Template.Annotations {
			if strings.HasPrefix(k, "checksum/") {
				sums = append(sums, d.Name+":"+k+"="+v)
			}
		}
	}
	slices.Sort(sums)
	return strings.Join(sums, ",")
}

// snapshot names every object in the cluster, of every listable resource,
// except the API server's own bookkeeping (events, leases).
func (c *cluster) snapshot(t *testing.T) map[string]bool {
	t.Helper()
	lists, err := discovery.NewDiscoveryClientForConfigOrDie(c.admin).ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range lists {
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		for _, r := range l.APIResources {
			// Endpoints and ComponentStatus are deprecated (a warning on
			// every list); nothing here writes them: no controller runs.
			if !slices.Contains(r.Verbs, "list") || slices.Contains([]string{"events", "leases", "endpoints", "componentstatuses"}, r.Name) {
				continue
			}
			gvr := gv.WithResource(r.Name)
			items, err := c.dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{})
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue
			}
			if err != nil {
				t.Fatalf("list %s: %v", gvr, err)
			}
			for _, it := range items.Items {
				seen[gvr.GroupResource().String()+" "+it.GetNamespace()+"/"+it.GetName()] = true
			}
		}
	}
	return seen
}

// deleteClaim deletes a PersistentVolumeClaim at once: no controller runs
// here to lift the API server's kubernetes.io/pvc-protection finalizer.
func (c *cluster) deleteClaim(ns, name string) {
	claims := c.kube.CoreV1().PersistentVolumeClaims(ns)
	ctx := context.Background()
	_ = claims.Delete(ctx, name, metav1.DeleteOptions{})
	_, _ = claims.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
}

func diffSnapshots(before, after map[string]bool) []string {
	var added []string
	for k := range after {
		if !before[k] {
			added = append(added, k)
		}
	}
	slices.Sort(added)
	return added
}
