package weightsink

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// apiServer is the part of the Kubernetes API the sinks use: get and
// replace one object, with resourceVersion checks (409 on a stale write)
// and bearer-token authentication.
type apiServer struct {
	t       *testing.T
	path    string
	mu      sync.Mutex
	obj     map[string]any
	version int
	puts    int
	// conflictOnce makes the next replace fail as if someone else wrote first.
	conflictOnce bool
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("authorization") != "Bearer sa-token" {
		http.Error(w, `{"message":"Unauthorized"}`, http.StatusUnauthorized)
		return
	}
	if r.URL.Path != a.path {
		http.Error(w, `{"message":"not found"}`, http.StatusNotFound)
		return
	}
	md := a.obj["metadata"].(map[string]any)
	switch r.Method {
	case http.MethodGet:
		md["resourceVersion"] = strconv.Itoa(a.version)
		_ = json.NewEncoder(w).Encode(a.obj)
	case http.MethodPut:
		b, _ := io.ReadAll(r.Body)
		var in map[string]any
		if err := json.Unmarshal(b, &in); err != nil || r.Header.Get("content-type") != "application/json" {
			http.Error(w, `{"message":"bad body"}`, http.StatusBadRequest)
			return
		}
		if a.conflictOnce {
			a.conflictOnce = false
			a.version++ // someone else's write
			http.Error(w, `{"message":"the object has been modified"}`, http.StatusConflict)
			return
		}
		if in["metadata"].(map[string]any)["resourceVersion"] != strconv.Itoa(a.version) {
			http.Error(w, `{"message":"the object has been modified"}`, http.StatusConflict)
			return
		}
		a.obj, a.version = in, a.version+1
		a.puts++
		_ = json.NewEncoder(w).Encode(a.obj)
	default:
		http.Error(w, "", http.StatusMethodNotAllowed)
	}
}

func startAPI(t *testing.T, path, object string) (*apiServer, *Kube) {
	t.Helper()
	a := &apiServer{t: t, path: path, version: 7}
	if err := json.Unmarshal([]byte(object), &a.obj); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return a, &Kube{Base: srv.URL, TokenFile: tok, HTTP: srv.Client()}
}

const apiHTTPRoute = `{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute",
 "metadata":{"name":"llm","namespace":"ai"},
 "spec":{"rules":[
  {"matches":[{"headers":[{"name":"x-infergate-model","value":"llama"}]}],
   "backendRefs":[{"name":"pool-a","port":8000,"weight":100},{"name":"pool-b","port":8000,"weight":0}]},
  {"matches":[{"path":{"type":"PathPrefix","value":"/"}}],"backendRefs":[{"name":"pool-a","port":8000}]}]}}`

func TestHTTPRouteThroughTheAPI(t *testing.T) {
	api, kube := startAPI(t, "/apis/gateway.networking.k8s.io/v1/namespaces/ai/httproutes/llm", apiHTTPRoute)
	r := &HTTPRoute{Kube: kube, Namespace: "ai", Name: "llm"}
	if err := r.Load(t.Context()); err != nil {
		t.Fatal(err)
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
	bad := &HTTPRoute{Kube: &Kube{Base: kube.Base, HTTP: kube.HTTP}, Namespace: "ai", Name: "llm"}
	if err := bad.Load(t.Context()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("no token: %v", err)
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
	api, kube := startAPI(t, "/apis/networking.istio.io/v1/namespaces/ai/virtualservices/llm", apiVirtualService)
	vs := &VirtualService{Kube: kube, Namespace: "ai", Name: "llm"}
	if err := vs.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	err := vs.Apply(t.Context(), map[string]map[string]uint32{"llama": {"vllm-a.ai.svc.cluster.local": 20, "vllm-b.ai.svc.cluster.local": 80}})
	if err != nil {
		t.Fatal(err)
	}
	route := api.obj["spec"].(map[string]any)["http"].([]any)[0].(map[string]any)["route"].([]any)
	if route[0].(map[string]any)["weight"] != 20.0 || route[1].(map[string]any)["weight"] != 80.0 {
		t.Errorf("route %v", route)
	}
	if err := vs.Apply(t.Context(), map[string]map[string]uint32{"llama": {"vllm-c": 100}}); err == nil {
		t.Error("an unknown destination applied")
	}
}
