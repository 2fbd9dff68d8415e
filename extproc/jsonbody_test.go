package extproc

import (
	"strings"
	"testing"
)

func feedJSON(body string, chunk int) *jsonBody {
	var j jsonBody
	for len(body) > 0 {
		n := min(chunk, len(body))
		j.write([]byte(body[:n]))
		body = body[n:]
	}
	return &j
}

// A response of any size is read for its usage without being held: a
// 6 MiB logprobs answer costs the meter 128 KiB and still settles.
func TestJSONBodyReadsUsageAtAnySize(t *testing.T) {
	logprobs := strings.Repeat(`{"token":"x","logprob":-0.1,"top_logprobs":[{"token":"\"usage\": {}","logprob":-1}]},`, 60_000)
	big := `{"id":"c","object":"chat.completion","model":"llama-70b","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},` +
		`"logprobs":{"content":[` + strings.TrimSuffix(logprobs, ",") + `]},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":60000,"total_tokens":60012}}`
	small := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	for _, tc := range []struct {
		name, body   string
		chunk        int
		prompt, comp int
		model        string
	}{
		{"small, one chunk", small, 1 << 20, 3, 1, "m"},
		{"small, byte by byte", small, 1, 3, 1, "m"},
		{"6 MiB, 16 KiB chunks", big, 16 << 10, 12, 60000, "llama-70b"},
		{"6 MiB, one chunk", big, 8 << 20, 12, 60000, "llama-70b"},
		{"6 MiB, 1000-byte chunks", big, 1000, 12, 60000, "llama-70b"},
	} {
		j := feedJSON(tc.body, tc.chunk)
		if len(j.head) > jsonKeep || len(j.tail) > jsonKeep {
			t.Fatalf("%s: kept %d + %d bytes", tc.name, len(j.head), len(j.tail))
		}
		u, model, content := j.read()
		if u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.comp || model != tc.model || !content {
			t.Errorf("%s: usage %+v, model %q, content %v", tc.name, u, model, content)
		}
	}
	// No usage at all in a large body: none invented.
	if u, _, _ := feedJSON(`{"model":"m","x":"`+strings.Repeat("a", 1<<20)+`"}`, 4096).read(); u != nil {
		t.Errorf("usage %+v from a body without one", u)
	}
}
