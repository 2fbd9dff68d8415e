package tally

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

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
// 6 MiB logprobs answer costs the meter under 70 KiB and still settles.
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
		if kept := len(j.head) + len(j.scan.usage.buf) + len(j.scan.model.buf); kept > MaxKept {
			t.Fatalf("%s: kept %d bytes", tc.name, kept)
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
		cached       int
		content      bool
	}{
		{`{"object":"list","data":[{"object":"embedding","index":0,"embedding":"` + pad + `"}],"model":"e","usage":{"prompt_tokens":9,"total_tokens":9}}`,
			openai.APIEmbeddings, 9, 0, 0, false},
		{`{"id":"resp_1","object":"response","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"` + pad + `"}]}],"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":3},"output_tokens":7000,"total_tokens":7005},"metadata":{}}`,
			openai.APIResponses, 5, 7000, 3, true},
		{`{"id":"msg_1","type":"message","model":"m","content":[{"type":"text","text":"` + pad + `"}],"usage":{"input_tokens":5,"cache_read_input_tokens":2,"output_tokens":7000}}`,
			openai.APIMessages, 7, 7000, 2, true},
		{`{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + pad + `"}}],"usage":{"prompt_tokens":1030,"completion_tokens":7000,"total_tokens":8030,"prompt_tokens_details":{"cached_tokens":1024}}}`,
			openai.APIChat, 1030, 7000, 1024, true},
	} {
		for _, known := range []bool{true, false} {
			api := tc.api
			if !known {
				api = "" // named from the response's start
			}
			u, model, content := feedJSON(tc.body, 16<<10).read(&api)
			if api != tc.api || u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.comp || u.CachedTokens != tc.cached || model == "" || content != tc.content {
				t.Errorf("%s (known %v): read as %q, usage %+v, model %q, content %v", tc.api, known, api, u, model, content)
			}
		}
	}
}

// vLLM writes prompt_logprobs and prompt_token_ids after the usage: a
// non-streamed answer with 200 KiB of them is read for the pool's usage,
// split at every chunk boundary (the usage key, its value, an escape, a
// string of the logprobs cut anywhere).
func TestJSONBodyReadsUsageBeforePromptLogprobs(t *testing.T) {
	var lp strings.Builder
	lp.WriteString(`[null`)
	for i := 0; lp.Len() < 200<<10; i++ {
		lp.WriteString(`,{"` + strconv.Itoa(i) + `":{"logprob":-0.25,"rank":1,"decoded_token":"\"usage\":{\"prompt_tokens\":1}}"}}`)
	}
	lp.WriteString(`]`)
	body := `{"id":"cmpl-1","object":"chat.completion","model":"llama-70b","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":4000,"completion_tokens":3500,"total_tokens":7500},` +
		`"prompt_logprobs":` + lp.String() + `,"prompt_token_ids":[1,2,3],"kv_transfer_params":null}`
	check := func(t *testing.T, j *jsonBody) {
		t.Helper()
		var api openai.API
		u, model, content := j.read(&api)
		if api != openai.APIChat || u == nil || u.PromptTokens != 4000 || u.CompletionTokens != 3500 || model != "llama-70b" || !content {
			t.Fatalf("read as %q: usage %+v, model %q, content %v", api, u, model, content)
		}
	}
	check(t, feedJSON(body, 16<<10))
	// Every split of the body's first part (to past the usage) and of a
	// window around its end; the middle is the same bytes again.
	usageAt := strings.Index(body, `"usage"`)
	cuts := make([]int, 0, 2000)
	for i := 1; i < usageAt+200; i++ {
		cuts = append(cuts, i)
	}
	for i := len(body) - 300; i < len(body); i++ {
		cuts = append(cuts, i)
	}
	for _, i := range cuts {
		var j jsonBody
		j.write([]byte(body[:i]))
		j.write([]byte(body[i:]))
		check(t, &j)
	}
	// Byte by byte.
	check(t, feedJSON(body, 1))
}

// What the single pass reads of a body is what encoding/json reads: the
// top-level usage (the last one, as encoding/json keeps) and model, for
// any split of the body into chunks. A usage value over its cap, or a
// top-level key with an escape, is read as none (the reservation stays).
func FuzzJSONBody(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"choices":[]}`,
		`{"usage":{"prompt_tokens":3,"completion_tokens":1},"prompt_logprobs":[null,{"1":{"logprob":-1,"decoded_token":"\"usage\""}}]}`,
		`{"a":"}\"{","usage":null,"b":[1,{"usage":{"prompt_tokens":9}}],"usage":{"prompt_tokens":2,"completion_tokens":2}}`,
		`{"model":"x\u0041","usage":{"prompt_tokens":1, "completion_tokens" : 5 } , "n":-1.5e3 ,"t":true}`,
		`{"us\u0061ge":{"prompt_tokens":1}}`,
		`  { "usage" : { "prompt_tokens" : 1 , "completion_tokens" : 2 } }  `,
		`{"usage":{"prompt_tokens":1}} trailing`,
		`[{"usage":{"prompt_tokens":1}}]`,
		`{"usage":{"prompt_tokens":1,"completion_tokens":2},"model":null}`,
	} {
		f.Add(seed, uint64(7))
	}
	f.Fuzz(func(t *testing.T, body string, splits uint64) {
		var j jsonBody
		rest := []byte(body)
		for len(rest) > 0 {
			n := min(int(splits%17)+1, len(rest))
			splits = splits/17 + 1
			j.write(rest[:n])
			rest = rest[n:]
		}
		if kept := len(j.head) + len(j.scan.usage.buf) + len(j.scan.model.buf); kept > MaxKept {
			t.Fatalf("kept %d bytes", kept)
		}
		var doc map[string]json.RawMessage
		valid := json.Unmarshal([]byte(body), &doc) == nil && doc != nil
		s := &j.scan
		if !valid {
			return // nothing to compare with; bounded and no panic
		}
		if s.bad {
			t.Fatalf("a JSON object read as not one: %q", body)
		}
		if s.escapedKey {
			if u := s.usage.read(openai.APIChat, true); u != nil {
				t.Fatalf("usage %+v read with an escaped key", u)
			}
			return
		}
		want, ok := doc["usage"]
		switch {
		case !ok:
			if s.usage.done {
				t.Fatalf("usage %q read from a body without one: %q", s.usage.buf, body)
			}
		case len(want) > maxUsageValue:
			if s.usage.done {
				t.Fatalf("usage of %d bytes read whole", len(want))
			}
		default:
			if !s.usage.done || !jsonEqual(t, s.usage.buf, want) {
				t.Fatalf("usage %q (done %v), encoding/json reads %q in %q", s.usage.buf, s.usage.done, want, body)
			}
		}
		if m, ok := doc["model"]; ok && len(m) <= maxModelValue {
			if !s.model.done || !jsonEqual(t, s.model.buf, m) {
				t.Fatalf("model %q, encoding/json reads %q in %q", s.model.buf, m, body)
			}
		}
	})
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("copied value %q is not JSON: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// The per-chunk path on a 4 MiB answer, mostly prompt_logprobs after its
// usage, in Envoy's 16 KiB chunks.
func BenchmarkBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"id":"cmpl-1","object":"chat.completion","model":"llama-70b","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],` +
		`"usage":{"prompt_tokens":40000,"completion_tokens":1,"total_tokens":40001},"prompt_logprobs":[null`)
	for i := 0; sb.Len() < 4<<20; i++ {
		sb.WriteString(`,{"` + strconv.Itoa(i) + `":{"logprob":-0.125,"rank":3,"decoded_token":" the\"x"}}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var r Response
		for p := body; len(p) > 0; {
			n := min(16<<10, len(p))
			r.Body(p[:n], time.Time{})
			p = p[n:]
		}
		r.End(time.Time{})
		if r.Usage == nil || r.Usage.PromptTokens != 40000 {
			b.Fatalf("usage %+v", r.Usage)
		}
	}
}
