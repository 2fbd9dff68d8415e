package charts

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestLedgerVolume: mode serve keeps the embedded ledger on a claim (the
// chart's, or one given), rolled out with Recreate while the claim is
// ReadWriteOnce; without persistence an emptyDir and a warning; with
// Redis no ledger at all.
func TestLedgerVolume(t *testing.T) {
	for _, tc := range []struct {
		name     string
		vals     map[string]any
		claim    string // "" : no claim; "-": an emptyDir
		strategy appsv1.DeploymentStrategyType
		pvc      bool
		warning  bool
	}{
		{name: "default", vals: map[string]any{}, claim: releaseName + "-ledger", strategy: appsv1.RecreateDeploymentStrategyType, pvc: true},
		{name: "existing claim", vals: map[string]any{"ledger": map[string]any{"persistence": map[string]any{"existingClaim": "mine"}}},
			claim: "mine", strategy: appsv1.RecreateDeploymentStrategyType},
		{name: "ReadWriteMany", vals: map[string]any{"ledger": map[string]any{"persistence": map[string]any{"accessMode": "ReadWriteMany"}}},
			claim: releaseName + "-ledger", strategy: appsv1.RollingUpdateDeploymentStrategyType, pvc: true},
		{name: "no persistence", vals: map[string]any{"ledger": map[string]any{"persistence": map[string]any{"enabled": false}}},
			claim: "-", strategy: appsv1.RollingUpdateDeploymentStrategyType, warning: true},
		{name: "redis", vals: map[string]any{"redis": map[string]any{"address": "redis:6379"}}, strategy: appsv1.RollingUpdateDeploymentStrategyType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeAll(t, r)
			if got := len(objs["v1/PersistentVolumeClaim"]); got != map[bool]int{true: 1}[tc.pvc] {
				t.Errorf("%d claims rendered", got)
			}
			dep := objs["apps/v1/Deployment"][0].(*appsv1.Deployment)
			if dep.Spec.Strategy.Type != tc.strategy {
				t.Errorf("strategy %s, want %s", dep.Spec.Strategy.Type, tc.strategy)
			}
			var vol *corev1.Volume
			for i, v := range dep.Spec.Template.Spec.Volumes {
				if v.Name == "ledger" {
					vol = &dep.Spec.Template.Spec.Volumes[i]
				}
			}
			mounted := false
			for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
				mounted = mounted || (m.Name == "ledger" && m.MountPath == "/var/lib/infergate")
			}
			switch {
			case tc.claim == "" && (vol != nil || mounted):
				t.Errorf("a ledger volume with Redis: %+v", vol)
			case tc.claim == "-" && (vol == nil || vol.EmptyDir == nil || !mounted):
				t.Errorf("ledger volume %+v (mounted %v), want an emptyDir", vol, mounted)
			case tc.claim != "" && tc.claim != "-" && (vol == nil || vol.PersistentVolumeClaim == nil || vol.PersistentVolumeClaim.ClaimName != tc.claim || !mounted):
				t.Errorf("ledger volume %+v (mounted %v), want claim %s", vol, mounted, tc.claim)
			}
			cfg := findConfigMap(objs, releaseName+"-config").Data["config.yaml"]
			if want := "path: /var/lib/infergate/ledger.db"; (tc.claim != "") != strings.Contains(cfg, want) {
				t.Errorf("config.yaml:\n%s\nwant %q there: %v", cfg, want, tc.claim != "")
			}
			if got := strings.Contains(r.notes, "WARNING: ledger.persistence.enabled is false"); got != tc.warning {
				t.Errorf("NOTES warn of an emptyDir ledger: %v, want %v\n%s", got, tc.warning, r.notes)
			}
		})
	}
}
