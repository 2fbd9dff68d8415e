package weightsink

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// apiServer is the part of the Kubernetes API the sinks use: get and
// replace one object, with resourceVersion checks (409 on a stale write),
// bearer-token authentication and the API's Status objects on errors, so
// client-go reads them as it would a real server's.
type apiServer struct {
	path    string
	mu      sync.Mutex
	obj     map[string]any
	version int
	puts    int
	agent   string
	// conflictOnce makes the next replace fail as if someone else wrote first.
	conflictOnce bool
	// forbidPut refuses replaces, as RBAC does without the update verb.
	forbidPut bool
}

func status(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "reason": reason, "message": message, "code": code,
	})
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.agent = r.UserAgent()
	if r.Header.Get("authorization") != "Bearer sa-token" {
		status(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if r.URL.Path != a.path {
		status(w, http.StatusNotFound, "NotFound", r.URL.Path+" not found")
		return
	}
	md := a.obj["metadata"].(map[string]any)
	w.Header().Set("content-type", "application/json")
	switch r.Method {
	case http.MethodGet:
		md["resourceVersion"] = strconv.Itoa(a.version)
		_ = json.NewEncoder(w).Encode(a.obj)
	case http.MethodPut:
		if a.forbidPut {
			status(w, http.StatusForbidden, "Forbidden", `user "system:serviceaccount:ai:infergate" cannot update resource`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var in map[string]any
		if err := json.Unmarshal(b, &in); err != nil || r.Header.Get("content-type") != "application/json" {
			status(w, http.StatusBadRequest, "BadRequest", "bad body")
			return
		}
		if a.conflictOnce {
			a.conflictOnce = false
			a.version++ // someone else's write
			status(w, http.StatusConflict, "Conflict", "the object has been modified")
			return
		}
		if in["metadata"].(map[string]any)["resourceVersion"] != strconv.Itoa(a.version) {
			status(w, http.StatusConflict, "Conflict", "the object has been modified")
			return
		}
		a.obj, a.version = in, a.version+1
		a.puts++
		_ = json.NewEncoder(w).Encode(a.obj)
	default:
		status(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method)
	}
}

// startAPI serves object over TLS and returns the config a ServiceAccount
// token gives (the CA pinned, no kubeconfig).
func startAPI(t *testing.T, path, object string) (*apiServer, *rest.Config) {
	t.Helper()
	a := &apiServer{path: path, version: 7}
	if err := json.Unmarshal([]byte(object), &a.obj); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(a)
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return a, &rest.Config{Host: srv.URL, BearerToken: "sa-token", TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
}

func newKube(t *testing.T, cfg *rest.Config) *Kube {
	t.Helper()
	kube, err := NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

const apiHTTPRoute = `{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute",
 "metadata":{"name":"llm","namespace":"ai"},
 "spec":{"rules":[
  {"matches":[{"headers":[{"name":"x-infergate-model","value":"llama"}]}],
   "backendRefs":[{"name":"pool-a","port":8000,"weight":100},{"name":"pool-b","port":8000,"weight":0}]},
  {"matches":[{"path":{"type":"PathPrefix","value":"/"}}],"backendRefs":[{"name":"pool-a","port":8000}]}]}}`

func TestHTTPRouteThroughTheAPI(t *testing.T) {
	api, cfg := startAPI(t, "/apis/gateway.networking.k8s.io/v1/namespaces/ai/httproutes/llm", apiHTTPRoute)
	r := &HTTPRoute{Kube: newKube(t, cfg), Namespace: "ai", Name: "llm"}
	if err := r.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(api.agent, kubeUserAgent) {
		t.Errorf("user agent %q", api.agent)
	}
	if got := r.Resolve("httproute/ai/llm/rule/0/backend/1"); got != "pool-b" {
		t.Errorf("resolve = %q", got)
	}
	api.conflictOnce = true // a concurrent edit: read again, then write
	if err := r.Apply(t.Context(), map[string]map[string]uint32{"llama": {"pool-a": 30, "pool-b": 70}}); err != nil {
		t.Fatal(err)
	}
	refs := api.obj["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)["backendRefs"].([]any)
	if w := refs[1].(map[string]any)["weight"]; w != 70.0 || refs[0].(map[string]any)["weight"] != 30.0 || api.puts != 1 {
		t.Errorf("weights %v, %d writes", refs, api.puts)
	}
	if err := r.Apply(t.Context(), map[string]map[string]uint32{"llama": {"pool-a": 30, "pool-b": 70}}); err != nil || api.puts != 1 {
		t.Errorf("an unchanged apply wrote (%v, %d writes)", err, api.puts)
	}
	if err := r.Apply(t.Context(), map[string]map[string]uint32{"mistral": {"pool-a": 100}}); err == nil {
		t.Error("a model without a rule applied")
	}

	// RBAC without update: the error names the object and keeps the API's word.
	api.forbidPut = true
	err := r.Apply(t.Context(), map[string]map[string]uint32{"llama": {"pool-a": 50, "pool-b": 50}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "httproute ai/llm") || !strings.Contains(err.Error(), "cannot update resource") {
		t.Errorf("forbidden: %v", err)
	}
	api.forbidPut = false

	for name, c := range map[string]*rest.Config{
		"no token":  {Host: cfg.Host, TLSClientConfig: cfg.TLSClientConfig},
		"bad token": {Host: cfg.Host, BearerToken: "stale", TLSClientConfig: cfg.TLSClientConfig},
	} {
		bad := &HTTPRoute{Kube: newKube(t, c), Namespace: "ai", Name: "llm"}
		if err := bad.Load(t.Context()); !apierrors.IsUnauthorized(err) || !strings.Contains(err.Error(), "httproute ai/llm") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

const apiVirtualService = `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService",
 "metadata":{"name":"llm","namespace":"ai"},
 "spec":{"hosts":["llm.ai.svc.cluster.local"],"http":[
  {"match":[{"headers":{"x-infergate-model":{"exact":"llama"}}}],
   "route":[{"destination":{"host":"vllm-a.ai.svc.cluster.local"},"weight":100},
            {"destination":{"host":"vllm-b.ai.svc.cluster.local"},"weight":0}]},
  {"route":[{"destination":{"host":"vllm-a.ai.svc.cluster.local"}}]}]}}`

func TestVirtualServiceThroughTheAPI(t *testing.T) {
	api, cfg := startAPI(t, "/apis/networking.istio.io/v1/namespaces/ai/virtualservices/llm", apiVirtualService)
	vs := &VirtualService{Kube: newKube(t, cfg), Namespace: "ai", Name: "llm"}
	if err := vs.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	api.conflictOnce = true
	err := vs.Apply(t.Context(), map[string]map[string]uint32{"llama": {"vllm-a.ai.svc.cluster.local": 20, "vllm-b.ai.svc.cluster.local": 80}})
	if err != nil {
		t.Fatal(err)
	}
	route := api.obj["spec"].(map[string]any)["http"].([]any)[0].(map[string]any)["route"].([]any)
	if route[0].(map[string]any)["weight"] != 20.0 || route[1].(map[string]any)["weight"] != 80.0 || api.puts != 1 {
		t.Errorf("route %v, %d writes", route, api.puts)
	}
	if err := vs.Apply(t.Context(), map[string]map[string]uint32{"llama": {"vllm-c": 100}}); err == nil || api.puts != 1 {
		t.Errorf("an unknown destination applied (%v, %d writes)", err, api.puts)
	}
	// Envoy reports Istio's cluster; the controller knows the destination.
	for seen, pool := range map[string]string{
		"outbound|8000||vllm-a.ai.svc.cluster.local":     "vllm-a.ai.svc.cluster.local",
		"outbound|8000|fast|vllm-a.ai.svc.cluster.local": "fast",
		"inbound|8000||":              "inbound|8000||",
		"vllm-a.ai.svc.cluster.local": "vllm-a.ai.svc.cluster.local",
		"outbound|8000||":             "outbound|8000||",
	} {
		if got := vs.Resolve(seen); got != pool {
			t.Errorf("Resolve(%q) = %q, want %q", seen, got, pool)
		}
	}
	missing := &VirtualService{Kube: vs.Kube, Namespace: "ai", Name: "other"}
	if err := missing.Load(t.Context()); !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "virtualservice ai/other") {
		t.Errorf("missing: %v", err)
	}
}

// Connect takes the kubeconfig KUBECONFIG names, and says what is missing
// when there is neither that nor a pod's service account.
func TestConnect(t *testing.T) {
	api, cfg := startAPI(t, "/apis/gateway.networking.k8s.io/v1/namespaces/ai/httproutes/llm", apiHTTPRoute)
	kubeconfig := filepath.Join(t.TempDir(), "config")
	err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: sa
  user: {token: sa-token}
contexts:
- name: test
  context: {cluster: test, user: sa}
current-context: test
`, cfg.Host, base64.StdEncoding.EncodeToString(cfg.CAData)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // as outside a pod
	t.Setenv("KUBECONFIG", kubeconfig)
	kube, err := Connect()
	if err != nil {
		t.Fatal(err)
	}
	r := &HTTPRoute{Kube: kube, Namespace: "ai", Name: "llm"}
	if err := r.Load(t.Context()); err != nil || !strings.HasPrefix(api.agent, kubeUserAgent) {
		t.Errorf("load through the kubeconfig: %v (user agent %q)", err, api.agent)
	}

	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	if _, err := Connect(); err == nil || !strings.Contains(err.Error(), "KUBECONFIG=") {
		t.Errorf("absent kubeconfig: %v", err)
	}
	t.Setenv("KUBECONFIG", "")
	if _, err := Connect(); err == nil || !strings.Contains(err.Error(), "not running in a cluster") || !strings.Contains(err.Error(), "KUBECONFIG unset") {
		t.Errorf("no credentials: %v", err)
	}
}
