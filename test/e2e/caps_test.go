package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// capKeys are every spelling of an output cap a pool may read.
var capKeys = []string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

// capPolicy caps every request's output at 64 tokens without denying a
// larger one (the example policies deny it), and accepts one cost the gate
// cannot bound: previous_response_id.
const capPolicy = `package infergate.authz

default allow := false

allow if input.principal.type == "api_key"

max_tokens := 64

allow_unbounded contains "previous_response_id"
`

// Through real Envoy and a real Rego policy capping output at 64 tokens:
// however a client spells its output cap, and however many spellings it
// sends, the body that reaches the pool carries none above the cap; a
// spelling the API does not define is refused on Responses and Messages;
// and a response whose cost the gate cannot bound (background,
// conversation, a stored prompt) is refused unless the policy accepts it,
// never reaching a pool.
func TestOutputCapsAndUnboundedCosts(t *testing.T) {
	t.Parallel()
	const tierCap = 64 // capPolicy's max_tokens
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(capPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startStackWith(t, policyConfig(writeKeys(t), dir, ""), 1)
	const key = "sk-load-0001"
	hdr := map[string]string{"x-mock-ttft-ms": "1", "x-mock-itl-ms": "1"}
	msgs := `"messages":[{"role":"user","content":"tell me a story about envoy"}]`

	t.Run("capped", func(t *testing.T) {
		for _, c := range []call{
			{path: "/v1/chat/completions", body: `{"model":"pool-a","max_completion_tokens":1,"max_tokens":50000,` + msgs + `}`},
			{path: "/v1/chat/completions", body: `{"model":"pool-a","max_tokens":1,"max_completion_tokens":50000,` + msgs + `}`},
			{path: "/v1/chat/completions", body: `{"model":"pool-a","stream":true,"max_tokens":9000,"max_completion_tokens":50000,` + msgs + `}`},
			{path: "/v1/chat/completions", body: `{"model":"pool-a","max\u005ftokens":50000,` + msgs + `}`},
			{path: "/v1/completions", body: `{"model":"pool-a","prompt":"tell me a story","max_completion_tokens":1,"max_tokens":50000}`},
			{path: "/v1/responses", body: `{"model":"pool-a","input":"tell me a story","max_output_tokens":50000}`},
			{path: "/v1/messages", body: `{"model":"pool-a","max_tokens":50000,` + msgs + `}`},
			// The one unbounded cost the policy accepts: admitted, capped.
			{path: "/v1/responses", body: `{"model":"pool-a","input":"hi","previous_response_id":"resp_1"}`},
		} {
			c.method, c.key, c.hdr = "POST", key, hdr
			before := s.PoolA.Served()
			if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: status %d %+v", c.path, c.body, resp.StatusCode, e)
			}
			if got := s.PoolA.Served(); got != before+1 {
				t.Fatalf("%s: the pool served %d requests, want 1", c.path, got-before)
			}
			_, b := s.PoolA.LastRequest()
			var body map[string]json.RawMessage
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("upstream body %q: %v", b, err)
			}
			capped := 0
			for _, k := range capKeys {
				v, ok := body[k]
				if !ok {
					continue
				}
				capped++
				if n, err := strconv.Atoi(string(v)); err != nil || n > tierCap {
					t.Errorf("%s %s: upstream %s is %s, above the cap %d (body %s)", c.path, c.body, k, v, tierCap, b)
				}
			}
			if capped == 0 {
				t.Errorf("%s: upstream body carries no cap: %s", c.path, b)
			}
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			path, body, param string
		}{
			// Caps and multipliers the API does not define.
			{"/v1/responses", `{"model":"pool-a","input":"hi","max_output_tokens":1,"max_tokens":50000}`, "max_tokens"},
			{"/v1/responses", `{"model":"pool-a","input":"hi","n":4}`, "n"},
			{"/v1/messages", `{"model":"pool-a","max_tokens":1,"max_completion_tokens":50000,` + msgs + `}`, ""},
			// Costs the gate cannot bound, which the policy does not accept.
			{"/v1/responses", `{"model":"pool-a","input":"hi","max_output_tokens":8,"background":true}`, "background"},
			{"/v1/responses", `{"model":"pool-a","input":"hi","max_output_tokens":8,"conversation":"conv_1"}`, "conversation"},
			{"/v1/responses", `{"model":"pool-a","max_output_tokens":8,"prompt":{"id":"pmpt_1","variables":{"x":"y"}}}`, "prompt"},
			{"/v1/responses", `{"model":"pool-a","input":"hi","max_output_tokens":8,"background":true,"previous_response_id":"resp_1"}`, "background"},
		} {
			c := call{method: "POST", path: tc.path, key: key, body: tc.body, hdr: hdr}
			before := s.PoolA.Served()
			resp, e := c.do(t, s.Envoy.URL)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %s: status %d, want 400", tc.path, tc.body, resp.StatusCode)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("%s %s: error %+v, want one naming %s", tc.path, tc.body, e.Error, tc.param)
			}
			if got := s.PoolA.Served(); got != before {
				t.Errorf("%s %s: reached the pool", tc.path, tc.body)
			}
		}
	})
}
