package weightsink

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const routes = `# Envoy Gateway resources (comments survive)
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: llm, namespace: default}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: llm
  namespace: default
spec:
  parentRefs: [{name: llm}]
  rules:
  - matches:
    - headers: [{name: x-infergate-model, value: llama}]
    backendRefs:
    - {group: gateway.envoyproxy.io, kind: Backend, name: pool-a, weight: 100}
    - {group: gateway.envoyproxy.io, kind: Backend, name: pool-b}
  - matches:
    - path: {type: PathPrefix, value: /}
    backendRefs:
    - {group: gateway.envoyproxy.io, kind: Backend, name: pool-c}
`

func TestApplyAndResolve(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(routes), 0o640); err != nil {
		t.Fatal(err)
	}
	f := &File{Path: path, Name: "llm"}
	if err := f.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := f.Resolve("httproute/default/llm/rule/0/backend/1"); got != "pool-b" {
		t.Errorf("resolve backend 1 = %q", got)
	}
	if got := f.Resolve("pool-x"); got != "pool-x" {
		t.Errorf("an unknown name changed: %q", got)
	}
	if err := f.Apply(t.Context(), map[string]map[string]uint32{"llama": {"pool-a": 20, "pool-b": 80}}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	out := string(b)
	for _, want := range []string{"name: pool-a, weight: 20}", "name: pool-b, weight: 80}", "name: pool-c}", "# Envoy Gateway resources", "kind: Gateway\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("rewritten file lacks %q:\n%s", want, out)
		}
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", info.Mode())
	}
	// Unchanged weights: no write (Envoy Gateway re-translates on any).
	before, _ := os.Stat(path)
	if err := f.Apply(t.Context(), map[string]map[string]uint32{"llama": {"pool-a": 20, "pool-b": 80}}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); !after.ModTime().Equal(before.ModTime()) {
		t.Error("rewrote an unchanged file")
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}

	for _, bad := range []map[string]map[string]uint32{
		{"mistral": {"pool-a": 100}},
		{"llama": {"pool-a": 50, "pool-z": 50}},
	} {
		if err := f.Apply(t.Context(), bad); err == nil {
			t.Errorf("Apply(%v) succeeded", bad)
		}
	}
	if err := (&File{Path: path, Name: "other"}).Load(t.Context()); err == nil {
		t.Error("a missing route loaded")
	}
}

// Two InferencePools of one name, here and in another namespace: the pools
// name them namespace/name; the bare name is ambiguous and refused. What
// the meter reports (Envoy Gateway's locality, or the pool header's
// namespace/name or bare name) resolves to the pool as configured.
func TestInferencePoolsByNamespace(t *testing.T) {
	const route = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: infergate-inference, namespace: llm}
spec:
  rules:
  - matches:
    - headers: [{type: Exact, name: x-infergate-model, value: llama}]
    backendRefs:
    - {group: inference.networking.k8s.io, kind: InferencePool, name: vllm, weight: 100}
    - {group: inference.networking.k8s.io, kind: InferencePool, name: vllm, namespace: models, weight: 0}
`
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(route), 0o640); err != nil {
		t.Fatal(err)
	}
	f := &File{Path: path, Name: "infergate-inference"}
	if err := f.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	err := f.Apply(t.Context(), map[string]map[string]uint32{"llama": {"vllm": 100}})
	if err == nil || !strings.Contains(err.Error(), "2 backendRefs named vllm") {
		t.Fatalf("a bare name for two refs: %v, want refused as ambiguous", err)
	}
	if err := f.Apply(t.Context(), map[string]map[string]uint32{"llama": {"llm/vllm": 60, "models/vllm": 40}}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	for _, want := range []string{"name: vllm, weight: 60}", "name: vllm, namespace: models, weight: 40}"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("rewritten route lacks %q:\n%s", want, b)
		}
	}
	for seen, pool := range map[string]string{
		"httproute/llm/infergate-inference/rule/0/backend/0": "llm/vllm",
		"httproute/llm/infergate-inference/rule/0/backend/1": "models/vllm",
		"vllm":        "llm/vllm",
		"models/vllm": "models/vllm",
		"other":       "other",
	} {
		if got := f.Resolve(seen); got != pool {
			t.Errorf("Resolve(%q) = %q, want %q", seen, got, pool)
		}
	}
}
