// Package charts tests the Helm chart in charts/infergate: it lints and
// renders every values variant in charts/infergate/ci, decodes each rendered
// object strictly into its typed API, compares the output with golden files,
// and runs Envoy Gateway's own translator on the Envoy Gateway resources.
//
// It is its own Go module so that the Kubernetes, Envoy Gateway, Istio and
// Helm libraries stay out of infergate's go.mod.
package charts

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	repoRoot    = "../.."
	chartDir    = repoRoot + "/charts/infergate"
	releaseName = "infergate"
	namespace   = "llm"
)

// kubeVersion is the Kubernetes version the chart is rendered and linted
// for: the oldest it supports (Chart.yaml kubeVersion; the preStop sleep
// action needs 1.30).
var kubeVersion = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

// variant is one values file under charts/infergate/ci.
type variant struct {
	name   string // "default" for ci/default-values.yaml
	values string // path
}

func variants(t *testing.T) []variant {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []variant
	for _, f := range files {
		vs = append(vs, variant{name: strings.TrimSuffix(filepath.Base(f), "-values.yaml"), values: f})
	}
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.name
	}
	// The variants the chart promises; a missing one is a test failure, not
	// a silently smaller test.
	for _, want := range []string{"default", "envoygateway", "istio", "scaled"} {
		if !contains(names, want) {
			t.Fatalf("ci/%s-values.yaml is missing (have %v)", want, names)
		}
	}
	return vs
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return vals.AsMap()
}

// rendered is a chart rendered as `helm template` would: the manifest
// documents in install order and the NOTES.
type rendered struct {
	manifest string
	docs     []string
	notes    string
}

// render renders the chart with vals, as `helm install --dry-run` without a
// cluster (values.schema.json is checked on the way).
func render(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = kubeVersion
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, err
	}
	r := &rendered{manifest: rel.Manifest, notes: rel.Info.Notes}
	for _, doc := range strings.Split(rel.Manifest, "\n---\n") {
		if strings.TrimSpace(stripComments(doc)) != "" {
			r.docs = append(r.docs, doc)
		}
	}
	return r, nil
}

func mustRender(t *testing.T, v variant) *rendered {
	t.Helper()
	r, err := render(t, readValues(t, v.values))
	if err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	return r
}

var commentLine = regexp.MustCompile(`(?m)^\s*#.*$`)

func stripComments(doc string) string { return commentLine.ReplaceAllString(doc, "") }

// TestLint runs `helm lint --strict` (warnings fail too) with each variant.
func TestLint(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			linter := lint.AllWithKubeVersion(chartDir, readValues(t, v.values), namespace, kubeVersion)
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("%s", m)
				} else {
					t.Logf("%s", m)
				}
			}
		})
	}
}

// TestGolden compares each variant's rendered manifests and NOTES with
// testdata/<variant>.yaml and testdata/<variant>.notes.txt (-update
// rewrites them).
func TestGolden(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			r := mustRender(t, v)
			golden(t, filepath.Join("testdata", v.name+".yaml"), []byte(maskGenerated(r.manifest)))
			golden(t, filepath.Join("testdata", v.name+".notes.txt"), []byte(r.notes))
		})
	}
}

// generatedPEM is a PEM file, base64 in a Secret's data, as Helm's genCA
// and genSignedCert make it: new keys on every render.
var generatedPEM = regexp.MustCompile(`(?m)^(\s+(?:tls\.crt|tls\.key|ca\.crt): )LS0t[A-Za-z0-9+/=]+$`)

// maskGenerated replaces the generated certificates and keys, which differ
// on every render, so that a golden file stays stable; TestDefaultInstallIsMutualTLS
// and TestStrictDecodeCombinations check what they are.
func maskGenerated(manifest string) string {
	return generatedPEM.ReplaceAllString(manifest, "${1}GENERATED")
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is out of date; run `go test -update` in test/charts and review the diff:\n%s", path, diff(string(want), string(got)))
	}
}

// diff shows the first lines that differ, enough to see what changed.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			out = append(out, "line "+itoa(i+1)+":\n  want: "+wl+"\n  got:  "+gl)
			if len(out) == 5 {
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func itoa(i int) string {
	b, _ := yaml.Marshal(i)
	return strings.TrimSpace(string(b))
}

// kinds lists "apiVersion/kind name" of every rendered object, sorted.
func kinds(t *testing.T, r *rendered) []string {
	t.Helper()
	var out []string
	for _, doc := range r.docs {
		var h header
		if err := yaml.Unmarshal([]byte(doc), &h); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		out = append(out, h.APIVersion+"/"+h.Kind+" "+h.Metadata.Namespace+"/"+h.Metadata.Name)
	}
	sort.Strings(out)
	return out
}

// header is the part of an object every kind has.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}
