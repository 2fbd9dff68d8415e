package charts

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	istionet "istio.io/api/networking/v1alpha3"
	istiosecurity "istio.io/api/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	// Register the types the EnvoyFilters' patches name in typed_config:
	// the ExternalProcessor, the usage filter's Lua, the local-reply
	// mapper's CEL filter, and the sidecars' skip for the gateway's
	// identity (a matcher on the peer's URI SAN wrapping each filter).
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	actionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	sslv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/ssl/v3"
)

// typed maps each kind the chart may render to its Go API type. A kind
// missing here fails the test: every object is decoded.
var typed = map[string]func() any{
	"v1/ConfigMap":                                   func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                      func() any { return &corev1.Secret{} },
	"v1/Service":                                     func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                              func() any { return &corev1.ServiceAccount{} },
	"v1/PersistentVolumeClaim":                       func() any { return &corev1.PersistentVolumeClaim{} },
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
	"gateway.networking.k8s.io/v1/BackendTLSPolicy":      func() any { return &gwapiv1.BackendTLSPolicy{} },
	"networking.k8s.io/v1/NetworkPolicy":                 func() any { return &networkingv1.NetworkPolicy{} },
	"cert-manager.io/v1/Certificate":                     func() any { return &certificate{} },
	// Istio's kinds: their spec is a protobuf message; see decodeIstio.
	"networking.istio.io/v1alpha3/EnvoyFilter": nil,
	"security.istio.io/v1/PeerAuthentication":  nil,
	"security.istio.io/v1/AuthorizationPolicy": nil,
}

// certificate is cert-manager.io/v1 Certificate, the fields the chart may
// set, with cert-manager's enumerations checked by check. The cert-manager
// module is not a dependency of this module (its Kubernetes and controller
// dependencies would come with it), so this mirror of its API
// (https://cert-manager.io/docs/reference/api-docs/#cert-manager.io/v1.CertificateSpec)
// stands in for the typed API: a misspelt or unknown field still fails.
type certificate struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		SecretName string `json:"secretName"`
		IssuerRef  struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
		Duration    *metav1.Duration `json:"duration,omitempty"`
		RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
		CommonName  string           `json:"commonName,omitempty"`
		DNSNames    []string         `json:"dnsNames,omitempty"`
		Usages      []string         `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
	} `json:"spec"`
}

// check applies the API's own rules to what the mirror decoded.
func (c *certificate) check() error {
	s := c.Spec
	if s.SecretName == "" || s.IssuerRef.Name == "" {
		return fmt.Errorf("secretName and issuerRef.name are required")
	}
	if s.CommonName == "" && len(s.DNSNames) == 0 {
		return fmt.Errorf("a commonName or dnsNames is required")
	}
	if s.Duration != nil && s.RenewBefore != nil && s.RenewBefore.Duration >= s.Duration.Duration {
		return fmt.Errorf("renewBefore %v is not shorter than duration %v", s.RenewBefore, s.Duration)
	}
	known := map[string]bool{"signing": true, "digital signature": true, "content commitment": true, "key encipherment": true,
		"key agreement": true, "data encipherment": true, "cert sign": true, "crl sign": true, "encipher only": true,
		"decipher only": true, "any": true, "server auth": true, "client auth": true, "code signing": true,
		"email protection": true, "s/mime": true, "ipsec end system": true, "ipsec tunnel": true, "ipsec user": true,
		"timestamping": true, "ocsp signing": true, "microsoft sgc": true, "netscape sgc": true}
	for _, u := range s.Usages {
		if !known[u] {
			return fmt.Errorf("usage %q is not one of cert-manager's", u)
		}
	}
	if pk := s.PrivateKey; pk != nil {
		if !map[string]bool{"": true, "RSA": true, "ECDSA": true, "Ed25519": true}[pk.Algorithm] ||
			!map[string]bool{"": true, "Never": true, "Always": true}[pk.RotationPolicy] {
			return fmt.Errorf("privateKey %+v", *pk)
		}
	}
	return nil
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

// istioObject is an Istio object around its spec. The spec is a protobuf
// message: istio.io/api's own JSON decoding allows unknown fields, so it is
// decoded here with protojson, which does not.
type istioObject struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            json.RawMessage   `json:"spec"`
}

// decodeEnvoyFilter decodes an EnvoyFilter strictly, down to the Envoy
// config of each patch: the HTTP filter and its ExternalProcessor, which
// are also checked against Envoy's proto validation rules.
func decodeEnvoyFilter(doc []byte) (*istionet.EnvoyFilter, []httpFilter, error) {
	var ef istioObject
	if err := strictDecode(doc, &ef); err != nil {
		return nil, nil, err
	}
	spec := &istionet.EnvoyFilter{}
	if err := protojson.Unmarshal(ef.Spec, spec); err != nil {
		return nil, nil, fmt.Errorf("spec: %w", err)
	}
	var filters []httpFilter
	for i, cp := range spec.GetConfigPatches() {
		value, err := protojson.Marshal(cp.GetPatch().GetValue())
		if err != nil {
			return nil, nil, err
		}
		if cp.GetApplyTo().String() == "NETWORK_FILTER" {
			if _, err := decodeHCMPatch(value); err != nil {
				return nil, nil, fmt.Errorf("configPatches[%d].patch.value: %w", i, err)
			}
			continue
		}
		f, err := decodeHTTPFilter(value)
		if err != nil {
			return nil, nil, fmt.Errorf("configPatches[%d].patch.value: %w", i, err)
		}
		filters = append(filters, f)
	}
	return spec, filters, nil
}

// decodePeerAuthentication decodes a PeerAuthentication strictly.
func decodePeerAuthentication(doc []byte) (*istiosecurity.PeerAuthentication, error) {
	var pa istioObject
	if err := strictDecode(doc, &pa); err != nil {
		return nil, err
	}
	spec := &istiosecurity.PeerAuthentication{}
	if err := protojson.Unmarshal(pa.Spec, spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return spec, nil
}

// decodeAuthorizationPolicy decodes an AuthorizationPolicy strictly.
func decodeAuthorizationPolicy(doc []byte) (*istiosecurity.AuthorizationPolicy, error) {
	var ap istioObject
	if err := strictDecode(doc, &ap); err != nil {
		return nil, err
	}
	spec := &istiosecurity.AuthorizationPolicy{}
	if err := protojson.Unmarshal(ap.Spec, spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return spec, nil
}

// decodeIstio decodes an Istio object of kind gvk.
func decodeIstio(gvk string, doc []byte) (any, error) {
	switch {
	case strings.HasSuffix(gvk, "/PeerAuthentication"):
		return decodePeerAuthentication(doc)
	case strings.HasSuffix(gvk, "/AuthorizationPolicy"):
		return decodeAuthorizationPolicy(doc)
	}
	spec, _, err := decodeEnvoyFilter(doc)
	return spec, err
}

// decodeHCMPatch decodes a MERGE patch of the HTTP connection manager
// (a network filter's typed_config), from proto JSON, and validates it.
func decodeHCMPatch(js []byte) (*hcmv3.HttpConnectionManager, error) {
	var f listenerv3.Filter
	if err := protojson.Unmarshal(js, &f); err != nil {
		return nil, err
	}
	var hcm hcmv3.HttpConnectionManager
	if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		return nil, fmt.Errorf("typed_config: %w", err)
	}
	return &hcm, nil
}

// httpFilter is an HTTP filter patch: its name, its ext_proc or Lua
// config (the other nil), and the peer identities (URI SANs) it is skipped
// for, if it is wrapped in a matcher that skips it.
type httpFilter struct {
	name  string
	proc  *extprocv3.ExternalProcessor
	lua   *luav3.Lua
	skips []string // sorted
}

// decodeHTTPFilter decodes an Envoy HttpFilter holding an ext_proc or a
// Lua filter, maybe inside a matcher skipping it for peer identities, from
// proto JSON, and validates it.
func decodeHTTPFilter(js []byte) (httpFilter, error) {
	var f hcmv3.HttpFilter
	if err := protojson.Unmarshal(js, &f); err != nil {
		return httpFilter{}, err
	}
	out := httpFilter{name: f.GetName()}
	config := f.GetTypedConfig()
	var wrapped matchingv3.ExtensionWithMatcher
	if config.MessageIs(&wrapped) {
		// A sidecar's filter, skipped for the gateway's identity: the
		// filter itself is the extension_config, under the same name.
		if err := config.UnmarshalTo(&wrapped); err != nil {
			return httpFilter{}, fmt.Errorf("typed_config: %w", err)
		}
		if err := wrapped.ValidateAll(); err != nil {
			return httpFilter{}, err
		}
		if inner := wrapped.GetExtensionConfig().GetName(); inner != f.GetName() {
			return httpFilter{}, fmt.Errorf("extension_config %q inside filter %q", inner, f.GetName())
		}
		tree := wrapped.GetXdsMatcher().GetMatcherTree()
		if err := tree.GetInput().GetTypedConfig().UnmarshalTo(&sslv3.UriSanInput{}); err != nil {
			return httpFilter{}, fmt.Errorf("the matcher's input is not the peer's URI SAN: %w", err)
		}
		for id, m := range tree.GetExactMatchMap().GetMap() {
			if err := m.GetAction().GetTypedConfig().UnmarshalTo(&actionv3.SkipFilter{}); err != nil {
				return httpFilter{}, fmt.Errorf("%s does not skip the filter: %w", id, err)
			}
			out.skips = append(out.skips, id)
		}
		slices.Sort(out.skips)
		config = wrapped.GetExtensionConfig().GetTypedConfig()
	}
	if config.MessageIs(&luav3.Lua{}) {
		out.lua = &luav3.Lua{}
		if err := config.UnmarshalTo(out.lua); err != nil {
			return httpFilter{}, fmt.Errorf("typed_config: %w", err)
		}
		return out, out.lua.ValidateAll()
	}
	out.proc = &extprocv3.ExternalProcessor{}
	if err := config.UnmarshalTo(out.proc); err != nil {
		return httpFilter{}, fmt.Errorf("typed_config: %w", err)
	}
	if err := out.proc.ValidateAll(); err != nil {
		return httpFilter{}, err
	}
	return out, nil
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
			spec, err := decodeIstio(gvk, []byte(doc))
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
		if c, ok := obj.(*certificate); ok {
			if err := c.check(); err != nil {
				t.Errorf("%s %s: %v", gvk, h.Metadata.Name, err)
			}
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
				checkDeployment(t, o.(*appsv1.Deployment), objs["rbac.authorization.k8s.io/v1/Role"])
			}
		})
	}
}

// TestStrictDecodeEverything renders with every optional part switched on
// (some are in no ci variant, such as the Envoy Gateway Backend) and decodes
// it all. Two renders: mutual TLS on the ext_proc port and Istio exclude
// each other.
func TestStrictDecodeEverything(t *testing.T) {
	eg := func() map[string]any {
		eg := readValues(t, chartDir+"/ci/envoygateway-values.yaml")["envoyGateway"].(map[string]any)
		eg["backend"] = map[string]any{"enabled": true}
		return eg
	}
	withIstio := readValues(t, chartDir+"/ci/scaled-values.yaml")
	withIstio["envoyGateway"] = eg()
	withIstio["istio"] = readValues(t, chartDir+"/ci/istio-values.yaml")["istio"]
	withIstio["serviceMonitor"] = map[string]any{"enabled": true}
	withIstio["dashboards"] = map[string]any{"enabled": true, "namespace": "monitoring"}
	withIstio["apiKeys"] = readValues(t, chartDir+"/ci/envoygateway-values.yaml")["apiKeys"]
	withIstio["networkPolicy"] = map[string]any{"enabled": true}
	withTLS := readValues(t, chartDir+"/ci/scaled-values.yaml")
	withTLS["envoyGateway"] = eg()
	withTLS["envoyGateway"].(map[string]any)["clientCertificateNamespace"] = "envoy-gateway-system"
	withTLS["extproc"].(map[string]any)["tls"] = readValues(t, chartDir+"/ci/mtls-values.yaml")["extproc"].(map[string]any)["tls"]

	seen := map[string]bool{}
	for _, vals := range []map[string]any{withIstio, withTLS, {} /* mode serve: the ledger's claim */} {
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		objs := decodeAll(t, r)
		for gvk, list := range objs {
			seen[gvk] = seen[gvk] || len(list) > 0
		}
		for _, o := range objs["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"] {
			for i, ep := range o.(*egv1a1.EnvoyExtensionPolicy).Spec.ExtProc {
				ref := ep.BackendRefs[0]
				if ref.Kind == nil || *ref.Kind != "Backend" {
					t.Errorf("extProc[%d] refers to %v, want the Backend", i, ref.Kind)
				}
			}
		}
		for _, o := range objs["gateway.networking.k8s.io/v1/BackendTLSPolicy"] {
			if ref := o.(*gwapiv1.BackendTLSPolicy).Spec.TargetRefs[0]; ref.Kind != "Backend" || ref.Name != releaseName+"-extproc" {
				t.Errorf("BackendTLSPolicy targets %+v, want the Backend", ref)
			}
		}
	}
	var missing []string
	for gvk := range typed {
		if !seen[gvk] {
			missing = append(missing, gvk)
		}
	}
	if len(missing) > 0 {
		t.Errorf("kinds never rendered (so never decoded): %v", missing)
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
		"NetworkPolicy":        {"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: x}\nspec: {ingress: [{from: [{podSelectors: {}}]}]}\n", &networkingv1.NetworkPolicy{}},
		"BackendTLSPolicy":     {"apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: x}\nspec: {validation: {caCertificateRef: []}}\n", &gwapiv1.BackendTLSPolicy{}},
		"Certificate":          {"apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: x}\nspec: {secretName: s, issuerRef: {name: i}, dnsName: [a]}\n", &certificate{}},
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
	if _, _, err := decodeEnvoyFilter([]byte(ef)); err == nil || !strings.Contains(err.Error(), "STREAMING") {
		t.Errorf("EnvoyFilter with a bad Envoy enum value: err = %v", err)
	}
	pa := "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: x}\nspec: {mtls: {mode: STRICT}, portLevelMTLS: {}}\n"
	if _, err := decodePeerAuthentication([]byte(pa)); err == nil {
		t.Error("PeerAuthentication with an unknown spec field decoded without error")
	}
	ap := "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: x}\nspec: {rules: [{from: [{source: {principal: [a]}}]}]}\n"
	if _, err := decodeAuthorizationPolicy([]byte(ap)); err == nil {
		t.Error("AuthorizationPolicy with an unknown field decoded without error")
	}
	c := &certificate{}
	if err := strictDecode([]byte("apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: x}\nspec: {secretName: s, issuerRef: {name: i}, dnsNames: [a], usages: [server-auth]}\n"), c); err != nil || c.check() == nil {
		t.Errorf("Certificate with an unknown usage: decode %v, check %v", err, c.check())
	}
	ef = strings.Replace(ef, "  configPatches:", "  configPatchez:", 1)
	if _, _, err := decodeEnvoyFilter([]byte(ef)); err == nil {
		t.Error("EnvoyFilter with an unknown spec field decoded without error")
	}
}

// checkDeployment checks what the chart promises of every pod: probes,
// a graceful drain, and a locked-down container.
func checkDeployment(t *testing.T, d *appsv1.Deployment, roles []any) {
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
	// Only the SLA controller (infergate controller, or serve with virtual
	// models) calls the API for a Role of its own: a Kubernetes weight sink
	// (the scaled variant's controller sets an HTTPRoute's weights) or
	// InferencePools it follows (the inferencepools variant's serve); and
	// Envoy Gateway's extension, on the pods that serve the xDS port (it
	// reads HTTPRoutes).
	var controllerRole, routesRole bool
	for _, r := range roles {
		name := r.(*rbacv1.Role).Name
		controllerRole = controllerRole || strings.HasSuffix(name, "-weights") || strings.HasSuffix(name, "-pools")
		routesRole = routesRole || strings.HasSuffix(name, "-httproutes")
	}
	servesXDS := slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "xds" })
	wantToken := (len(c.Args) > 0 && (c.Args[0] == "controller" || c.Args[0] == "serve") && controllerRole) || (routesRole && servesXDS)
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
		{"Envoy Gateway route with annotations (GitOps)", func() map[string]any {
			v := readValues(t, chartDir+"/ci/envoygateway-values.yaml")
			v["envoyGateway"].(map[string]any)["route"].(map[string]any)["annotations"] = map[string]any{"kustomize.toolkit.fluxcd.io/ssa": "IfNotPresent"}
			return v
		}(), func(t *testing.T, objs map[string][]any) {
			r := objs["gateway.networking.k8s.io/v1/HTTPRoute"][0].(*gwapiv1.HTTPRoute)
			if r.Annotations["kustomize.toolkit.fluxcd.io/ssa"] != "IfNotPresent" {
				t.Errorf("HTTPRoute annotations %v", r.Annotations)
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
		{"mutual TLS from an existing Secret, scaled, Envoy Gateway", map[string]any{
			"mode":  "scaled",
			"redis": map[string]any{"address": "redis:6379"},
			"config": map[string]any{"virtualModels": []any{map[string]any{"name": "m",
				"pools": []any{map[string]any{"cluster": "a"}}}}},
			"extproc":      map[string]any{"tls": map[string]any{"enabled": true, "secretName": "extproc-certs"}},
			"envoyGateway": readValues(t, chartDir+"/ci/envoygateway-values.yaml")["envoyGateway"],
		}, func(t *testing.T, objs map[string][]any) {
			if n := len(objs["cert-manager.io/v1/Certificate"]); n != 0 {
				t.Errorf("%d Certificates rendered without certManager.issuerRef", n)
			}
			checkTLSMount(t, objs, "extproc-certs")
			p := objs["gateway.networking.k8s.io/v1/BackendTLSPolicy"][0].(*gwapiv1.BackendTLSPolicy)
			ref, v := p.Spec.TargetRefs[0], p.Spec.Validation
			if ref.Kind != "Service" || ref.Name != releaseName || ref.SectionName == nil || *ref.SectionName != "grpc-extproc" ||
				v.Hostname != releaseName+"."+namespace+".svc.cluster.local" || len(v.CACertificateRefs) != 1 ||
				v.CACertificateRefs[0].Kind != "Secret" || v.CACertificateRefs[0].Name != "extproc-certs" {
				t.Errorf("BackendTLSPolicy %+v", p.Spec)
			}
		}},
		{"mutual TLS from cert-manager, with Envoy's client certificate", map[string]any{
			"extproc": readValues(t, chartDir+"/ci/mtls-values.yaml")["extproc"],
			"envoyGateway": func() any {
				eg := readValues(t, chartDir+"/ci/envoygateway-values.yaml")["envoyGateway"].(map[string]any)
				eg["clientCertificateNamespace"] = "envoy-gateway-system"
				return eg
			}(),
		}, func(t *testing.T, objs map[string][]any) {
			secret := releaseName + "-extproc-tls"
			checkTLSMount(t, objs, secret)
			certs := objs["cert-manager.io/v1/Certificate"]
			if len(certs) != 2 {
				t.Fatalf("%d Certificates, want infergate's and Envoy's", len(certs))
			}
			server, client := certs[0].(*certificate), certs[1].(*certificate)
			fqdn := releaseName + "." + namespace + ".svc.cluster.local"
			if server.Spec.SecretName != secret || !slices.Contains(server.Spec.DNSNames, fqdn) ||
				!slices.Contains(server.Spec.DNSNames, releaseName+"-headless."+namespace+".svc.cluster.local") ||
				!slices.Contains(server.Spec.Usages, "server auth") || server.Spec.IssuerRef.Kind != "ClusterIssuer" {
				t.Errorf("infergate's Certificate %+v", server.Spec)
			}
			if client.Metadata.Namespace != "envoy-gateway-system" || client.Spec.SecretName != releaseName+"-envoy-client" ||
				!slices.Contains(client.Spec.Usages, "client auth") || client.Spec.IssuerRef != server.Spec.IssuerRef {
				t.Errorf("Envoy's Certificate %s/%s %+v", client.Metadata.Namespace, client.Metadata.Name, client.Spec)
			}
		}},
		{"NetworkPolicy peers derived for Envoy Gateway", map[string]any{
			"envoyGateway":  readValues(t, chartDir+"/ci/envoygateway-values.yaml")["envoyGateway"],
			"networkPolicy": map[string]any{"enabled": true},
		}, func(t *testing.T, objs map[string][]any) {
			np := objs["networking.k8s.io/v1/NetworkPolicy"][0].(*networkingv1.NetworkPolicy)
			checkNetworkPolicy(t, np, 1)
			peer := np.Spec.Ingress[0].From[0]
			if peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels) != 0 ||
				peer.PodSelector.MatchLabels["gateway.envoyproxy.io/owning-gateway-name"] != "eg" ||
				peer.PodSelector.MatchLabels["gateway.envoyproxy.io/owning-gateway-namespace"] != "envoy-gateway-system" {
				t.Errorf("ext_proc peer %+v, want Envoy Gateway's proxies of eg in any namespace", peer)
			}
		}},
		{"generated mTLS certificates (the default install)", map[string]any{}, func(t *testing.T, objs map[string][]any) {
			secrets := map[string]*corev1.Secret{}
			for _, o := range objs["v1/Secret"] {
				secrets[o.(*corev1.Secret).Name] = o.(*corev1.Secret)
			}
			server, client := secrets[releaseName+"-extproc-tls"], secrets[releaseName+"-envoy-client"]
			if server == nil || client == nil {
				t.Fatalf("Secrets %v, want %s-extproc-tls and %s-envoy-client", secrets, releaseName, releaseName)
			}
			parse := func(s *corev1.Secret) (*x509.Certificate, *x509.CertPool) {
				if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
					t.Fatalf("%s: %v", s.Name, err)
				}
				block, _ := pem.Decode(s.Data["tls.crt"])
				if block == nil {
					t.Fatalf("%s: tls.crt is not PEM", s.Name)
				}
				cert, err := x509.ParseCertificate(block.Bytes)
				if err != nil {
					t.Fatal(err)
				}
				roots := x509.NewCertPool()
				if !roots.AppendCertsFromPEM(s.Data["ca.crt"]) {
					t.Fatalf("%s: ca.crt holds no certificate", s.Name)
				}
				return cert, roots
			}
			serverCert, roots := parse(server)
			clientCert, clientRoots := parse(client)
			name := releaseName + "." + namespace + ".svc.cluster.local"
			if _, err := serverCert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
				t.Errorf("infergate's certificate for %s: %v", name, err)
			}
			// Envoy's client certificate chains to the CA infergate trusts
			// (the server Secret's ca.crt), and Envoy trusts infergate's.
			if _, err := clientCert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("Envoy's client certificate: %v", err)
			}
			if _, err := serverCert.Verify(x509.VerifyOptions{DNSName: name, Roots: clientRoots}); err != nil {
				t.Errorf("infergate's certificate by the client Secret's ca.crt: %v", err)
			}
			cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]
			if !strings.Contains(cfg, "clientCAFile: /etc/infergate/tls/ca.crt") || strings.Contains(cfg, "extproc:\n  insecureOpenToNetwork") {
				t.Errorf("config without the generated TLS files, or plaintext:\n%s", cfg)
			}
		}},
		{"debug pages behind the token Secret", map[string]any{
			"debug": map[string]any{"enabled": true, "tokenSecret": map[string]any{"name": "dbg", "key": "t"}},
		}, func(t *testing.T, objs map[string][]any) {
			cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]
			for _, want := range []string{"tokenFile: /etc/infergate/debug/token", "openToNetwork: true"} {
				if !strings.Contains(cfg, want) {
					t.Errorf("config lacks %q:\n%s", want, cfg)
				}
			}
			pod := objs["apps/v1/Deployment"][0].(*appsv1.Deployment).Spec.Template.Spec
			mounted := false
			for _, m := range pod.Containers[0].VolumeMounts {
				mounted = mounted || m.Name == "debug-token" && m.MountPath == "/etc/infergate/debug"
			}
			found := false
			for _, v := range pod.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "dbg" {
					found = len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "t" && v.Secret.Items[0].Path == "token"
				}
			}
			if !mounted || !found {
				t.Errorf("the token Secret is not mounted as /etc/infergate/debug/token: %+v %+v", pod.Containers[0].VolumeMounts, pod.Volumes)
			}
		}},
		{"NetworkPolicy peers derived for Istio, PeerAuthentication", map[string]any{
			"istio":         readValues(t, chartDir+"/ci/istio-values.yaml")["istio"],
			"networkPolicy": map[string]any{"enabled": true},
		}, func(t *testing.T, objs map[string][]any) {
			np := objs["networking.k8s.io/v1/NetworkPolicy"][0].(*networkingv1.NetworkPolicy)
			checkNetworkPolicy(t, np, 2)
			gw, sidecar := np.Spec.Ingress[0].From[0], np.Spec.Ingress[0].From[1]
			if gw.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "istio-system" || gw.PodSelector.MatchLabels["istio"] != "ingressgateway" ||
				sidecar.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "models" || sidecar.PodSelector.MatchLabels["app.kubernetes.io/name"] != "vllm" {
				t.Errorf("ext_proc peers %+v", np.Spec.Ingress[0].From)
			}
			pa := objs["security.istio.io/v1/PeerAuthentication"][0].(*istiosecurity.PeerAuthentication)
			if pa.GetPortLevelMtls()[50051].GetMode().String() != "STRICT" || pa.GetMtls().GetMode().String() != "PERMISSIVE" ||
				pa.GetSelector().GetMatchLabels()["app.kubernetes.io/component"] != "serve" {
				t.Errorf("PeerAuthentication %v", pa)
			}
			// The ext_proc port admits the gateway's and the model servers'
			// identities only; the admin port anyone in the mesh.
			ap := objs["security.istio.io/v1/AuthorizationPolicy"][0].(*istiosecurity.AuthorizationPolicy)
			rules := ap.GetRules()
			if ap.GetAction().String() != "ALLOW" || len(rules) != 2 || ap.GetSelector().GetMatchLabels()["app.kubernetes.io/component"] != "serve" {
				t.Fatalf("AuthorizationPolicy %v", ap)
			}
			want := []string{"cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account", "cluster.local/ns/models/sa/vllm"}
			if got := rules[0].GetFrom()[0].GetSource().GetPrincipals(); !slices.Equal(got, want) ||
				!slices.Equal(rules[0].GetTo()[0].GetOperation().GetPorts(), []string{"50051"}) {
				t.Errorf("ext_proc rule %v, want principals %q on port 50051", rules[0], want)
			}
			if len(rules[1].GetFrom()) != 0 || !slices.Equal(rules[1].GetTo()[0].GetOperation().GetPorts(), []string{"9090"}) {
				t.Errorf("admin rule %v", rules[1])
			}
		}},
		{"Envoy Gateway's extension server for InferencePools, with a NetworkPolicy", func() map[string]any {
			v := readValues(t, chartDir+"/ci/envoygateway-values.yaml")
			v["inferencePools"] = map[string]any{"extensionServer": map[string]any{"enabled": true},
				"models": []any{map[string]any{"name": "llama-3.1-8b-instruct", "pools": []any{map[string]any{"name": "vllm-llama3-8b", "weight": 100}}}}}
			v["networkPolicy"] = map[string]any{"enabled": true}
			return v
		}(), func(t *testing.T, objs map[string][]any) {
			cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]
			for _, want := range []string{"gatewayExtension:", "enabled: true", "name: " + releaseName, "clusterDomain: cluster.local", "endpointPickerTLS: true"} {
				if !strings.Contains(cfg, want) {
					t.Errorf("config lacks %q:\n%s", want, cfg)
				}
			}
			if svc := findService(objs, releaseName); svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "grpc-xds" }) {
				t.Errorf("the Service does not expose the xDS port Envoy Gateway calls: %+v", svc)
			}
			var role *rbacv1.Role
			for _, o := range objs["rbac.authorization.k8s.io/v1/Role"] {
				if r := o.(*rbacv1.Role); r.Name == releaseName+"-httproutes" {
					role = r
				}
			}
			if role == nil || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"httproutes"}) || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) {
				t.Errorf("HTTPRoute Role = %+v", role)
			}
			d := objs["apps/v1/Deployment"][0].(*appsv1.Deployment)
			checkDeployment(t, d, objs["rbac.authorization.k8s.io/v1/Role"])
			if tok := d.Spec.Template.Spec.AutomountServiceAccountToken; tok == nil || !*tok {
				t.Error("the extension cannot read HTTPRoutes without the service account's token")
			}
			np := objs["networking.k8s.io/v1/NetworkPolicy"][0].(*networkingv1.NetworkPolicy)
			if len(np.Spec.Ingress) != 3 || np.Spec.Ingress[1].Ports[0].Port.String() != "xds" ||
				np.Spec.Ingress[1].From[0].PodSelector.MatchLabels["control-plane"] != "envoy-gateway" {
				t.Errorf("NetworkPolicy does not admit Envoy Gateway's controller to the xDS port: %+v", np.Spec.Ingress)
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

// checkTLSMount checks the ext_proc pods, and only they, mount secret as
// the directory extproc.tls names.
func checkTLSMount(t *testing.T, objs map[string][]any, secret string) {
	t.Helper()
	cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]
	for _, want := range []string{"certFile: /etc/infergate/tls/tls.crt", "keyFile: /etc/infergate/tls/tls.key", "clientCAFile: /etc/infergate/tls/ca.crt"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	for _, o := range objs["apps/v1/Deployment"] {
		d := o.(*appsv1.Deployment)
		spec := d.Spec.Template.Spec
		var mounted, fromSecret bool
		for _, m := range spec.Containers[0].VolumeMounts {
			mounted = mounted || (m.Name == "extproc-tls" && m.MountPath == "/etc/infergate/tls" && m.SubPath == "")
		}
		for _, v := range spec.Volumes {
			fromSecret = fromSecret || (v.Name == "extproc-tls" && v.Secret != nil && v.Secret.SecretName == secret)
		}
		if want := !strings.HasSuffix(d.Name, "-controller"); mounted != want || fromSecret != want {
			t.Errorf("%s: TLS Secret mounted %v, volume %v; want %v", d.Name, mounted, fromSecret, want)
		}
	}
}

// checkNetworkPolicy checks the policy selects every infergate pod and
// admits peers to the ext_proc port and Prometheus to the admin port.
func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, peers int) {
	t.Helper()
	sel := np.Spec.PodSelector.MatchLabels
	if sel["app.kubernetes.io/instance"] != releaseName || sel["app.kubernetes.io/component"] != "" ||
		len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress || len(np.Spec.Ingress) != 2 {
		t.Fatalf("NetworkPolicy %+v", np.Spec)
	}
	extproc, admin := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if len(extproc.From) != peers || len(extproc.Ports) != 1 || extproc.Ports[0].Port.String() != "extproc" {
		t.Errorf("ext_proc rule %+v, want %d peers on port extproc", extproc, peers)
	}
	if len(admin.Ports) != 1 || admin.Ports[0].Port.String() != "admin" || admin.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "prometheus" {
		t.Errorf("admin rule %+v", admin)
	}
}
