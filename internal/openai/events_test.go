package openai

import (
	"errors"
	"testing"
)

// Events as the APIs stream them (and the mock, bench/mock, writes them).
const (
	respCreated   = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-4.1","output":[],"usage":null}}`
	respItemAdded = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}`
	respDelta     = `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello","logprobs":[]}`
	respTextDone  = `{"type":"response.output_text.done","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello","logprobs":[]}`
	respCompleted = `{"type":"response.completed","sequence_number":8,"response":{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1","output":[{"type":"message","content":[{"type":"output_text","text":"Hello"}]}],"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":18}}}`

	msgStart      = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":3,"cache_read_input_tokens":2,"output_tokens":1}}}`
	msgBlockStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	msgPing       = `{"type": "ping"}`
	msgText       = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	msgJSON       = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"loc"}}`
	msgJSONEmpty  = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`
	msgThinking   = `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`
	msgSignature  = `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`
	msgDelta      = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	msgDeltaFull  = `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":25,"cache_read_input_tokens":2,"output_tokens":15}}`
	msgStop       = `{"type":"message_stop"}`
)

func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		api             API
		name, data      string
		content         bool
		usage           *Usage
		inOnly, outOnly bool
		model           string
		bad             bool
	}{
		{api: APIResponses, name: "response.created", data: respCreated, model: "gpt-4.1"},
		{api: APIResponses, name: "response.output_item.added", data: respItemAdded},
		{api: APIResponses, name: "response.output_text.delta", data: respDelta, content: true},
		{api: APIResponses, data: respDelta, content: true}, // unnamed: its type names it
		{api: APIResponses, name: "response.output_text.delta", data: `{"type":"response.output_text.delta","delta":""}`},
		{api: APIResponses, name: "response.function_call_arguments.delta", data: `{"type":"response.function_call_arguments.delta","delta":"{\"a"}`, content: true},
		{api: APIResponses, name: "response.reasoning_summary_text.delta", data: `{"type":"response.reasoning_summary_text.delta","delta":"Think"}`, content: true},
		{api: APIResponses, name: "response.output_text.done", data: respTextDone},
		{api: APIResponses, name: "response.completed", data: respCompleted, model: "gpt-4.1",
			usage: &Usage{PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, CachedTokens: 4}},
		{api: APIResponses, name: "response.incomplete", data: `{"type":"response.incomplete","response":{"model":"m","usage":{"input_tokens":3,"output_tokens":9}}}`,
			model: "m", usage: &Usage{PromptTokens: 3, CompletionTokens: 9, TotalTokens: 12}},
		{api: APIResponses, name: "error", data: `{"type":"error","code":"server_error","message":"boom"}`},
		{api: APIResponses, name: "response.completed", data: `{"type":"response.completed","response":{"usage":{"input_tokens":-1}}}`, bad: true},
		{api: APIResponses, name: "response.completed", data: `{"type":"response.completed","response":[]}`, bad: true},
		{api: APIResponses, name: "response.output_text.delta", data: `{"type":7,"delta":"x"}`, bad: true},
		{api: APIResponses, name: "response.output_text.done", data: respTextDone[:40], bad: true},

		{api: APIMessages, name: "message_start", data: msgStart, model: "claude-sonnet-4", inOnly: true,
			usage: &Usage{PromptTokens: 30, CompletionTokens: 1, TotalTokens: 31, CachedTokens: 2, CacheWriteTokens: 3}},
		{api: APIMessages, name: "content_block_start", data: msgBlockStart},
		{api: APIMessages, name: "ping", data: msgPing},
		{api: APIMessages, name: "content_block_delta", data: msgText, content: true},
		{api: APIMessages, data: msgText, content: true},
		{api: APIMessages, name: "content_block_delta", data: msgJSON, content: true},
		{api: APIMessages, name: "content_block_delta", data: msgJSONEmpty},
		{api: APIMessages, name: "content_block_delta", data: msgThinking, content: true},
		{api: APIMessages, name: "content_block_delta", data: msgSignature},
		{api: APIMessages, name: "message_delta", data: msgDelta, outOnly: true,
			usage: &Usage{CompletionTokens: 15, TotalTokens: 15}},
		{api: APIMessages, name: "message_delta", data: msgDeltaFull,
			usage: &Usage{PromptTokens: 27, CompletionTokens: 15, TotalTokens: 42, CachedTokens: 2}},
		{api: APIMessages, name: "message_stop", data: msgStop},
		{api: APIMessages, name: "message_delta", data: `{"type":"message_delta","usage":{"output_tokens":"7"}}`, bad: true},
		{api: APIMessages, name: "content_block_delta", data: `{"type":"content_block_delta","delta":"x"}`, bad: true},
		{api: APIMessages, name: "message_start", data: `{"type":"message_start","message":null}`, bad: true},
		{api: APIMessages, name: "message_delta", data: msgDelta[:30], bad: true},
	} {
		c, err := ParseEvent(tc.api, []byte(tc.name), []byte(tc.data))
		if tc.bad {
			if !errors.Is(err, ErrBadChunk) {
				t.Errorf("%s %s: err %v, want a bad chunk", tc.name, tc.data, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %s: %v", tc.name, tc.data, err)
			continue
		}
		if c.Content != tc.content || c.InputOnly != tc.inOnly || c.OutputOnly != tc.outOnly || c.Model != tc.model ||
			(c.Usage == nil) != (tc.usage == nil) || c.Usage != nil && *c.Usage != *tc.usage {
			t.Errorf("%s %s:\n got %+v (usage %+v)\nwant content %v usage %+v in-only %v out-only %v model %q",
				tc.name, tc.data, c, c.Usage, tc.content, tc.usage, tc.inOnly, tc.outOnly, tc.model)
		}
	}
}

// Data nesting past MaxDepth is a bad event for every API.
func TestParseEventTooDeep(t *testing.T) {
	deep := []byte(`{"type":"response.completed","response":` + nested(MaxDepth+1, "") + `}`)
	for _, api := range []API{APIResponses, APIMessages} {
		if _, err := ParseEvent(api, []byte("response.completed"), deep); !errors.Is(err, ErrTooDeep) || !errors.Is(err, ErrBadChunk) {
			t.Errorf("%s: %v", api, err)
		}
	}
}

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		api     API
		body    string
		content bool
		usage   *Usage
		bad     bool
	}{
		{APIResponses, `{"id":"resp_1","object":"response","model":"gpt-4.1","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}`,
			true, &Usage{PromptTokens: 5, CompletionTokens: 2, TotalTokens: 7}, false},
		{APIResponses, `{"object":"response","output":[],"usage":null}`, false, nil, false},
		{APIResponses, `{"object":"response","output":[],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":48},"output_tokens":2}}`,
			false, &Usage{PromptTokens: 50, CompletionTokens: 2, TotalTokens: 52, CachedTokens: 48}, false},
		{APIResponses, `{"object":"response","output":[],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":-1},"output_tokens":2}}`, false, nil, true},
		{APIResponses, `{"object":"response","output":[],"usage":{"input_tokens":50,"input_tokens_details":7,"output_tokens":2}}`, false, nil, true},
		{APIMessages, `{"type":"message","content":[],"usage":{"input_tokens":4,"cache_creation_input_tokens":100,"cache_read_input_tokens":900,"output_tokens":3}}`,
			false, &Usage{PromptTokens: 1004, CompletionTokens: 3, TotalTokens: 1007, CachedTokens: 900, CacheWriteTokens: 100}, false},
		{APIMessages, `{"type":"message","content":[],"usage":{"input_tokens":4,"cache_read_input_tokens":"9","output_tokens":3}}`, false, nil, true},
		{APIResponses, `{"object":"response","output":{}}`, false, nil, true},
		{APIMessages, `{"id":"msg_1","type":"message","model":"claude","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":9,"cache_read_input_tokens":1,"output_tokens":4}}`,
			true, &Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14, CachedTokens: 1}, false},
		{APIMessages, `{"type":"message","content":[],"usage":{"input_tokens":9,"output_tokens":0}}`,
			false, &Usage{PromptTokens: 9, TotalTokens: 9}, false},
		{APIMessages, `{"type":"message","usage":{"input_tokens":true}}`, false, nil, true},
		{APICountTokens, `{"input_tokens":42}`, false, &Usage{PromptTokens: 42, TotalTokens: 42}, false},
		{APICountTokens, `{"input_tokens":"42"}`, false, nil, true},
		{APIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AAAA"}],"model":"e","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			false, &Usage{PromptTokens: 8, TotalTokens: 8}, false},
		{APIChat, `{"object":"chat.completion","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
			true, &Usage{PromptTokens: 3, CompletionTokens: 1}, false},
	} {
		c, err := ParseBody(tc.api, []byte(tc.body))
		if tc.bad {
			if err == nil {
				t.Errorf("%s %s: read, want a bad body", tc.api, tc.body)
			}
			continue
		}
		if err != nil || c.Content != tc.content || (c.Usage == nil) != (tc.usage == nil) || c.Usage != nil && *c.Usage != *tc.usage {
			t.Errorf("%s %s: %+v (usage %+v), %v; want content %v usage %+v", tc.api, tc.body, c, c.Usage, err, tc.content, tc.usage)
		}
	}
}

func TestStreamAndBodyAPI(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       API
	}{
		{"response.created", respCreated, APIResponses},
		{"", respDelta, APIResponses},
		{"message_start", msgStart, APIMessages},
		{"", msgText, APIMessages},
		{"ping", msgPing, ""},
		{"error", `{"type":"error"}`, ""},
		{"", `{"object":"chat.completion.chunk","choices":[]}`, APIChat},
		{"", `{"object":"text_completion","choices":[{"text":"a"}]}`, APICompletions},
		{"", `not json`, APIChat},
	} {
		if got := StreamAPI([]byte(tc.name), []byte(tc.data)); got != tc.want {
			t.Errorf("StreamAPI(%q, %s) = %q, want %q", tc.name, tc.data, got, tc.want)
		}
	}
	for body, want := range map[string]API{
		`{"id":"x","object":"chat.completion","choices":[]}`:              APIChat,
		`{"object":"text_completion"}`:                                    APICompletions,
		`{"id":"resp_1","object":"response","output":[]}`:                 APIResponses,
		`{"object":"list","data":[{"object":"embedding","embedding":[0.1`: APIEmbeddings, // a large body's head
		`{"object":"list","data":[{"id":"m","object":"model"}]}`:          "",
		`{"id":"msg_1","type":"message","role":"assistant"}`:              APIMessages,
		`{"input_tokens":4}`:                                              "",
	} {
		if got := BodyAPI([]byte(body)); got != want {
			t.Errorf("BodyAPI(%s) = %q, want %q", body, got, want)
		}
	}
}

// The per-event paths allocate nothing for a content event.
func TestParseEventAllocs(t *testing.T) {
	for _, tc := range []struct {
		api        API
		name, data string
	}{{APIResponses, "response.output_text.delta", respDelta}, {APIMessages, "content_block_delta", msgText}, {APIMessages, "ping", msgPing}} {
		name, data := []byte(tc.name), []byte(tc.data)
		if n := testing.AllocsPerRun(100, func() { _, _ = ParseEvent(tc.api, name, data) }); n != 0 {
			t.Errorf("%s %s: %.0f allocs", tc.api, tc.name, n)
		}
	}
}

// FuzzParseEvent: whatever a pool streams, the readers of named events
// never panic, agree with the JSON validator, and report sane counts.
func FuzzParseEvent(f *testing.F) {
	for _, s := range []struct{ name, data string }{
		{"response.created", respCreated}, {"response.output_item.added", respItemAdded},
		{"response.output_text.delta", respDelta}, {"response.output_text.done", respTextDone},
		{"response.completed", respCompleted}, {"", respDelta},
		{"message_start", msgStart}, {"content_block_start", msgBlockStart}, {"ping", msgPing},
		{"content_block_delta", msgText}, {"content_block_delta", msgJSON}, {"content_block_delta", msgThinking},
		{"content_block_delta", msgSignature}, {"message_delta", msgDelta}, {"message_delta", msgDeltaFull},
		{"message_stop", msgStop}, {"", msgDelta}, {"error", `{"type":"error","error":{"type":"overloaded_error"}}`},
	} {
		f.Add(s.name, []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		for _, api := range []API{APIResponses, APIMessages} {
			c, err := ParseEvent(api, []byte(name), data)
			if err != nil {
				if !errors.Is(err, ErrBadChunk) {
					t.Fatalf("%s: error %v is not a bad chunk", api, err)
				}
				continue
			}
			if u := c.Usage; u != nil && (u.PromptTokens < 0 || u.CompletionTokens < 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens) {
				t.Fatalf("%s: usage %+v", api, *u)
			}
			if c.InputOnly && c.OutputOnly {
				t.Fatalf("%s: both input-only and output-only", api)
			}
		}
		for _, api := range []API{APIResponses, APIMessages, APICountTokens} {
			if c, err := ParseBody(api, data); err == nil && c.Usage != nil && c.Usage.PromptTokens < 0 {
				t.Fatalf("%s body: usage %+v", api, *c.Usage)
			}
		}
		_ = StreamAPI([]byte(name), data)
		_ = BodyAPI(data)
	})
}
