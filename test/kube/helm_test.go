package kube

import (
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

var chartDir = filepath.Join(repoRoot, "charts", "infergate")

// helm is Helm as a library, acting on the cluster in one namespace, the
// way `helm --kubeconfig … -n ns` does.
func (c *cluster) helm(t *testing.T, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &c.kubeconfig, &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, ns, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return chrt
}

// ciValues reads charts/infergate/ci/<name>-values.yaml, the chart's own
// example values.
func ciValues(t *testing.T, name string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "ci", name+"-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return vals.AsMap()
}

// helmInstall installs the chart as release name into ns (no --wait: no
// kubelet runs its pods).
func (c *cluster) helmInstall(t *testing.T, ns, name string, vals map[string]any) (*release.Release, error) {
	t.Helper()
	install := action.NewInstall(c.helm(t, ns))
	install.ReleaseName, install.Namespace, install.CreateNamespace = name, ns, true
	return install.RunWithContext(t.Context(), loadChart(t), vals)
}

func (c *cluster) helmUpgrade(t *testing.T, ns, name string, vals map[string]any) (*release.Release, error) {
	t.Helper()
	upgrade := action.NewUpgrade(c.helm(t, ns))
	upgrade.Namespace = ns
	return upgrade.RunWithContext(t.Context(), name, loadChart(t), vals)
}

func (c *cluster) helmUninstall(t *testing.T, ns, name string) error {
	t.Helper()
	_, err := action.NewUninstall(c.helm(t, ns)).Run(name)
	return err
}

// helmRender renders the chart as `helm install --dry-run=server` does:
// values and templates checked, the cluster consulted, nothing written.
func (c *cluster) helmRender(t *testing.T, ns, name string, vals map[string]any) (string, error) {
	t.Helper()
	install := action.NewInstall(c.helm(t, ns))
	install.ReleaseName, install.Namespace = name, ns
	install.DryRun, install.DryRunOption = true, "server"
	rel, err := install.RunWithContext(t.Context(), loadChart(t), vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}
