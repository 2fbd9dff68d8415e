package openai

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseChunk(t *testing.T) {
	tests := []struct {
		name string
		data string
		want Chunk
	}{
		{
			name: "role-only first chunk",
			data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			want: Chunk{},
		},
		{
			name: "role-only with null content and refusal",
			data: `{"object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":null}}]}`,
			want: Chunk{},
		},
		{
			name: "content chunk",
			data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}`,
			want: Chunk{Content: true},
		},
		{
			name: "whitespace content is content",
			data: `{"choices":[{"delta":{"content":" "}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "empty content",
			data: `{"choices":[{"delta":{"content":""}}]}`,
			want: Chunk{},
		},
		{
			name: "finish chunk with empty delta",
			data: `{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			want: Chunk{},
		},
		{
			name: "reasoning_content",
			data: `{"choices":[{"delta":{"reasoning_content":"Let me think","content":null}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "reasoning",
			data: `{"choices":[{"delta":{"reasoning":"Hmm"}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "refusal",
			data: `{"choices":[{"delta":{"refusal":"I can't"}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "tool call arguments",
			data: `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "tool call name in the first tool chunk",
			data: `{"choices":[{"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "tool call without name or arguments",
			data: `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}`,
			want: Chunk{},
		},
		{
			name: "usage chunk with no choices",
			data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`,
			want: Chunk{Usage: &Usage{PromptTokens: 12, CompletionTokens: 34, TotalTokens: 46}},
		},
		{
			name: "usage with detail fields",
			data: `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":1}}}`,
			want: Chunk{Usage: &Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}},
		},
		{
			name: "cached prompt tokens",
			data: `{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}}`,
			want: Chunk{Usage: &Usage{PromptTokens: 2006, CompletionTokens: 300, TotalTokens: 2306, CachedTokens: 1920}},
		},
		{
			name: "null details",
			data: `{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3,"prompt_tokens_details":null}}`,
			want: Chunk{Usage: &Usage{PromptTokens: 2, CompletionTokens: 1, TotalTokens: 3}},
		},
		{
			name: "content and usage in the same chunk",
			data: `{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
			want: Chunk{Content: true, Usage: &Usage{PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6}},
		},
		{
			name: "content in a later choice",
			data: `{"choices":[{"index":0,"delta":{}},{"index":1,"delta":{"content":"b"}}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "text completion chunk",
			data: `{"id":"cmpl-1","object":"text_completion","created":1718000000,"model":"gpt-3.5-turbo-instruct","choices":[{"text":" test","index":0,"logprobs":null,"finish_reason":null}]}`,
			want: Chunk{Content: true},
		},
		{
			name: "text completion final chunk",
			data: `{"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}]}`,
			want: Chunk{},
		},
		{
			name: "non-streamed chat.completion",
			data: `{"id":"chatcmpl-1","object":"chat.completion","created":1718000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`,
			want: Chunk{Content: true, Usage: &Usage{PromptTokens: 9, CompletionTokens: 3, TotalTokens: 12}},
		},
		{
			name: "non-streamed with null message content",
			data: `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null}}],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}`,
			want: Chunk{Usage: &Usage{PromptTokens: 9, TotalTokens: 9}},
		},
		{
			name: "null choices and usage",
			data: `{"choices":null,"usage":null}`,
			want: Chunk{},
		},
		{
			name: "empty object",
			data: `{}`,
			want: Chunk{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseChunk([]byte(tt.data))
			if err != nil {
				t.Fatalf("ParseChunk(%s): %v", tt.data, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseChunk(%s)\n got %+v (usage %+v)\nwant %+v (usage %+v)", tt.data, got, got.Usage, tt.want, tt.want.Usage)
			}
		})
	}
}

func TestChunkModel(t *testing.T) {
	if got := ChunkModel(benchChunk); got != "gpt-4o-mini-2024-07-18" {
		t.Errorf("ChunkModel = %q", got)
	}
	if got := ChunkModel([]byte(`{"choices":[]}`)); got != "" {
		t.Errorf("ChunkModel without a model = %q", got)
	}
}

func TestParseChunkErrors(t *testing.T) {
	for _, data := range []string{
		``,
		`[DONE]`,
		`{"choices":[{"delta":{"content":"x"}}]`,
		`{"choices":{"delta":{}}}`,
		`{"choices":[{"delta":{"content":42}}]}`,
		`{"usage":{"prompt_tokens":"12"}}`,
		`{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":-3}}}`,
		`{"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":"1"}}}`,
		`{"usage":{"prompt_tokens":2,"prompt_tokens_details":[1]}}`,
		`{"model":1}`,
	} {
		got, err := ParseChunk([]byte(data))
		if err == nil {
			t.Errorf("ParseChunk(%q) = %+v, want an error", data, got)
		}
		if !reflect.DeepEqual(got, Chunk{}) {
			t.Errorf("ParseChunk(%q) = %+v with an error, want the zero Chunk", data, got)
		}
	}
}

// benchChunk is one streamed token, the event the meter decodes most often.
var benchChunk = []byte(`{"id":"chatcmpl-9xAbCdEfGhIjKlMnOpQrStUv","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":null}`)

func BenchmarkParseChunk(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChunk)))
	for b.Loop() {
		c, err := ParseChunk(benchChunk)
		if err != nil || !c.Content {
			b.Fatal(c, err)
		}
	}
}

// FuzzParseChunk: any event data is read or refused, never a panic, and a
// refusal leaves nothing half-read.
func FuzzParseChunk(f *testing.F) {
	f.Add(benchChunk)
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`))
	f.Add([]byte(`{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}`))
	f.Add([]byte(`{"choices":[{"text":"x"}]}`))
	f.Add([]byte(`[DONE]`))
	f.Add([]byte(`{"model":"m","choices":[{"delta":{"content":"x","x":` + nested(MaxDepth-4, "") + `}}]}`))
	f.Add([]byte(`{"model":"m","choices":[{"delta":{"content":"x","x":` + nested(MaxDepth-3, "") + `}}]}`))
	f.Add([]byte(`{"model":"m","choices":[{"delta":{"content":"\\\"` + strings.Repeat("[", 100) + `"}}]}`))
	f.Add([]byte(strings.Repeat(`{"usage":`, 10000)))
	f.Add([]byte(strings.Repeat("[", 10000)))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseChunk(data)
		if errors.Is(err, ErrTooDeep) != (nesting(data) > MaxDepth) {
			t.Fatalf("ParseChunk(%q) = %v, but it nests %d levels", data, err, nesting(data))
		}
		if errors.Is(err, ErrTooDeep) && (!errors.Is(err, ErrBadChunk) || ChunkModel(data) != "") {
			t.Fatalf("ParseChunk(%q): too deep, but not a bad chunk without a model", data)
		}
		if err != nil && !reflect.DeepEqual(c, Chunk{}) {
			t.Fatalf("error %v with a non-zero chunk %+v", err, c)
		}
		if c.Usage != nil && (c.Usage.PromptTokens < 0 || c.Usage.CompletionTokens < 0) {
			t.Fatalf("negative usage %+v", *c.Usage)
		}
	})
}
