package tally

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/openai"
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
		var api openai.API
		u, model, content := j.read(&api)
		if api != openai.APIChat {
			t.Errorf("%s: read as %q", tc.name, api)
		}
		if u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.comp || model != tc.model || !content {
			t.Errorf("%s: usage %+v, model %q, content %v", tc.name, u, model, content)
		}
	}
	// No usage at all in a large body: none invented.
	var api openai.API
	if u, _, _ := feedJSON(`{"model":"m","x":"`+strings.Repeat("a", 1<<20)+`"}`, 4096).read(&api); u != nil {
		t.Errorf("usage %+v from a body without one", u)
	}
}

// A large answer of each API is read from its ends in the API's names;
// a batch of embeddings carries no content (no first token).
func TestJSONBodyReadsEachAPIAtAnySize(t *testing.T) {
	pad := strings.Repeat("x", 200<<10)
	for _, tc := range []struct {
		body         string
		api          openai.API
		prompt, comp int
		content      bool
	}{
		{`{"object":"list","data":[{"object":"embedding","index":0,"embedding":"` + pad + `"}],"model":"e","usage":{"prompt_tokens":9,"total_tokens":9}}`,
			openai.APIEmbeddings, 9, 0, false},
		{`{"id":"resp_1","object":"response","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"` + pad + `"}]}],"usage":{"input_tokens":5,"output_tokens":7000,"total_tokens":7005},"metadata":{}}`,
			openai.APIResponses, 5, 7000, true},
		{`{"id":"msg_1","type":"message","model":"m","content":[{"type":"text","text":"` + pad + `"}],"usage":{"input_tokens":5,"cache_read_input_tokens":2,"output_tokens":7000}}`,
			openai.APIMessages, 7, 7000, true},
	} {
		for _, known := range []bool{true, false} {
			api := tc.api
			if !known {
				api = "" // named from the response's start
			}
			u, model, content := feedJSON(tc.body, 16<<10).read(&api)
			if api != tc.api || u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.comp || model == "" || content != tc.content {
				t.Errorf("%s (known %v): read as %q, usage %+v, model %q, content %v", tc.api, known, api, u, model, content)
			}
		}
	}
}
