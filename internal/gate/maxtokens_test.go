package gate

import (
	"encoding/json"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/openai"
)

func TestWithMaxTokens(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","messages":[]}`, `{"model":"m","messages":[],"max_tokens":64}`},
		{`{"model":"m"}` + "\n", `{"model":"m","max_tokens":64}` + "\n"},
		{`{"model":"m","max_tokens":null}`, `{"model":"m","max_tokens":64}`},
		{`{"model":"m","max_tokens":5000,"stream":true}`, `{"model":"m","max_tokens":64,"stream":true}`},
		{`{"model":"m","max_completion_tokens": 5000 }`, `{"model":"m","max_completion_tokens": 64 }`},
		// only what is above the cap is lowered; nested keys are not the request's
		{`{"max_tokens":10,"max_completion_tokens":5000,"model":"m"}`, `{"max_tokens":10,"max_completion_tokens":64,"model":"m"}`},
		{`{"model":"m","metadata":{"max_tokens":9999}}`, `{"model":"m","metadata":{"max_tokens":9999},"max_tokens":64}`},
		{`{"model":"m","max\u005ftokens":5000}`, `{"model":"m","max\u005ftokens":64}`},
	} {
		got, err := withMaxTokens([]byte(tc.in), 64, outputLimitKeys(openai.APIChat, "max_tokens")...)
		if err != nil || string(got) != tc.want {
			t.Errorf("withMaxTokens(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
			continue
		}
		if r, err := openai.ParseRequest(got); err != nil || r.MaxTokens > 64 || r.MaxTokens == 0 {
			t.Errorf("%s: parsed back as max_tokens %d, %v", got, r.MaxTokens, err)
		}
	}
	if _, err := withMaxTokens([]byte(`[1]`), 64, "max_tokens"); err == nil {
		t.Error("an array body was rewritten")
	}
}

// Each API's output cap is its own key: max_output_tokens for Responses,
// max_tokens for Anthropic's Messages (never max_completion_tokens, a key
// Anthropic refuses). Another API's cap key never reaches the rewrite:
// openai.ParseResponses and ParseMessages refuse it.
func TestWithMaxTokensPerAPI(t *testing.T) {
	for _, tc := range []struct {
		api      openai.API
		in, want string
	}{
		{openai.APIResponses, `{"model":"m","input":"hi"}`, `{"model":"m","input":"hi","max_output_tokens":64}`},
		{openai.APIResponses, `{"model":"m","max_output_tokens":10}`, `{"model":"m","max_output_tokens":10}`},
		{openai.APIMessages, `{"model":"m","max_tokens":4096,"messages":[]}`, `{"model":"m","max_tokens":64,"messages":[]}`},
		{openai.APIMessages, `{"model":"m","max_tokens":8,"messages":[]}`, `{"model":"m","max_tokens":8,"messages":[]}`},
	} {
		got, err := withMaxTokens([]byte(tc.in), 64, outputLimitKeys(tc.api, "max_tokens")...)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: withMaxTokens(%s) = %s, %v; want %s", tc.api, tc.in, got, err, tc.want)
		}
	}
}

// With gate.chatOutputLimit: max_completion_tokens a chat completion that
// names no cap gets max_completion_tokens (OpenAI's reasoning models refuse
// max_tokens); a cap the client sent is lowered under its own key, and text
// completions keep max_tokens.
func TestWithMaxTokensChatKey(t *testing.T) {
	for _, tc := range []struct {
		api      openai.API
		in, want string
	}{
		{openai.APIChat, `{"model":"o3","messages":[]}`, `{"model":"o3","messages":[],"max_completion_tokens":64}`},
		{openai.APIChat, `{"model":"m","max_tokens":500,"messages":[]}`, `{"model":"m","max_tokens":64,"messages":[]}`},
		{openai.APIChat, `{"model":"m","max_completion_tokens":500}`, `{"model":"m","max_completion_tokens":64}`},
		{openai.APICompletions, `{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":"hi","max_tokens":64}`},
	} {
		got, err := withMaxTokens([]byte(tc.in), 64, outputLimitKeys(tc.api, "max_completion_tokens")...)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: withMaxTokens(%s) = %s, %v; want %s", tc.api, tc.in, got, err, tc.want)
		}
	}
}

var (
	generatingAPIs = []openai.API{openai.APIChat, openai.APICompletions, openai.APIResponses, openai.APIMessages}
	chatKeys       = []string{"max_tokens", "max_completion_tokens"}
)

// capSpellings are the output cap keys each API's servers read.
var capSpellings = map[openai.API][]string{
	openai.APIChat:        {"max_tokens", "max_completion_tokens"},
	openai.APICompletions: {"max_tokens", "max_completion_tokens"},
	openai.APIResponses:   {"max_output_tokens"},
	openai.APIMessages:    {"max_tokens"},
}

func FuzzWithMaxTokens(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5000,"messages":[]}`), 64, uint8(0))
	f.Add([]byte(`{"model":"m","max_completion_tokens":null}`), 1, uint8(0))
	f.Add([]byte(`{"model":"m","max_output_tokens":9000,"input":"hi"}`), 64, uint8(2))
	f.Add([]byte(`{"model":"m","max_tokens":9000,"messages":[{"role":"user","content":"hi"}]}`), 64, uint8(3))
	f.Add([]byte(`{"model":"m","max_completion_tokens":1,"max_tokens":50000,"messages":[]}`), 4096, uint8(0))
	f.Add([]byte(`{"model":"m","max_tokens":1,"max_completion_tokens":50000,"prompt":"hi"}`), 4096, uint8(5))
	f.Add([]byte(`{"model":"m","max_output_tokens":1,"max_tokens":50000,"input":"hi"}`), 4096, uint8(2))
	f.Add([]byte(`{"model":"m","max_tokens":1,"max_completion_tokens":50000,"messages":[]}`), 4096, uint8(3))
	f.Fuzz(func(t *testing.T, body []byte, n int, which uint8) {
		n = 1 + int(uint(n)%(1<<31-1))
		api := generatingAPIs[int(which)%len(generatingAPIs)]
		r, err := openai.Parse(api, body)
		if err != nil {
			return // the gate rewrites only what it validated
		}
		got, err := withMaxTokens(body, n, outputLimitKeys(api, chatKeys[int(which)/len(generatingAPIs)%2])...)
		if err != nil {
			t.Fatalf("validated body %q: %v", body, err)
		}
		if !json.Valid(got) {
			t.Fatalf("rewrote %q into invalid JSON %q", body, got)
		}
		back, err := openai.Parse(api, got)
		if err != nil || back.MaxTokens < 1 || back.MaxTokens > n || back.Model != r.Model {
			t.Fatalf("%q -> %q: parsed %+v, %v", body, got, back, err)
		}
		// No spelling of a cap the API's servers read is left above n,
		// and none below it raised (other APIs' spellings are refused by
		// openai.Parse, or read by no server of this API).
		for _, k := range capSpellings[api] {
			before, after := gjson.GetBytes(body, k), gjson.GetBytes(got, k)
			if after.Type == gjson.Number && after.Num > float64(n) {
				t.Fatalf("%q -> %q: %s above %d", body, got, k, n)
			}
			if before.Type == gjson.Number && before.Num <= float64(n) && after.Num != before.Num {
				t.Fatalf("%q -> %q: %s changed from %v", body, got, k, before.Num)
			}
		}
	})
}
