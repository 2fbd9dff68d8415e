package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// poolModelsConfig lists no models: the gate lists what the two mock
// pools serve, read from their own GET /v1/models every second.
func poolModelsConfig(s *stack) string {
	return fmt.Sprintf(`
poolModels:
  pools:
  - {name: pool-a, url: "http://%s/v1/models"}
  - {name: pool-b, url: "http://%s/v1/models"}
  interval: 1s
  keepFor: 1m
  timeout: 1s
`, s.PoolA.Addr, s.PoolB.Addr)
}

// sdkModels lists and retrieves models with the official OpenAI Python
// SDK through the gateway, as key.
func sdkModels(t *testing.T, base, key, retrieve string) (ids []string, retrieved string, status int) {
	t.Helper()
	const script = `
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2])
ids = [m.id for m in c.models.list()]
try:
    one, status = c.models.retrieve(sys.argv[3]).id, 200
except openai.NotFoundError as e:
    one, status = None, e.status_code
print(json.dumps({"ids": ids, "one": one, "status": status}))
`
	python := filepath.Join(repoRoot, ".tools", "py-venv", "bin", "python")
	out, err := exec.Command(python, "-c", script, base+"/v1", key, retrieve).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("python client: %v\n%s", err, stderr)
	}
	var r struct {
		IDs    []string
		One    string
		Status int
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	return r.IDs, r.One, r.Status
}

// With no models configured, the OpenAI SDK's models.list() through the
// real Envoy lists what the pools serve, merged (a model two pools serve
// once), each caller seeing the models its tier may call (the example
// policies deny the free tier the 70b and unknown models: hidden); a
// change on a pool shows within an interval; no pool sees a client's
// listing.
func TestModelsFromPools(t *testing.T) {
	t.Parallel()
	keys, policies := writeKeys(t), filepath.Join(repoRoot, "policies")
	s := startStackFor(t, "envoy/demo.yaml", func(s *stack) string {
		return policyConfig(keys, policies, poolModelsConfig(s))
	}, 1, func(s *stack) {
		s.PoolA.SetModels("llama-3.1-8b-instruct", "llama-3.1-70b-instruct")
		s.PoolB.SetModels("llama-3.1-70b-instruct", "bge-m3", "some-new-model")
	})
	// infergate is ready once each pool has answered: no wait here.
	for _, c := range []struct {
		name, key, retrieve string
		want                []string
		status              int
	}{
		{"premium tier", "sk-acme-0001", "bge-m3",
			[]string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "bge-m3", "some-new-model"}, 200},
		{"free tier", "sk-initech-0001", "llama-3.1-70b-instruct", []string{"llama-3.1-8b-instruct", "bge-m3"}, 404},
		{"served by no pool", "sk-acme-0001", "gpt-9",
			[]string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "bge-m3", "some-new-model"}, 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids, one, status := sdkModels(t, s.Envoy.URL, c.key, c.retrieve)
			if !slices.Equal(ids, c.want) || status != c.status || (status == 200) != (one == c.retrieve) {
				t.Errorf("SDK listed %q, retrieved %q: %q %d; want %q and %d", ids, c.retrieve, one, status, c.want, c.status)
			}
		})
	}
	if status, _, code := getModels(t, s.Envoy.URL, "/v1/models", ""); status != 401 || code != "invalid_api_key" {
		t.Errorf("without a key: %d %q, want 401 invalid_api_key", status, code)
	}
	if n := s.served(); n != 0 {
		t.Errorf("pools served %d requests: the gate answers /v1/models itself", n)
	}
	// A listed model is one the caller can call.
	if resp, e := chatCall("sk-initech-0001", "bge-m3", 4).do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Errorf("free tier calling a listed model: %d %s", resp.StatusCode, e.Error.Message)
	}

	// Pool B stops serving bge-m3 and serves a new model: the next round
	// lists it so.
	s.PoolB.SetModels("llama-3.1-70b-instruct", "qwen3-8b")
	want := []string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "qwen3-8b"}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, ids, _ := getModels(t, s.Envoy.URL, "/v1/models", "sk-acme-0001")
		return slices.Equal(ids, want)
	}, fmt.Sprintf("the premium tier to list %q", want))
}

// The newcomer's setup: no policy, no keys, no models; only the pools'
// addresses. models.list() lists every model the pools serve.
func TestModelsFromPoolsWithoutPolicy(t *testing.T) {
	t.Parallel()
	s := startStackFor(t, "envoy/demo.yaml", func(s *stack) string { return testConfig + poolModelsConfig(s) }, 1, func(s *stack) {
		s.PoolA.SetModels("llama-3.1-8b-instruct")
		s.PoolB.SetModels("qwen3-8b", "llama-3.1-8b-instruct")
	})
	ids, one, status := sdkModels(t, s.Envoy.URL, "any-key", "qwen3-8b")
	if want := []string{"llama-3.1-8b-instruct", "qwen3-8b"}; !slices.Equal(ids, want) || status != 200 || one != "qwen3-8b" {
		t.Errorf("SDK listed %q, retrieved %q %d; want %q and the model", ids, one, status, want)
	}
	if n := s.served(); n != 0 {
		t.Errorf("pools served %d requests: the gate answers /v1/models itself", n)
	}
}
