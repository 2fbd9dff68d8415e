package charts

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	// Registers the ExternalProcessor type, so the typed_config of the
	// EnvoyFilters' patches resolves.
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// typed maps each kind the chart may render to its Go API type. A kind
// missing here fails the test: every object is decoded.
var typed = map[string]func() any{
	"v1/ConfigMap":                                   func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                      func() any { return &corev1.Secret{} },
	"v1/Service":                                     func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                              func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                             func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":                  func() any { return &policyv1.PodDisruptionBudget{} },
	"rbac.authorization.k8s.io/v1/Role":              func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":       func() any { return &rbacv1.RoleBinding{} },
	"autoscaling/v2/HorizontalPodAutoscaler":         func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"monitoring.coreos.com/v1/ServiceMonitor":        func() any { return &monitoringv1.ServiceMonitor{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":         func() any { return &gwapiv1.HTTPRoute{} },
	"gateway.envoyproxy.io/v1alpha1/Backend":         func() any { return &egv1a1.Backend{} },
	"gateway.envoyproxy.io/v1alpha1/HTTPRouteFilter": func() any { return &egv1a1.HTTPRouteFilter{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": func() any {
		return &egv1a1.EnvoyExtensionPolicy{}
	},
	"gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy": func() any { return &egv1a1.ClientTrafficPolicy{} },
	// EnvoyFilter: see decodeEnvoyFilter.
	"networking.istio.io/v1alpha3/EnvoyFilter": nil,
}

// strictDecode decodes a YAML document into obj as the API server's strict
// field validation does: duplicate keys, unknown fields and case-mismatched
// field names are errors.
func strictDecode(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("strict decoding: %v", strictErrs)
	}
	return nil
}

// envoyFilter is an EnvoyFilter object around its spec. The spec is a
// protobuf message: istio.io/api's own JSON decoding allows unknown fields,
// so it is decoded here with protojson, which does not.
type envoyFilter struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            json.RawMessage   `json:"spec"`
}

// decodeEnvoyFilter decodes an EnvoyFilter strictly, down to the Envoy
// config of each patch: the HTTP filter and its ExternalProcessor, which
// are also checked against Envoy's proto validation rules.
func decodeEnvoyFilter(doc []byte) (*istionet.EnvoyFilter, []*extprocv3.ExternalProcessor, []string, error) {
	var ef envoyFilter
	if err := strictDecode(doc, &ef); err != nil {
		return nil, nil, nil, err
	}
	spec := &istionet.EnvoyFilter{}
	if err := protojson.Unmarshal(ef.Spec, spec); err != nil {
		return nil, nil, nil, fmt.Errorf("spec: %w", err)
	}
	var procs []*extprocv3.ExternalProcessor
	var names []string
	for i, cp := range spec.GetConfigPatches() {
		value, err := protojson.Marshal(cp.GetPatch().GetValue())
		if err != nil {
			return nil, nil, nil, err
		}
		proc, name, err := decodeHTTPFilter(value)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("configPatches[%d].patch.value: %w", i, err)
		}
		procs = append(procs, proc)
		names = append(names, name)
	}
	return spec, procs, names, nil
}

// decodeHTTPFilter decodes an Envoy HttpFilter holding an ext_proc filter,
// from proto JSON, and validates it.
func decodeHTTPFilter(js []byte) (*extprocv3.ExternalProcessor, string, error) {
	var f hcmv3.HttpFilter
	if err := protojson.Unmarshal(js, &f); err != nil {
		return nil, "", err
	}
	var proc extprocv3.ExternalProcessor
	if err := f.GetTypedConfig().UnmarshalTo(&proc); err != nil {
		return nil, "", fmt.Errorf("typed_config: %w", err)
	}
	if err := proc.ValidateAll(); err != nil {
		return nil, "", err
	}
	return &proc, f.GetName(), nil
}

// decodeAll decodes every rendered object; it returns them by
// "apiVersion/kind" for further checks.
func decodeAll(t *testing.T, r *rendered) map[string][]any {
	t.Helper()
	out := map[string][]any{}
	for _, doc := range r.docs {
		var h header
		if err := yaml.Unmarshal([]byte(doc), &h); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		gvk := h.APIVersion + "/" + h.Kind
		newObj, known := typed[gvk]
		if !known {
			t.Errorf("%s %s: no typed API registered for this kind; add it to `typed`", gvk, h.Metadata.Name)
			continue
		}
		if h.Metadata.Namespace == "" {
			t.Errorf("%s %s: no metadata.namespace (the chart sets it on every object)", gvk, h.Metadata.Name)
		}
		if newObj == nil {
			spec, _, _, err := decodeEnvoyFilter([]byte(doc))
			if err != nil {
				t.Errorf("%s %s: %v", gvk, h.Metadata.Name, err)
			}
			out[gvk] = append(out[gvk], spec)
			continue
		}
		obj := newObj()
		if err := strictDecode([]byte(doc), obj); err != nil {
			t.Errorf("%s %s: %v\n%s", gvk, h.Metadata.Name, err, doc)
			continue
		}
		out[gvk] = append(out[gvk], obj)
	}
	return out
}

// TestStrictDecode decodes every object of every variant into its typed
// API, rejecting unknown fields.
func TestStrictDecode(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			objs := decodeAll(t, mustRender(t, v))
			if len(objs["apps/v1/Deployment"]) == 0 {
				t.Fatal("no Deployment rendered")
			}
			for _, o := range objs["apps/v1/Deployment"] {
				checkDeployment(t, o.(*appsv1.Deployment), len(objs["rbac.authorization.k8s.io/v1/Role"]) > 0)
			}
		})
	}
}

// TestStrictDecodeEverything renders with every optional part switched on
// (some are in no ci variant, such as the Envoy Gateway Backend) and decodes
// it all.
func TestStrictDecodeEverything(t *testing.T) {
	vals := readValues(t, chartDir+"/ci/scaled-values.yaml")
	eg := readValues(t, chartDir+"/ci/envoygateway-values.yaml")["envoyGateway"].(map[string]any)
	eg["backend"] = map[string]any{"enabled": true}
	vals["envoyGateway"] = eg
	vals["istio"] = readValues(t, chartDir+"/ci/istio-values.yaml")["istio"]
	vals["serviceMonitor"] = map[string]any{"enabled": true}
	vals["dashboards"] = map[string]any{"enabled": true, "namespace": "monitoring"}
	vals["apiKeys"] = readValues(t, chartDir+"/ci/envoygateway-values.yaml")["apiKeys"]
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, r)
	var got []string
	for gvk := range typed {
		if len(objs[gvk]) == 0 {
			got = append(got, gvk)
		}
	}
	if len(got) > 0 {
		t.Errorf("kinds never rendered (so never decoded): %v", got)
	}
	for _, o := range objs["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"] {
		for i, ep := range o.(*egv1a1.EnvoyExtensionPolicy).Spec.ExtProc {
			ref := ep.BackendRefs[0]
			if ref.Kind == nil || *ref.Kind != "Backend" {
				t.Errorf("extProc[%d] refers to %v, want the Backend", i, ref.Kind)
			}
		}
	}
}

// TestStrictDecodeRejectsUnknownFields proves the decoder is strict: a
// misspelt field must fail, or TestStrictDecode would prove nothing.
func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	cases := map[string]struct {
		doc string
		obj any
	}{
		"Deployment":           {"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 1}\n", &appsv1.Deployment{}},
		"Deployment case":      {"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {Replicas: 1}\n", &appsv1.Deployment{}},
		"EnvoyExtensionPolicy": {"apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyExtensionPolicy\nmetadata: {name: x}\nspec: {extProc: [{observabilityMode: true}]}\n", &egv1a1.EnvoyExtensionPolicy{}},
		"HTTPRoute":            {"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rules: [{timeout: 1s}]}\n", &gwapiv1.HTTPRoute{}},
		"duplicate key":        {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b, a: c}\n", &corev1.ConfigMap{}},
	}
	for name, c := range cases {
		if err := strictDecode([]byte(c.doc), c.obj); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	ef := `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: x}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    patch:
      operation: INSERT_BEFORE
      value:
        name: infergate.gate
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
          grpc_service: {envoy_grpc: {cluster_name: x}}
          processing_mode: {request_body_mode: STREAMING}
`
	if _, _, _, err := decodeEnvoyFilter([]byte(ef)); err == nil || !strings.Contains(err.Error(), "STREAMING") {
		t.Errorf("EnvoyFilter with a bad Envoy enum value: err = %v", err)
	}
	ef = strings.Replace(ef, "  configPatches:", "  configPatchez:", 1)
	if _, _, _, err := decodeEnvoyFilter([]byte(ef)); err == nil {
		t.Error("EnvoyFilter with an unknown spec field decoded without error")
	}
}

// checkDeployment checks what the chart promises of every pod: probes,
// a graceful drain, and a locked-down container.
func checkDeployment(t *testing.T, d *appsv1.Deployment, weightSinkRole bool) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", d.Name, len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: liveness probe is not GET /healthz: %+v", d.Name, c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe is not GET /readyz: %+v", d.Name, c.ReadinessProbe)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Errorf("%s: no preStop sleep", d.Name)
	} else if grace := spec.TerminationGracePeriodSeconds; grace == nil || *grace < c.Lifecycle.PreStop.Sleep.Seconds+5 {
		t.Errorf("%s: terminationGracePeriodSeconds %v leaves no time to drain after the %ds preStop sleep", d.Name, grace, c.Lifecycle.PreStop.Sleep.Seconds)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: container securityContext is not locked down: %+v", d.Name, sc)
	}
	if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("%s: pod may run as root", d.Name)
	}
	if len(c.Args) < 3 || c.Args[1] != "--config" || c.Args[2] != "/etc/infergate/config.yaml" {
		t.Errorf("%s: args %q", d.Name, c.Args)
	}
	// Only the SLA controller with a Kubernetes weight sink calls the API
	// (the scaled variant's controller sets an HTTPRoute's weights).
	wantToken := strings.HasSuffix(d.Name, "-controller") && weightSinkRole
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken != wantToken {
		t.Errorf("%s: automountServiceAccountToken %v, want %v", d.Name, spec.AutomountServiceAccountToken, wantToken)
	}
}

// TestStrictDecodeCombinations renders value combinations the ci variants
// do not cover and decodes them, checking the parts they switch.
func TestStrictDecodeCombinations(t *testing.T) {
	cases := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, objs map[string][]any)
	}{
		{"serve with virtual models, Redis and autoscaling", map[string]any{
			"redis":   map[string]any{"address": "redis:6379", "username": "infergate", "db": 2},
			"extproc": map[string]any{"autoscaling": map[string]any{"enabled": true}},
			"config": map[string]any{"virtualModels": []any{map[string]any{"name": "m",
				"pools": []any{map[string]any{"cluster": "a"}, map[string]any{"cluster": "b", "priority": 1}}}}},
		}, func(t *testing.T, objs map[string][]any) {
			svc := findService(objs, releaseName)
			if svc == nil || len(svc.Spec.Ports) != 3 || svc.Spec.Ports[2].Name != "grpc-xds" {
				t.Errorf("serve with virtual models must expose xDS on the Service: %+v", svc)
			}
			d := objs["apps/v1/Deployment"][0].(*appsv1.Deployment)
			if d.Spec.Replicas != nil {
				t.Errorf("replicas set (%d) although the HPA owns them", *d.Spec.Replicas)
			}
			if len(objs["autoscaling/v2/HorizontalPodAutoscaler"]) != 1 {
				t.Error("no HorizontalPodAutoscaler")
			}
			cm := findConfigMap(objs, releaseName+"-config")
			for _, want := range []string{"backend: redis", "address: redis:6379", "username: infergate", "db: 2"} {
				if !strings.Contains(cm.Data["config.yaml"], want) {
					t.Errorf("config lacks %q:\n%s", want, cm.Data["config.yaml"])
				}
			}
		}},
		{"Envoy Gateway on a Gateway, no example route", map[string]any{
			"envoyGateway": map[string]any{"enabled": true, "route": map[string]any{"enabled": false},
				"targetRefs": []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg"}}},
		}, func(t *testing.T, objs map[string][]any) {
			if n := len(objs["gateway.networking.k8s.io/v1/HTTPRoute"]); n != 0 {
				t.Errorf("%d HTTPRoutes rendered with the route disabled", n)
			}
			p := objs["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"][0].(*egv1a1.EnvoyExtensionPolicy)
			if len(p.Spec.TargetRefs) != 1 || p.Spec.TargetRefs[0].Kind != "Gateway" {
				t.Errorf("targetRefs %+v, want the Gateway", p.Spec.TargetRefs)
			}
		}},
		{"policies and keys disabled, no PDB, no headless Service", map[string]any{
			"policies":       map[string]any{"enabled": false},
			"service":        map[string]any{"headless": false},
			"extproc":        map[string]any{"podDisruptionBudget": map[string]any{"enabled": false, "maxUnavailable": 1}, "preStopSleepSeconds": 1},
			"serviceAccount": map[string]any{"create": false},
		}, func(t *testing.T, objs map[string][]any) {
			if len(objs["v1/ConfigMap"]) != 1 || len(objs["v1/Service"]) != 1 || len(objs["policy/v1/PodDisruptionBudget"]) != 0 || len(objs["v1/ServiceAccount"]) != 0 {
				t.Errorf("rendered %d ConfigMaps, %d Services, %d PDBs, %d ServiceAccounts", len(objs["v1/ConfigMap"]),
					len(objs["v1/Service"]), len(objs["policy/v1/PodDisruptionBudget"]), len(objs["v1/ServiceAccount"]))
			}
			if cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]; strings.Contains(cfg, "policy:") || strings.Contains(cfg, "auth:") {
				t.Errorf("config names a policy or keys directory that is not mounted:\n%s", cfg)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := render(t, c.vals)
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, decodeAll(t, r))
		})
	}
}

func findService(objs map[string][]any, name string) *corev1.Service {
	for _, o := range objs["v1/Service"] {
		if s := o.(*corev1.Service); s.Name == name {
			return s
		}
	}
	return nil
}

func findConfigMap(objs map[string][]any, name string) *corev1.ConfigMap {
	for _, o := range objs["v1/ConfigMap"] {
		if cm := o.(*corev1.ConfigMap); cm.Name == name {
			return cm
		}
	}
	return &corev1.ConfigMap{}
}
