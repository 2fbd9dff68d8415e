package kube

import (
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
}

func TestHelmSmoke(t *testing.T) {
	c := startCluster(t)
	rel, err := c.helmInstall(t, "llm", "infergate", ciValues(t, "default"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s", rel.Name, rel.Info.Status)
}
