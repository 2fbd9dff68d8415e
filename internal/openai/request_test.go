package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func ptr[T any](v T) *T { return &v }

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{
			name: "minimal chat",
			body: `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`,
			want: Request{Model: "gpt-4o", PromptChars: 5, PromptTokens: chat(len("Hello"), 1)},
		},
		{
			name: "surrounding whitespace",
			body: "\n\t {\"model\": \"gpt-4o\"} \r\n",
			want: Request{Model: "gpt-4o"},
		},
		{
			name: "stream true",
			body: `{"model":"m","stream":true}`,
			want: Request{Model: "m", Stream: true},
		},
		{
			name: "stream false",
			body: `{"model":"m","stream":false}`,
			want: Request{Model: "m"},
		},
		{
			name: "stream null",
			body: `{"model":"m","stream":null}`,
			want: Request{Model: "m"},
		},
		{
			name: "max_tokens",
			body: `{"model":"m","max_tokens":256}`,
			want: Request{Model: "m", MaxTokens: 256},
		},
		{
			name: "max_completion_tokens",
			body: `{"model":"m","max_completion_tokens":128}`,
			want: Request{Model: "m", MaxTokens: 128},
		},
		{
			// Servers disagree on which key wins (vLLM's chat reads
			// max_completion_tokens, TGI's chat and /v1/completions
			// servers max_tokens): the largest is what one may write.
			name: "both caps: the larger, max_tokens",
			body: `{"model":"m","max_tokens":256,"max_completion_tokens":128}`,
			want: Request{Model: "m", MaxTokens: 256},
		},
		{
			name: "both caps: the larger whatever the key order",
			body: `{"model":"m","max_completion_tokens":1,"max_tokens":50000}`,
			want: Request{Model: "m", MaxTokens: 50000},
		},
		{
			name: "both caps: the larger, max_completion_tokens",
			body: `{"model":"m","max_tokens":10,"max_completion_tokens":4096}`,
			want: Request{Model: "m", MaxTokens: 4096},
		},
		{
			name: "null max_completion_tokens falls back to max_tokens",
			body: `{"model":"m","max_tokens":256,"max_completion_tokens":null}`,
			want: Request{Model: "m", MaxTokens: 256},
		},
		{
			name: "include_usage true",
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
			want: Request{Model: "m", Stream: true, IncludeUsage: ptr(true)},
		},
		{
			name: "include_usage false",
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`,
			want: Request{Model: "m", Stream: true, IncludeUsage: ptr(false)},
		},
		{
			name: "include_usage absent from stream_options",
			body: `{"model":"m","stream":true,"stream_options":{}}`,
			want: Request{Model: "m", Stream: true},
		},
		{
			name: "include_usage null",
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":null}}`,
			want: Request{Model: "m", Stream: true},
		},
		{
			name: "stream_options null",
			body: `{"model":"m","stream":true,"stream_options":null}`,
			want: Request{Model: "m", Stream: true},
		},
		{
			name: "stream_options with other keys",
			body: `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`,
			want: Request{Model: "m", Stream: true, IncludeUsage: ptr(true)},
		},
		{
			name: "string contents of every message",
			body: `{"model":"m","messages":[
				{"role":"system","content":"You are terse."},
				{"role":"user","content":"Hi"},
				{"role":"assistant","content":"Hello."},
				{"role":"user","content":"Bye"}]}`,
			want: Request{
				Model:        "m",
				PromptChars:  len("You are terse.") + len("Hi") + len("Hello.") + len("Bye"),
				PromptTokens: chat(len("You are terse.")+len("Hi")+len("Hello.")+len("Bye"), 4),
			},
		},
		{
			name: "content parts: text in PromptChars, others by what they say",
			body: `{"model":"m","messages":[{"role":"user","content":[
				{"type":"text","text":"What is in"},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"high"}},
				{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},
				{"type":"text","text":" this image?"}]}]}`,
			want: Request{
				Model:       "m",
				PromptChars: len("What is in") + len(" this image?"),
				// an image by URL at high detail: the most any size costs;
				// 3 bytes of audio: a token
				PromptTokens: chat(len("What is in")+len(" this image?"), 1) + ImageTokens("high", 0, 0) + 1,
			},
		},
		{
			name: "null content of an assistant tool call",
			body: `{"model":"m","messages":[
				{"role":"user","content":"weather?"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
			want: Request{
				Model:       "m",
				PromptChars: len("weather?") + len("sunny"),
				// Tool call: its ID, name and arguments (bytes of JSON text);
				// the tool message's tool_call_id.
				PromptTokens: chat(len("weather?")+len("sunny")+len("c1")+len("get_weather")+len(`{\"city\":\"Paris\"}`)+len("c1"), 3) +
					TokensPerToolCall,
			},
		},
		{
			name: "empty messages",
			body: `{"model":"m","messages":[]}`,
			want: Request{Model: "m", PromptTokens: TokensPerRequest},
		},
		{
			name: "completions prompt string",
			body: `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7}`,
			want: Request{Model: "gpt-3.5-turbo-instruct", MaxTokens: 7, PromptChars: len("Say this is a test"),
				PromptTokens: EstimateTokens(len("Say this is a test")) + TokensPerPrompt},
		},
		{
			name: "completions prompt array of strings",
			body: `{"model":"m","prompt":["abc","de"]}`,
			// Two prompts, each answered.
			want: Request{Model: "m", PromptChars: 5, PromptTokens: EstimateTokens(5) + 2*TokensPerPrompt, Choices: 2},
		},
		{
			name: "completions prompt of token ids: one token each, not text",
			body: `{"model":"m","prompt":[1212,318,257,1332]}`,
			want: Request{Model: "m", PromptTokens: 4},
		},
		{
			name: "PromptChars counts bytes",
			body: `{"model":"m","prompt":"héllo"}`,
			want: Request{Model: "m", PromptChars: len("héllo"), PromptTokens: EstimateTokens(len("héllo")) + TokensPerPrompt},
		},
		{
			name: "escaped key names the same field",
			body: `{"mod\u0065l":"m"}`,
			want: Request{Model: "m"},
		},
		// Keys are case sensitive, like the model server's: a parser that
		// folds case would gate one model while the upstream serves another.
		{
			name: "upper-case model key ignored",
			body: `{"model":"served","MODEL":"gated"}`,
			want: Request{Model: "served"},
		},
		{
			name: "mixed-case model key ignored before the real one",
			body: `{"Model":"gated","model":"served"}`,
			want: Request{Model: "served"},
		},
		{
			name: "unicode case-folding key ignored",
			body: `{"model":"m","ſtream":true,"max_to\u212aens":5}`,
			want: Request{Model: "m"},
		},
		{
			name: "mixed-case include_usage ignored",
			body: `{"model":"m","stream_options":{"include_usage":false,"Include_Usage":true},"Stream_Options":{"include_usage":true}}`,
			want: Request{Model: "m", IncludeUsage: ptr(false)},
		},
		{
			name: "mixed-case messages key ignored",
			body: `{"model":"m","messages":[{"role":"user","content":"abcd"}],"Messages":[{"content":"ignored"}]}`,
			want: Request{Model: "m", PromptChars: 4, PromptTokens: chat(4, 1)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest(%s): %v", tt.body, err)
			}
			if tt.want.Choices == 0 {
				tt.want.Choices = 1
			}
			got.MaxPromptTokens = 0 // TestMaxPromptTokens
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRequest(%s)\n got %s\nwant %s", tt.body, fmtRequest(got), fmtRequest(tt.want))
			}
		})
	}
}

// chat is the estimate of a conversation of msgs messages holding chars
// bytes of text in all.
func chat(chars, msgs int) int {
	return EstimateTokens(chars) + msgs*TokensPerMessage + TokensPerRequest
}

func fmtRequest(r Request) string {
	iu := "nil"
	if r.IncludeUsage != nil {
		iu = map[bool]string{true: "true", false: "false"}[*r.IncludeUsage]
	}
	b, _ := json.Marshal(struct {
		Model                                         string
		Stream                                        bool
		MaxTokens, PromptChars, PromptTokens, Choices int
		IncludeUsage                                  string
	}{r.Model, r.Stream, r.MaxTokens, r.PromptChars, r.PromptTokens, r.Choices, iu})
	return string(b)
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantErr   error  // a sentinel, checked with errors.Is
		wantParam string // for ErrInvalidField: the *FieldError's Param
	}{
		{"empty body", ``, ErrInvalidJSON, ""},
		{"whitespace body", " \n\t", ErrInvalidJSON, ""},
		{"not JSON", `model=gpt-4o`, ErrInvalidJSON, ""},
		{"truncated object", `{"model":"m"`, ErrInvalidJSON, ""},
		{"trailing garbage", `{"model":"m"} {}`, ErrInvalidJSON, ""},
		{"JSON array", `[{"model":"m"}]`, ErrInvalidJSON, ""},
		{"JSON string", `"{\"model\":\"m\"}"`, ErrInvalidJSON, ""},
		{"JSON number", `42`, ErrInvalidJSON, ""},
		{"JSON null", `null`, ErrInvalidJSON, ""},
		{"JSON true", `true`, ErrInvalidJSON, ""},

		// Decoders disagree on which duplicate wins; the gate must decide on
		// the model the upstream serves, so duplicates are refused.
		{"duplicate model", `{"model":"a","model":"b"}`, ErrInvalidField, "model"},
		{"duplicate stream", `{"model":"a","stream":false,"stream":true}`, ErrInvalidField, "stream"},
		{"missing model", `{"messages":[{"role":"user","content":"hi"}]}`, ErrMissingModel, ""},
		{"empty object", `{}`, ErrMissingModel, ""},
		{"empty model", `{"model":""}`, ErrMissingModel, ""},
		{"blank model", `{"model":" \t"}`, ErrMissingModel, ""},
		{"null model", `{"model":null}`, ErrMissingModel, ""},
		{"only a mixed-case model", `{"Model":"m"}`, ErrMissingModel, ""},

		{"model number", `{"model":4}`, ErrInvalidField, "model"},
		{"model array", `{"model":["a"]}`, ErrInvalidField, "model"},
		{"model object", `{"model":{"id":"a"}}`, ErrInvalidField, "model"},
		{"model bool", `{"model":true}`, ErrInvalidField, "model"},
		{"stream string", `{"model":"m","stream":"true"}`, ErrInvalidField, "stream"},
		{"stream number", `{"model":"m","stream":1}`, ErrInvalidField, "stream"},
		{"max_tokens zero", `{"model":"m","max_tokens":0}`, ErrInvalidField, "max_tokens"},
		{"max_tokens negative", `{"model":"m","max_tokens":-5}`, ErrInvalidField, "max_tokens"},
		{"max_tokens string", `{"model":"m","max_tokens":"100"}`, ErrInvalidField, "max_tokens"},
		{"max_tokens fraction", `{"model":"m","max_tokens":1.5}`, ErrInvalidField, "max_tokens"},
		{"max_tokens overflow", `{"model":"m","max_tokens":99999999999999999999}`, ErrInvalidField, "max_tokens"},
		{"max_tokens bad even when max_completion_tokens is good", `{"model":"m","max_tokens":0,"max_completion_tokens":10}`, ErrInvalidField, "max_tokens"},
		{"max_completion_tokens zero", `{"model":"m","max_completion_tokens":0}`, ErrInvalidField, "max_completion_tokens"},
		{"max_completion_tokens string", `{"model":"m","max_tokens":5,"max_completion_tokens":"5"}`, ErrInvalidField, "max_completion_tokens"},
		{"stream_options string", `{"model":"m","stream_options":"include_usage"}`, ErrInvalidField, "stream_options"},
		{"stream_options array", `{"model":"m","stream_options":[]}`, ErrInvalidField, "stream_options"},
		{"include_usage string", `{"model":"m","stream_options":{"include_usage":"yes"}}`, ErrInvalidField, "stream_options"},
		{"messages string", `{"model":"m","messages":"hi"}`, ErrInvalidField, "messages"},
		{"messages object", `{"model":"m","messages":{"role":"user","content":"hi"}}`, ErrInvalidField, "messages"},
		{"message not an object", `{"model":"m","messages":["hi"]}`, ErrInvalidField, "messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.body))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ParseRequest(%s) error = %v, want %v", tt.body, err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, Request{}) {
				t.Errorf("ParseRequest(%s) returned %s with an error, want the zero Request", tt.body, fmtRequest(got))
			}
			var fe *FieldError
			isField := errors.As(err, &fe)
			if tt.wantParam == "" {
				if isField {
					t.Fatalf("ParseRequest(%s) error = %#v, want no *FieldError", tt.body, fe)
				}
				return
			}
			if !isField {
				t.Fatalf("ParseRequest(%s) error = %T %v, want *FieldError", tt.body, err, err)
			}
			if fe.Param != tt.wantParam {
				t.Errorf("ParseRequest(%s) Param = %q, want %q", tt.body, fe.Param, tt.wantParam)
			}
			if !strings.HasPrefix(err.Error(), tt.wantParam+": ") {
				t.Errorf("error text %q does not name the param", err.Error())
			}
		})
	}
}

func TestEstimateTokens(t *testing.T) {
	for _, tt := range []struct{ chars, want int }{
		{-1, 0}, {0, 0}, {1, 1}, {3, 1}, {4, 1}, {5, 2}, {8, 2}, {9, 3}, {4000, 1000},
	} {
		if got := EstimateTokens(tt.chars); got != tt.want {
			t.Errorf("EstimateTokens(%d) = %d, want %d", tt.chars, got, tt.want)
		}
	}
}

const splice = `"stream_options":{"include_usage":true}`

func TestWithUsageSplice(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{
			name: "compact",
			body: `{"model":"m","stream":true}`,
			want: `{"model":"m","stream":true,` + splice + `}`,
		},
		{
			name: "pretty-printed, bytes and key order kept",
			body: "{\n  \"stream\": true,\n  \"model\": \"m\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"}\"}]\n}\n",
			want: "{\n  \"stream\": true,\n  \"model\": \"m\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"}\"}]\n," + splice + "}\n",
		},
		{
			name: "escapes and HTML characters untouched",
			body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"<b>\u00e9\"}\"</b> & \ud83d\ude00"}]}`,
			want: `{"model":"m","stream":true,"messages":[{"role":"user","content":"<b>\u00e9\"}\"</b> & \ud83d\ude00"}],` + splice + `}`,
		},
		{
			name: "mixed-case stream_options is not stream_options",
			body: `{"model":"m","stream":true,"Stream_Options":{"include_usage":false}}`,
			want: `{"model":"m","stream":true,"Stream_Options":{"include_usage":false},` + splice + `}`,
		},
		{
			name: "empty object",
			body: `{}`,
			want: `{` + splice + `}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithUsage([]byte(tt.body))
			if err != nil {
				t.Fatalf("WithUsage: %v", err)
			}
			if string(got) != tt.want {
				t.Fatalf("WithUsage(%s)\n got %s\nwant %s", tt.body, got, tt.want)
			}
			checkWithUsage(t, []byte(tt.body), got)
		})
	}
}

func TestWithUsageRewrite(t *testing.T) {
	tests := []struct {
		name        string
		body        string
		wantOptions string // stream_options in the result
	}{
		{"empty options", `{"model":"m","stream":true,"stream_options":{}}`, `{"include_usage":true}`},
		{"other option kept", `{"model":"m","stream":true,"stream_options":{"foo":1}}`, `{"foo":1,"include_usage":true}`},
		{"null options", `{"stream_options":null,"model":"m","stream":true}`, `{"include_usage":true}`},
		{"explicit false overridden", `{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":[1,{"y":null}]}}`, `{"include_usage":true,"x":[1,{"y":null}]}`},
		{"already true", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, `{"include_usage":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithUsage([]byte(tt.body))
			if err != nil {
				t.Fatalf("WithUsage: %v", err)
			}
			// Everything but stream_options is unchanged (as JSON values).
			var want, have map[string]any
			mustUnmarshal(t, []byte(tt.body), &want)
			mustUnmarshal(t, got, &have)
			var opts any
			mustUnmarshal(t, []byte(tt.wantOptions), &opts)
			want["stream_options"] = opts
			if !reflect.DeepEqual(have, want) {
				t.Fatalf("WithUsage(%s) = %s\nwant the body with stream_options %s", tt.body, got, tt.wantOptions)
			}
			checkWithUsage(t, []byte(tt.body), got)
		})
	}
}

func TestWithUsageErrors(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantErr   error
		wantParam string
	}{
		{"empty", ``, ErrInvalidJSON, ""},
		{"not JSON", `{"model":`, ErrInvalidJSON, ""},
		{"array", `[{"model":"m"}]`, ErrInvalidJSON, ""},
		{"string", `"x"`, ErrInvalidJSON, ""},
		{"null", `null`, ErrInvalidJSON, ""},
		{"stream_options string", `{"model":"m","stream_options":"yes"}`, ErrInvalidField, "stream_options"},
		{"stream_options array", `{"model":"m","stream_options":[true]}`, ErrInvalidField, "stream_options"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithUsage([]byte(tt.body))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("WithUsage(%s) = %s, %v; want error %v", tt.body, got, err, tt.wantErr)
			}
			if got != nil {
				t.Errorf("WithUsage(%s) returned %s with an error", tt.body, got)
			}
			var fe *FieldError
			if errors.As(err, &fe) != (tt.wantParam != "") || (fe != nil && fe.Param != tt.wantParam) {
				t.Errorf("WithUsage(%s) error = %#v, want Param %q", tt.body, err, tt.wantParam)
			}
		})
	}
}

// checkWithUsage asserts the contract of WithUsage(body) == out: valid JSON
// that parses to the same request, now with include_usage true.
func checkWithUsage(t *testing.T, body, out []byte) {
	t.Helper()
	if !json.Valid(out) {
		t.Fatalf("WithUsage(%q) = %q: not valid JSON", body, out)
	}
	var top, opts map[string]json.RawMessage
	mustUnmarshal(t, out, &top)
	mustUnmarshal(t, top["stream_options"], &opts)
	if string(opts["include_usage"]) != "true" {
		t.Fatalf("WithUsage(%q) = %q: stream_options.include_usage is not true", body, out)
	}
	before, err := ParseRequest(body)
	if err != nil {
		return // e.g. {} has no model: only the JSON shape is checked
	}
	after, err := ParseRequest(out)
	if err != nil {
		t.Fatalf("ParseRequest(WithUsage(%q)): %v", body, err)
	}
	if after.IncludeUsage == nil || !*after.IncludeUsage {
		t.Fatalf("ParseRequest(WithUsage(%q)).IncludeUsage = %s, want true", body, fmtRequest(after))
	}
	after.IncludeUsage = before.IncludeUsage
	// The body grew by the option: so did what it can hold.
	if after.MaxPromptTokens > 0 {
		after.MaxPromptTokens -= len(out) - len(body)
	}
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("WithUsage(%q) changed the request:\n got %s\nwant %s", body, fmtRequest(after), fmtRequest(before))
	}
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
}

var requestSeeds = []string{
	`{"model":"m","max_completion_tokens":1,"max_tokens":50000,"messages":[]}`,
	`{"model":"m","max_tokens":7,"max_completion_tokens":null,"n":3}`,
	`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`,
	`{"model":"gpt-4o","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
	`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false},"max_completion_tokens":64,"messages":[]}`,
	`{"model":"gpt-4o","stream":true,"stream_options":{},"messages":[{"role":"user","content":[{"type":"text","text":"What?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
	`{"model":"gpt-4o","stream":true,"stream_options":null,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
	`{"model":"gpt-3.5-turbo-instruct","prompt":["Say","this"],"max_tokens":7,"stream":true}`,
	`{"model":"a","MODEL":"b","Stream":true,"stream_options":{"foo":1}}`,
	"{\n  \"model\": \"llama\",\n  \"stream\": true\n}\n",
	`{"model":"m","max_tokens":0}`,
	`{"model":""}`,
	`[1,2]`,
	`null`,
	``,
	// Nesting around MaxDepth, and brackets the depth check must not count.
	deepRequest(MaxDepth),
	deepRequest(MaxDepth + 1),
	`{"model":"m","stream_options":` + strings.Repeat(`{"a":`, MaxDepth-2) + "{}" + strings.Repeat("}", MaxDepth-1) + `}`,
	`{"model":"m","prompt":"\\\"` + strings.Repeat("[", 100) + `\""}`, // an escaped quote: still in the string
	`{"model":"m","prompt":"\\","x":` + nested(MaxDepth, "") + `}`,    // an escaped backslash: the string ends
	strings.Repeat(`{"a":`, 10000),
	strings.Repeat("[", 10000),
	// The prompt estimate: token IDs, batches, tools, tool calls, parts,
	// n and best_of, and repeated keys where it reads.
	`{"model":"m","prompt":[[1,2,3],[4,5]],"n":2,"best_of":3}`,
	`{"model":"m","prompt":[1,2,"x",[3],{"text":"t"},null],"suffix":"s"}`,
	`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}]}`,
	`{"model":"m","functions":[{"name":"f"}],"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"},"name":"n"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"},{"image_url":{"url":"u"}},{"text":"t"},"s",1]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"hi","content":"bye"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","t\u0065xt":"b"}]}]}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f","name":"g"}}]}`,
	`{"model":"m","stream_options":{"include_usage":true,"include_usage":false}}`,
	`{"model":"m","n":0,"best_of":129}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f","description":"\\\"{,:}[]","parameters":{"a":[{"b":1}],"c":{"d":{}}}}},{"t\u0079pe":1,"type":2},"x",[1]]}`,
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		// Refused for depth exactly when the reference finds it too deep:
		// so never a valid body nesting MaxDepth or less.
		if errors.Is(err, ErrTooDeep) != (nesting(body) > MaxDepth) {
			t.Fatalf("ParseRequest(%q) = %v, but it nests %d levels", body, err, nesting(body))
		}
		// The one-pass scan of tools agrees with a walk of them, refusals too.
		if !errors.Is(err, ErrTooDeep) && gjson.ValidBytes(body) {
			if err := toolsAgree(body); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrMissingModel) && !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrTooDeep) {
				t.Fatalf("ParseRequest(%q): unexpected error kind %T %v", body, err, err)
			}
			if !reflect.DeepEqual(r, Request{}) {
				t.Fatalf("ParseRequest(%q) returned %s with error %v", body, fmtRequest(r), err)
			}
			return
		}
		if !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
			t.Fatalf("ParseRequest accepted %q, which is not a JSON object", body)
		}
		if strings.TrimSpace(r.Model) == "" {
			t.Fatalf("ParseRequest(%q): empty model accepted", body)
		}
		if r.MaxTokens < 0 || r.PromptChars < 0 || r.PromptTokens < 0 {
			t.Fatalf("ParseRequest(%q) = %s: negative count", body, fmtRequest(r))
		}
		if r.PromptTokens < EstimateTokens(r.PromptChars) {
			t.Fatalf("ParseRequest(%q) = %s: PromptTokens below EstimateTokens(PromptChars)", body, fmtRequest(r))
		}
		if r.Choices < 1 {
			t.Fatalf("ParseRequest(%q) = %s: Choices below 1", body, fmtRequest(r))
		}
		// MaxTokens is the largest cap the body carries under any key.
		for _, k := range []string{"max_tokens", "max_completion_tokens"} {
			if v := gjson.GetBytes(body, k); v.Type == gjson.Number && int(v.Num) > r.MaxTokens {
				t.Fatalf("ParseRequest(%q) = %s: %s is larger", body, fmtRequest(r), k)
			}
		}
		// What the estimate reads is what a last-wins decoder reads.
		if err := lastWinsAgrees(body); err != nil {
			t.Fatal(err)
		}
		// However the client formats its body, the same request.
		var compact bytes.Buffer
		if json.Compact(&compact, body) == nil {
			c, err := ParseRequest(compact.Bytes())
			sameBound(&c, &r, len(body)-compact.Len())
			if err != nil || !reflect.DeepEqual(c, r) {
				t.Fatalf("ParseRequest(%q) = %s\ncompacted: %s, %v", body, fmtRequest(r), fmtRequest(c), err)
			}
		}
	})
}

func FuzzWithUsage(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, err := ParseRequest(body); err != nil {
			if errors.Is(err, ErrTooDeep) {
				if _, err := WithUsage(body); !errors.Is(err, ErrTooDeep) {
					t.Fatalf("WithUsage(%q) = %v on a body too deep for ParseRequest", body, err)
				}
			}
			return
		}
		out, err := WithUsage(body)
		if err != nil {
			// ParseRequest already decoded the same object and
			// stream_options, so there is nothing left to fail on.
			t.Fatalf("WithUsage(%q) failed on a body ParseRequest accepts: %v", body, err)
		}
		checkWithUsage(t, body, out)

		var top map[string]json.RawMessage
		mustUnmarshal(t, body, &top)
		if _, ok := top["stream_options"]; !ok {
			end := bytes.LastIndexByte(body, '}')
			want := string(body[:end]) + "," + splice + string(body[end:])
			if string(out) != want {
				t.Fatalf("WithUsage(%q) = %q, want the original with the field spliced in: %q", body, out, want)
			}
		}
	})
}

// benchBody is a typical chat request: a system prompt, a short history and
// the usual sampling options (about 1.5 KB).
var benchBody = []byte(`{
  "model": "gpt-4o-mini",
  "stream": true,
  "temperature": 0.7,
  "top_p": 1,
  "max_tokens": 1024,
  "user": "user-1234",
  "messages": [
    {"role": "system", "content": "You are a helpful assistant for an online bookstore. Answer questions about orders, shipping and returns. Be concise, polite and accurate; if you do not know, say so and offer to connect the customer with a human agent."},
    {"role": "user", "content": "Hi, I ordered three books last week and only two of them arrived. The order number is 88123-AB. What should I do?"},
    {"role": "assistant", "content": "I'm sorry one of your books is missing. I can see order 88123-AB was shipped in two parcels; the second parcel is still in transit and should arrive within two business days. Would you like me to send you the tracking link?"},
    {"role": "user", "content": [{"type": "text", "text": "Yes please. Also, can I return one of the books that did arrive? It has a damaged cover, see the photo."}, {"type": "image_url", "image_url": {"url": "https://example.com/uploads/cover-photo.jpg"}}]},
    {"role": "assistant", "content": "Of course. Damaged items can be returned free of charge within 30 days. I have emailed you a prepaid return label and the tracking link for the second parcel."},
    {"role": "user", "content": "Great, thank you! How long does the refund take once you receive the book?"}
  ]
}`)

func BenchmarkParseRequest(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := ParseRequest(benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWithUsage(b *testing.B) {
	withOptions := bytes.Replace(benchBody, []byte(`"stream": true,`), []byte(`"stream": true, "stream_options": {},`), 1)
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"splice", benchBody},    // no stream_options: the common case
		{"rewrite", withOptions}, // stream_options without include_usage
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if _, err := WithUsage(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
