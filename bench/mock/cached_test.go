package mock

import (
	"net/http"
	"strings"
	"testing"
)

// x-mock-cached-tokens reports that many prompt tokens (at most the
// prompt) read from the prompt cache, in each API's usage names.
func TestCachedTokensHeader(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	prompt := `"one two three four five"`
	for _, tc := range []struct {
		path, body, cached string
		want               []string
	}{
		{"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":` + prompt + `}]}`, "3",
			[]string{`"prompt_tokens":5,`, `"prompt_tokens_details":{"cached_tokens":3}`}},
		{"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":` + prompt + `}]}`, "99",
			[]string{`"prompt_tokens_details":{"cached_tokens":5}`}},
		{"/v1/responses", `{"model":"m","max_output_tokens":2,"input":` + prompt + `}`, "3",
			[]string{`"input_tokens":5,`, `"input_tokens_details":{"cached_tokens":3}`}},
		{"/v1/messages", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":` + prompt + `}]}`, "3",
			[]string{`"input_tokens":2,"cache_read_input_tokens":3,`}},
	} {
		resp, b := do(t, ts, http.MethodPost, tc.path, tc.body, map[string]string{"x-mock-cached-tokens": tc.cached})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, b)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s with %s cached: %s lacks %s", tc.path, tc.cached, b, w)
			}
		}
	}
	// Without the header, no details (the answer as before).
	_, b := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if strings.Contains(string(b), "prompt_tokens_details") {
		t.Errorf("details without the header: %s", b)
	}
	if resp, _ := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"x-mock-cached-tokens": "-1"}); resp.StatusCode != 400 {
		t.Errorf("x-mock-cached-tokens -1: %d", resp.StatusCode)
	}
}
