package e2e

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// modelsConfig lists models of every example tier, one of them on none
// (a premium tier's "*" still sees it).
const modelsConfig = "models: [llama-3.1-8b-instruct, llama-3.1-70b-instruct, bge-m3, some-new-model]\n"

// getModels sends GET path with key through Envoy and returns the status,
// the listed ids (or the one retrieved) and the error code.
func getModels(t *testing.T, base, path, key string) (int, []string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+path, nil)
	if key != "" {
		req.Header.Set("authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Object string
		ID     string
		Data   []struct{ ID, Object string }
		Error  struct{ Code, Type string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("GET %s: %d, body not JSON: %v", path, resp.StatusCode, err)
	}
	if ct := resp.Header.Get("content-type"); ct != "application/json" {
		t.Errorf("GET %s: content-type %q", path, ct)
	}
	var ids []string
	switch body.Object {
	case "list":
		ids = []string{}
		for _, m := range body.Data {
			ids = append(ids, m.ID)
		}
	case "model":
		ids = []string{body.ID}
	}
	return resp.StatusCode, ids, body.Error.Code
}

// GET /v1/models through the real Envoy with the example policies: the
// gate answers it, each tier seeing the configured models it may call;
// no pool sees the request.
func TestModelsListedPerTierThroughEnvoy(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), modelsConfig), 1)
	for _, c := range []struct {
		name, path, key string
		status          int
		want            []string
		code            string
	}{
		{"no key", "/v1/models", "", 401, nil, "invalid_api_key"},
		{"free tier", "/v1/models", "sk-initech-0001", 200, []string{"llama-3.1-8b-instruct", "bge-m3"}, ""},
		{"standard tier", "/v1/models", "sk-globex-0001", 200, []string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "bge-m3"}, ""},
		{"premium tier", "/v1/models", "sk-acme-0001", 200, []string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "bge-m3", "some-new-model"}, ""},
		{"premium tenant, key held to free", "/v1/models", "sk-acme-batch", 200, []string{"llama-3.1-8b-instruct", "bge-m3"}, ""},
		{"retrieve, allowed", "/v1/models/llama-3.1-70b-instruct", "sk-globex-0001", 200, []string{"llama-3.1-70b-instruct"}, ""},
		{"retrieve, not on the tier", "/v1/models/llama-3.1-70b-instruct", "sk-initech-0001", 404, nil, "model_not_found"},
		{"retrieve, not configured", "/v1/models/gpt-9", "sk-acme-0001", 404, nil, "model_not_found"},
		{"retrieve without a key", "/v1/models/bge-m3", "", 401, nil, "invalid_api_key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, ids, code := getModels(t, s.Envoy.URL, c.path, c.key)
			if status != c.status || code != c.code || !slices.Equal(ids, c.want) {
				t.Errorf("%d %q %q, want %d %q %q", status, ids, code, c.status, c.want, c.code)
			}
		})
	}
	if n := s.served(); n != 0 {
		t.Errorf("pools served %d requests: the gate answers /v1/models itself", n)
	}
	// A listed model is one the caller can call.
	if resp, e := chatCall("sk-initech-0001", "bge-m3", 4).do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Errorf("free tier calling a listed model: %d %s", resp.StatusCode, e.Error.Message)
	}
}

// The official OpenAI Python SDK lists and retrieves models through the
// gateway.
func TestOpenAISDKListsModels(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), modelsConfig), 1)
	const script = `
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2])
ids = [m.id for m in c.models.list()]
one = c.models.retrieve(ids[0])
try:
    c.models.retrieve("llama-3.1-70b-instruct")
    missing = None
except openai.NotFoundError as e:
    missing = e.status_code
print(json.dumps({"ids": ids, "one": one.id, "owned_by": one.owned_by, "missing": missing}))
`
	python := filepath.Join(repoRoot, ".tools", "py-venv", "bin", "python")
	out, err := exec.Command(python, "-c", script, s.Envoy.URL+"/v1", "sk-initech-0001").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("python client: %v\n%s", err, stderr)
	}
	var r struct {
		IDs     []string
		One     string
		OwnedBy string `json:"owned_by"`
		Missing int
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if want := []string{"llama-3.1-8b-instruct", "bge-m3"}; !slices.Equal(r.IDs, want) || r.One != want[0] ||
		r.OwnedBy != "infergate" || r.Missing != 404 {
		t.Errorf("SDK saw %+v, want the free tier's %q and a 404 for the rest", r, strings.Join(want, ", "))
	}
}
