package openai

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestParseMessages(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Request
	}{
		{"string content", `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello, Claude"}]}`,
			Request{Model: "claude-sonnet-4-5", MaxTokens: 1024, PromptChars: 13,
				PromptTokens: EstimateTokens(13) + TokensPerMessage + TokensPerRequest, Choices: 1}},
		{"system blocks, stream, an image",
			`{"model":"m","max_tokens":10,"stream":true,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],` +
				`"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"text","text":"What?"}]}]}`,
			Request{Model: "m", MaxTokens: 10, Stream: true, PromptChars: 14,
				PromptTokens: EstimateTokens(14) + 2*TokensPerMessage + TokensPerRequest + ImageTokens("", 0, 0), Choices: 1}}, // no image header: any size
		{"tool use and result: their text, a result's content as content",
			`{"model":"m","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"22C"}]}]}]}`,
			Request{Model: "m", MaxTokens: 10,
				PromptTokens: EstimateTokens(3+2+1+7+2) + 2*TokensPerMessage + TokensPerRequest + 2*TokensPerToolCall, Choices: 1}},
		{"string system, tools", `{"model":"m","max_tokens":5,"system":"abcd","messages":[],"tools":[{"name":"f","input_schema":{}}]}`,
			Request{Model: "m", MaxTokens: 5, PromptChars: 4,
				PromptTokens: EstimateTokens(4+len(`{"name":"f","input_schema":{}}`)) + TokensPerMessage + TokensPerTool + TokensPerRequest, Choices: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseMessages([]byte(tc.body))
			r.MaxPromptTokens = 0 // TestMaxPromptTokens
			if err != nil || r != tc.want {
				t.Errorf("ParseMessages(%s) = %+v, %v\nwant %+v", tc.body, r, err, tc.want)
			}
		})
	}
}

// count_tokens is a Messages body without max_tokens: nothing to write.
func TestParseCountTokens(t *testing.T) {
	body := `{"model":"m","system":"abcd","messages":[{"role":"user","content":"Hello"}]}`
	r, err := ParseCountTokens([]byte(body))
	r.MaxPromptTokens = 0 // TestMaxPromptTokens
	want := Request{Model: "m", PromptChars: 9, PromptTokens: EstimateTokens(9) + 2*TokensPerMessage + TokensPerRequest, Choices: 1}
	if err != nil || r != want {
		t.Errorf("ParseCountTokens = %+v, %v; want %+v", r, err, want)
	}
	if _, err := ParseMessages([]byte(body)); err == nil {
		t.Error("a message without max_tokens was accepted")
	}
	// Counting writes nothing: other APIs' caps are as harmless as its own.
	if r, err := ParseCountTokens([]byte(`{"model":"m","max_tokens":9,"max_completion_tokens":9,"n":2,"stream":true,"messages":[]}`)); err != nil || r.MaxTokens != 0 || r.Stream {
		t.Errorf("count_tokens with max_tokens and stream: %+v, %v", r, err)
	}
}

func TestParseMessagesErrors(t *testing.T) {
	for body, param := range map[string]string{
		`{"model":"m","messages":[]}`:                                                  "max_tokens",
		`{"model":"m","max_tokens":null,"messages":[]}`:                                "max_tokens",
		`{"model":"m","max_tokens":0,"messages":[]}`:                                   "max_tokens",
		`{"model":"m","max_tokens":1}`:                                                 "messages",
		`{"model":"m","max_tokens":1,"messages":{}}`:                                   "messages",
		`{"model":"m","max_tokens":1,"messages":[],"system":7}`:                        "system",
		`{"model":"m","max_tokens":1,"messages":[],"stream":1}`:                        "stream",
		`{"model":"m","max_tokens":1,"max_tokens":2,"messages":[]}`:                    "max_tokens",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","role":"assistant"}]}`: "messages[0].role",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"text":"a","text":"b"}]}]}]}`: "messages[0].content[0].content[0].text",
		`{"model":"m","max_tokens":1,"messages":[],"system":[{"type":"text","type":"text"}]}`:                                              "system[0].type",
		// Output caps and multipliers of other APIs: a server translating
		// to a chat engine may pass them on, the reservation would not.
		`{"model":"m","max_tokens":1,"max_completion_tokens":50000,"messages":[]}`: "max_completion_tokens",
		`{"model":"m","max_tokens":1,"max_output_tokens":50000,"messages":[]}`:     "max_output_tokens",
		`{"model":"m","max_tokens":1,"n":8,"messages":[]}`:                         "n",
		`{"model":"m","max_tokens":1,"best_of":8,"messages":[]}`:                   "best_of",
	} {
		_, err := ParseMessages([]byte(body))
		wantParseError(t, body, err, param)
	}
	if _, err := ParseMessages([]byte(`{"max_tokens":1,"messages":[]}`)); !errors.Is(err, ErrMissingModel) {
		t.Errorf("no model: %v", err)
	}
}

func TestAnthropicJSON(t *testing.T) {
	for status, typ := range map[int]string{
		400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
		405: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
		500: "api_error", 503: "api_error", 529: "overloaded_error",
	} {
		e := NewError(status, TypeInvalidRequest, "code", "param", `a "quoted" <message>`)
		var got struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(e.AnthropicJSON(), &got); err != nil {
			t.Fatal(err)
		}
		if got.Type != "error" || got.Error.Type != typ || got.Error.Message != e.Message {
			t.Errorf("%d: %s", status, e.AnthropicJSON())
		}
	}
}

var anthropicSeeds = []string{
	`{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello, Claude"}]}`,
	`{"model":"m","max_tokens":10,"stream":true,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"text","text":"What?"}]}]}`,
	`{"model":"m","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}},{"type":"thinking","thinking":"hm","signature":"s"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"22C"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"count me"}]}`,
	`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[]}]}]}]}`,
}

func FuzzParseMessages(f *testing.F) {
	for _, s := range anthropicSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := parserInvariants(t, ParseMessages, body)
		if ok && r.MaxTokens < 1 {
			t.Fatalf("a message without max_tokens accepted: %+v", r)
		}
	})
}

func FuzzParseCountTokens(f *testing.F) {
	for _, s := range anthropicSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := parserInvariants(t, ParseCountTokens, body)
		if ok && (r.MaxTokens != 0 || r.Stream) {
			t.Fatalf("count_tokens writes nothing: %+v", r)
		}
		// A message's input counts as its count_tokens would.
		if m, err := ParseMessages(body); err == nil && ok && m.PromptTokens != r.PromptTokens {
			t.Fatalf("%q: messages estimate %d, count_tokens %d", body, m.PromptTokens, r.PromptTokens)
		}
	})
}
