package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestParseResponses(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Request
	}{
		{"string input", `{"model":"gpt-4.1","input":"Tell me a story."}`,
			Request{Model: "gpt-4.1", PromptChars: 16, PromptTokens: EstimateTokens(16) + TokensPerMessage + TokensPerRequest, Choices: 1, Store: true}},
		{"instructions, stream, max_output_tokens, previous_response_id",
			`{"model":"m","instructions":"Be brief.","input":"Hi","stream":true,"max_output_tokens":300,"previous_response_id":"resp_1"}`,
			Request{Model: "m", Stream: true, MaxTokens: 300, PreviousResponseID: "resp_1", PromptChars: 11,
				PromptTokens: EstimateTokens(11) + 2*TokensPerMessage + TokensPerRequest, Choices: 1, Store: true}},
		{"message items with parts: text read, an image charged",
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"What is this?"},{"type":"input_image","image_url":"https://x/y.png"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"A cat."}]}]}`,
			// "message" (type's value) is other text of the item
			Request{Model: "m", PromptChars: 19, PromptTokens: EstimateTokens(19+7) + 2*TokensPerMessage + TokensPerRequest + ImageTokens("", 0, 0), Choices: 1, Store: true}},
		{"function call output: its keys as text",
			`{"model":"m","input":[{"type":"function_call_output","call_id":"c1","output":"22C"}]}`,
			Request{Model: "m", PromptTokens: EstimateTokens(20+2+3) + TokensPerMessage + TokensPerRequest, Choices: 1, Store: true}},
		{"no input (a stored prompt), nulls", `{"model":"m","input":null,"instructions":null,"max_output_tokens":null,"previous_response_id":null,"tools":null}`,
			Request{Model: "m", PromptTokens: TokensPerRequest, Choices: 1, Store: true}},
		{"tools", `{"model":"m","tools":[{"type":"function","name":"f","parameters":{}}]}`,
			Request{Model: "m", PromptTokens: EstimateTokens(len(`{"type":"function","name":"f","parameters":{}}`)) + TokensPerTool + TokensPerRequest, Choices: 1, Store: true}},
		{"background, conversation (an id), stored prompt, store false",
			`{"model":"m","background":true,"conversation":"conv_1","prompt":{"id":"pmpt_1","version":"2","variables":{"city":"Paris","doc":{"type":"input_text","text":"x"}}},"store":false}`,
			Request{Model: "m", Background: true, Conversation: "conv_1", PromptID: "pmpt_1",
				PromptTokens: EstimateTokens(5+len(`{"type":"input_text","text":"x"}`)) + TokensPerRequest, Choices: 1}},
		{"conversation as an object, nulls", `{"model":"m","conversation":{"id":"conv_2"},"background":null,"prompt":null,"store":null,"max_tokens":null,"n":null}`,
			Request{Model: "m", Conversation: "conv_2", PromptTokens: TokensPerRequest, Choices: 1, Store: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseResponses([]byte(tc.body))
			r.MaxPromptTokens = 0 // TestMaxPromptTokens
			if err != nil || r != tc.want {
				t.Errorf("ParseResponses(%s) = %+v, %v\nwant %+v", tc.body, r, err, tc.want)
			}
		})
	}
}

func TestParseResponsesErrors(t *testing.T) {
	for body, param := range map[string]string{
		`{"model":"m","input":7}`:                                 "input",
		`{"model":"m","input":["hi"]}`:                            "input[0]",
		`{"model":"m","input":[{"role":"user","role":"system"}]}`: "input[0].role",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a","text":"b"}]}]}`: "input[0].content[0].text",
		`{"model":"m","instructions":["x"]}`:                                               "instructions",
		`{"model":"m","max_output_tokens":0}`:                                              "max_output_tokens",
		`{"model":"m","max_output_tokens":1.5}`:                                            "max_output_tokens",
		`{"model":"m","stream":"yes"}`:                                                     "stream",
		`{"model":"m","previous_response_id":1}`:                                           "previous_response_id",
		`{"model":"m","tools":{}}`:                                                         "tools",
		`{"model":"m","tools":[{"name":"a","name":"b"}]}`:                                  "tools[0].name",
		`{"model":"m","input":"a","input":"b"}`:                                            "input",
		`{"model":"m","previous_response_id":"a","previous_response_id":"b"}`:              "previous_response_id",
		`{"model":"m","previous_response_id":"` + strings.Repeat("r", MaxIDBytes+1) + `"}`: "previous_response_id",
		`{"model":"m","previous_response_id":""}`:                                          "previous_response_id",
		// Output caps and multipliers of other APIs: a server on a chat
		// engine may read them, the reservation would not.
		`{"model":"m","max_output_tokens":10,"max_tokens":50000}`:         "max_tokens",
		`{"model":"m","max_completion_tokens":50000}`:                     "max_completion_tokens",
		`{"model":"m","n":4}`:                                             "n",
		`{"model":"m","best_of":4}`:                                       "best_of",
		`{"model":"m","background":"yes"}`:                                "background",
		`{"model":"m","background":true,"background":false}`:              "background",
		`{"model":"m","store":1}`:                                         "store",
		`{"model":"m","conversation":7}`:                                  "conversation",
		`{"model":"m","conversation":""}`:                                 "conversation",
		`{"model":"m","conversation":{}}`:                                 "conversation.id",
		`{"model":"m","conversation":{"id":"a","id":"b"}}`:                "conversation.id",
		`{"model":"m","conversation":"a","conversation":"b"}`:             "conversation",
		`{"model":"m","prompt":"pmpt_1"}`:                                 "prompt",
		`{"model":"m","prompt":{"version":"1"}}`:                          "prompt.id",
		`{"model":"m","prompt":{"id":"p","id":"q"}}`:                      "prompt.id",
		`{"model":"m","prompt":{"id":"p","version":2}}`:                   "prompt.version",
		`{"model":"m","prompt":{"id":"p","variables":["x"]}}`:             "prompt.variables",
		`{"model":"m","prompt":{"id":"p","variables":{"a":"x","a":"y"}}}`: "prompt.variables.a",
	} {
		_, err := ParseResponses([]byte(body))
		wantParseError(t, body, err, param)
	}
	if _, err := ParseResponses([]byte(`{"input":"hi"}`)); !errors.Is(err, ErrMissingModel) {
		t.Errorf("no model: %v", err)
	}
}

func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4.1","input":"Tell me a story.","stream":true}`,
		`{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"},{"type":"input_image","image_url":"u"}]}],"max_output_tokens":64}`,
		`{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c","output":"{}"}]}`,
		`{"model":"m","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"input":[{"type":"item_reference","id":"x"}]}`,
		`{"model":"m","input":[{"role":"user","role":"user"}]}`,
		`{"model":"m","background":true,"store":true,"conversation":{"id":"conv_1"},"prompt":{"id":"p","version":"1","variables":{"a":"b"}}}`,
		`{"model":"m","max_output_tokens":1,"max_tokens":50000,"n":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := parserInvariants(t, ParseResponses, body)
		if ok && r.IncludeUsage != nil {
			t.Fatalf("a response has no stream_options: %+v", r)
		}
		// Nothing another API's server reads as a cap or a multiplier
		// passes unread (ParseResponses refuses each of them).
		if ok {
			for _, k := range []string{"max_tokens", "max_completion_tokens", "n", "best_of"} {
				if v := gjson.GetBytes(body, k); v.Exists() && v.Type != gjson.Null {
					t.Fatalf("accepted %s: %s", k, body)
				}
			}
		}
	})
}
