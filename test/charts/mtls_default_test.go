package charts

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// extprocConfig is the ext_proc part of the config the chart writes.
type extprocConfig struct {
	Extproc struct {
		TLS *struct {
			CertFile     string `json:"certFile"`
			KeyFile      string `json:"keyFile"`
			ClientCAFile string `json:"clientCAFile"`
		} `json:"tls"`
		InsecureOpenToNetwork *bool `json:"insecureOpenToNetwork"`
	} `json:"extproc"`
}

func extprocOf(t *testing.T, objs map[string][]any) extprocConfig {
	t.Helper()
	var cfg extprocConfig
	if err := yaml.Unmarshal([]byte(findConfigMap(objs, releaseName+"-config").Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The default install (a plain Envoy) serves the ext_proc port over mutual
// TLS: infergate's config names its certificate and the CA it demands
// client certificates from, never the plaintext opt-in; the pod mounts the
// generated Secret; Envoy's client certificate is a Secret of its own, and
// the NOTES say where Envoy mounts it and which name it checks.
func TestDefaultInstallIsMutualTLS(t *testing.T) {
	r, err := render(t, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, r)
	cfg := extprocOf(t, objs)
	if tls := cfg.Extproc.TLS; tls == nil || tls.ClientCAFile != "/etc/infergate/tls/ca.crt" ||
		tls.CertFile != "/etc/infergate/tls/tls.crt" || tls.KeyFile != "/etc/infergate/tls/tls.key" {
		t.Errorf("the default config's extproc.tls %+v: want infergate's certificate and a client CA", tls)
	}
	if cfg.Extproc.InsecureOpenToNetwork != nil {
		t.Errorf("the default config opts into plaintext: insecureOpenToNetwork %v", *cfg.Extproc.InsecureOpenToNetwork)
	}
	server, client := releaseName+"-extproc-tls", releaseName+"-envoy-client"
	checkTLSMount(t, objs, server)
	secrets := map[string]*corev1.Secret{}
	for _, o := range objs["v1/Secret"] {
		secrets[o.(*corev1.Secret).Name] = o.(*corev1.Secret)
	}
	for _, name := range []string{server, client} {
		s := secrets[name]
		if s == nil || s.Type != corev1.SecretTypeTLS || len(s.Data["tls.crt"]) == 0 || len(s.Data["tls.key"]) == 0 || len(s.Data["ca.crt"]) == 0 {
			t.Errorf("Secret %s: %+v, want a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt", name, s)
		}
	}
	// No Deployment mounts Envoy's key: it is for Envoy alone.
	for _, o := range objs["apps/v1/Deployment"] {
		for _, v := range o.(*appsv1.Deployment).Spec.Template.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == client {
				t.Errorf("%s mounts Envoy's client certificate", o.(*appsv1.Deployment).Name)
			}
		}
	}
	// Envoy's side: the cluster of envoy/snippet-mtls.yaml, the client
	// Secret mounted where it reads it, SNI and SAN the name infergate's
	// certificate carries.
	fqdn := releaseName + "." + namespace + ".svc.cluster.local"
	for _, want := range []string{"over mutual TLS, Secret " + server, "envoy/snippet-mtls.yaml", "sni, and the DNS SAN it matches:  " + fqdn,
		"/etc/envoy/infergate-tls:         Secret " + client, "every request 503", "extproc.tls.enabled=false"} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES lack %q:\n%s", want, r.notes)
		}
	}
	if strings.Contains(r.notes, "WARNING") {
		t.Errorf("NOTES warn of a plaintext port:\n%s", r.notes)
	}
}

// Where the client certificate must come from elsewhere (Envoy Gateway:
// the Gateway's backend TLS; Istio: the mesh's mTLS), "auto" keeps the
// ext_proc port as it was: plaintext, with the NOTES' warning, and no
// generated certificate. An explicit false does the same for a plain Envoy.
func TestAutoTLSOffWhereEnvoyBringsItsOwn(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"envoygateway":   readValues(t, filepath.Join(chartDir, "ci", "envoygateway-values.yaml")),
		"istio":          readValues(t, filepath.Join(chartDir, "ci", "istio-values.yaml")),
		"explicit false": {"extproc": map[string]any{"tls": map[string]any{"enabled": false}}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(t, vals)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeAll(t, r)
			cfg := extprocOf(t, objs)
			if cfg.Extproc.TLS != nil || cfg.Extproc.InsecureOpenToNetwork == nil || !*cfg.Extproc.InsecureOpenToNetwork {
				t.Errorf("extproc %+v, want plaintext by explicit opt-in", cfg.Extproc)
			}
			for _, o := range objs["v1/Secret"] {
				if s := o.(*corev1.Secret); strings.HasSuffix(s.Name, "-extproc-tls") || strings.HasSuffix(s.Name, "-envoy-client") {
					t.Errorf("Secret %s rendered without mutual TLS", s.Name)
				}
			}
			// The ci variants guard the port with a NetworkPolicy or the mesh.
			if name == "explicit false" && !strings.Contains(r.notes, "WARNING: the ext_proc port accepts any client") {
				t.Errorf("NOTES do not warn of the plaintext port:\n%s", r.notes)
			}
		})
	}
}

// xdsConfig is the xDS part of the config the chart writes.
type xdsConfig struct {
	XDS struct {
		TLS *struct {
			CertFile     string `json:"certFile"`
			ClientCAFile string `json:"clientCAFile"`
		} `json:"tls"`
		InsecureOpenToNetwork *bool `json:"insecureOpenToNetwork"`
	} `json:"xds"`
}

// The xDS port follows the ext_proc port for a plain Envoy (its one
// client), with the same Secret, mounted also by the controller that
// serves it in scaled mode; elsewhere, or when asked, it stays plaintext.
func TestXDSTLSFollowsTheExtProcPort(t *testing.T) {
	models := map[string]any{"virtualModels": []any{map[string]any{"name": "m", "pools": []any{map[string]any{"cluster": "a"}}}}}
	eg := readValues(t, filepath.Join(chartDir, "ci", "envoygateway-values.yaml"))
	eg["config"].(map[string]any)["virtualModels"] = models["virtualModels"]
	for _, c := range []struct {
		name string
		vals map[string]any
		tls  bool
	}{
		{"serve, the defaults", map[string]any{"config": models}, true},
		{"scaled, the defaults", map[string]any{"mode": "scaled", "redis": map[string]any{"address": "redis:6379"}, "config": models}, true},
		{"xds.tls.enabled false", map[string]any{"config": models, "xds": map[string]any{"tls": map[string]any{"enabled": false}}}, false},
		{"extproc.tls.enabled false", map[string]any{"config": models, "extproc": map[string]any{"tls": map[string]any{"enabled": false}}}, false},
		{"Envoy Gateway", eg, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := render(t, c.vals)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeAll(t, r)
			var cfg xdsConfig
			if err := yaml.Unmarshal([]byte(findConfigMap(objs, releaseName+"-config").Data["config.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			gotTLS := cfg.XDS.TLS != nil && cfg.XDS.TLS.ClientCAFile == "/etc/infergate/tls/ca.crt" && cfg.XDS.TLS.CertFile == "/etc/infergate/tls/tls.crt"
			plain := cfg.XDS.InsecureOpenToNetwork != nil && *cfg.XDS.InsecureOpenToNetwork
			if gotTLS != c.tls || plain == c.tls {
				t.Errorf("xds %+v: want mutual TLS %v, else plaintext by explicit opt-in", cfg.XDS, c.tls)
			}
			// Every pod serving xDS over TLS mounts the certificate.
			for _, o := range objs["apps/v1/Deployment"] {
				d := o.(*appsv1.Deployment)
				if !c.tls || (c.vals["mode"] == "scaled" && !strings.HasSuffix(d.Name, "-controller")) {
					continue
				}
				mounted := false
				for _, v := range d.Spec.Template.Spec.Volumes {
					mounted = mounted || (v.Secret != nil && v.Secret.SecretName == releaseName+"-extproc-tls")
				}
				if !mounted {
					t.Errorf("%s serves xDS over TLS without the certificate mounted", d.Name)
				}
			}
			if c.tls && !strings.Contains(r.notes, "infergate-xds cluster the transport_socket") {
				t.Errorf("NOTES do not say Envoy's xDS cluster needs TLS:\n%s", r.notes)
			}
		})
	}
	if _, err := render(t, map[string]any{"xds": map[string]any{"tls": map[string]any{"enabled": true}},
		"extproc": map[string]any{"tls": map[string]any{"enabled": false}}}); err == nil || !strings.Contains(err.Error(), "turn extproc.tls on") {
		t.Errorf("xds.tls without extproc.tls: %v, want a refusal", err)
	}
}
