package kube

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The control plane is real: RBAC on, CRDs with their schemas and CEL rules.
func TestControlPlane(t *testing.T) {
	c := startCluster(t)
	v, err := c.kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := c.dyn.Resource(crdGVR).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver %s, %d CRDs", v.GitVersion, len(crds.Items))

	// The warnings the chart tests hold to none do reach them.
	apiWarnings.take()
	if _, err := c.kube.CoreV1().Endpoints("default").List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := apiWarnings.take(); len(w) != 1 || !strings.Contains(w[0], "deprecated") {
		t.Errorf("warnings %q, want Endpoints' deprecation", w)
	}
}
