package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeapiserver "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

const repoRoot = "../.."

// The CRDs a user installs before the chart, each from the pinned release's
// own files (served by the Go module proxy, so no download besides Go's).
// Envoy Gateway's bundle carries the Gateway API CRDs it was released with.
var crdSources = []struct{ module, glob string }{
	{"github.com/envoyproxy/gateway@v1.9.1", "charts/gateway-helm/charts/crds/crds/gatewayapi-crds.yaml"},
	{"github.com/envoyproxy/gateway@v1.9.1", "charts/gateway-helm/charts/crds/crds/generated/*.yaml"},
	{"istio.io/api@v1.32.0", "kubernetes/customresourcedefinitions.gen.yaml"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"},
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds/cert-manager.io_certificates.yaml"},
	// InferencePool (v1) and the alpha InferenceObjective, as the Endpoint
	// Picker the tests run was released with.
	{"sigs.k8s.io/gateway-api-inference-extension@v1.4.0", "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"},
	{"sigs.k8s.io/gateway-api-inference-extension@v1.4.0", "config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml"},
}

// cluster is a real Kubernetes control plane without nodes: kube-apiserver
// (from k8s.io/kubernetes, pinned in go.mod) on an embedded etcd, RBAC on,
// the CRDs installed. No kubelet and no controller-manager run: objects are
// stored and validated, never scheduled, and nothing garbage-collects.
type cluster struct {
	admin      *rest.Config // system:masters
	kubeconfig string       // admin's kubeconfig file, for Helm
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	mapper     meta.RESTMapper
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	etcdURL := startEtcd(t)
	sc := storagebackend.NewDefaultConfig("/registry", nil)
	sc.Transport.ServerList = []string{etcdURL}
	srv, err := kubeapiserver.StartTestServer(t, nil, []string{"--authorization-mode=RBAC"}, sc)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Cleanup(srv.TearDownFn)
	c := &cluster{admin: rest.CopyConfig(srv.ClientConfig)}
	c.admin.QPS, c.admin.Burst = 200, 400
	c.kube = kubernetes.NewForConfigOrDie(c.admin)
	// Helm checks the chart's kubeVersion against what the server reports.
	if v, err := c.kube.Discovery().ServerVersion(); err != nil || v.GitVersion != kubeVersion(t) {
		t.Fatalf("kube-apiserver reports %v (%v), go.mod pins %s: run through make kube-test, which stamps the version", v, err, kubeVersion(t))
	}
	c.dyn = dynamic.NewForConfigOrDie(c.admin)
	c.kubeconfig = writeKubeconfig(t, c.admin)
	c.installCRDs(t)
	return c
}

func startEtcd(t testing.TB) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	local, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*local}, []url.URL{*local}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*local}, []url.URL{*local}
	cfg.InitialCluster = cfg.Name + "=" + local.String()
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd: not ready after 30s")
	}
	return "http://" + e.Clients[0].Addr().String()
}

// writeKubeconfig writes cfg as a kubeconfig file, the way Helm and the
// controller are given a cluster.
func writeKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// moduleDir is a pinned module's directory in the module cache.
func moduleDir(t testing.TB, modVersion string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", modVersion).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", modVersion, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %s %v", modVersion, m.Error, err)
	}
	return m.Dir
}

func (c *cluster) installCRDs(t testing.TB) {
	t.Helper()
	ext := apiextensions.NewForConfigOrDie(c.admin)
	var names []string
	for _, src := range crdSources {
		files, _ := filepath.Glob(filepath.Join(moduleDir(t, src.module), src.glob))
		if len(files) == 0 {
			t.Fatalf("no CRDs at %s in %s", src.glob, src.module)
		}
		for _, f := range files {
			for _, obj := range readObjects(t, f) {
				var crd apiextensionsv1.CustomResourceDefinition
				b, _ := json.Marshal(obj.Object)
				if err := json.Unmarshal(b, &crd); err != nil || obj.GetKind() != "CustomResourceDefinition" {
					t.Fatalf("%s: %s is not a CRD (%v)", f, obj.GetName(), err)
				}
				if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(t.Context(), &crd, metav1.CreateOptions{}); err != nil {
					t.Fatalf("CRD %s from %s refused: %v", crd.Name, src.module, err)
				}
				names = append(names, crd.Name)
			}
		}
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not established: %v", name, err)
		}
	}
	dc := discovery.NewDiscoveryClientForConfigOrDie(c.admin)
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	t.Logf("%d CRDs installed and established", len(names))
}

// readObjects reads every object of a multi-document YAML file.
func readObjects(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, b)
}

func decodeObjects(t testing.TB, b []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// createNamespace creates ns (and deletes it at the end; without a
// controller-manager a namespace's contents are not cascaded, so tests clean
// what they create themselves).
func (c *cluster) createNamespace(t testing.TB, ns string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	if err := c.apply(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
}

// apply creates obj, or replaces it when it exists.
func (c *cluster) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	ri, err := c.resource(obj)
	if err != nil {
		return err
	}
	_, err = ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: "test"})
	if err != nil && strings.Contains(err.Error(), "already exists") {
		cur, gerr := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		obj.SetResourceVersion(cur.GetResourceVersion())
		_, err = ri.Update(ctx, obj, metav1.UpdateOptions{FieldManager: "test"})
	}
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

func (c *cluster) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(obj.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// kubeVersion is the k8s.io/kubernetes version go.mod pins.
func kubeVersion(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod does not require k8s.io/kubernetes")
	}
	return string(m[1])
}

// namespaced reports whether obj's kind lives in a namespace.
func (c *cluster) namespaced(t testing.TB, obj *unstructured.Unstructured) bool {
	t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatal(err)
	}
	return m.Scope.Name() == meta.RESTScopeNameNamespace
}

// apiWarnings collects what the API server warns about (a deprecated API,
// a field it dropped), from every client in the process, Helm's included.
var apiWarnings = func() *warnings {
	w := &warnings{}
	rest.SetDefaultWarningHandler(w)
	return w
}()

type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// take returns the warnings since the last take.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	msgs := w.msgs
	w.msgs = nil
	return msgs
}
