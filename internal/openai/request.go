// Package openai holds the small part of the OpenAI wire format infergate
// needs: the fields of a request body the gate decides on, the stream chunks
// the meter counts, and the error body every denial uses.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Request is what the gate reads from a request body of any API it parses
// (see API): MaxTokens is the API's own output cap (max_output_tokens for
// Responses, Anthropic's max_tokens), 0 for an API that writes no output.
type Request struct {
	Model  string
	Stream bool
	// MaxTokens is the largest output cap the body carries under any key
	// its API's servers read (max_tokens, max_completion_tokens); 0 when
	// unset. The largest, because servers disagree on which key wins
	// (vLLM's and OpenAI's chat read max_completion_tokens, TGI's chat and
	// every /v1/completions server max_tokens): what the gate reserves and
	// caps must be the most any of them may write.
	MaxTokens int
	// IncludeUsage is the client's stream_options.include_usage; nil when absent.
	IncludeUsage *bool
	// PromptChars is the number of characters of text in messages/prompt
	// (message content and prompt strings, in bytes of JSON text). It was
	// the input to prompt-token estimation; PromptTokens counts more.
	PromptChars int
	// PromptTokens is the estimated prompt size in tokens, what a budget
	// reserves before the server's usage is known. It counts:
	//   - text at EstimateTokens' rate (4 bytes a token, rounded up), so
	//     never less than EstimateTokens(PromptChars): message content
	//     (strings, text and refusal parts), names, roles other than the
	//     standard ones, tool calls (function name and arguments, and any
	//     other key but "type"), any other key of a message (a template may
	//     render it), tools and legacy functions (their JSON text without
	//     insignificant whitespace), prompt strings and suffix;
	//   - token IDs exactly, one each, nested arrays summed;
	//   - for each non-text content part, what the request says of it
	//     (see media.go): an image at OpenAI's cost for its detail and, sent
	//     inline, its size (unknown: the most any size costs); inline audio
	//     by its size; a part the gate cannot see, TokensPerImage;
	//   - TokensPerMessage, TokensPerRequest (chat), TokensPerTool,
	//     TokensPerToolCall, and TokensPerPrompt for each text prompt.
	//
	// The estimate can be BELOW what a server counts:
	//   - for text denser than 4 bytes a token: most non-English text (a
	//     CJK character is 3 bytes and 1 to 2 tokens), code, JSON (tool
	//     schemas and arguments run near 3 bytes a token), digits, base64,
	//     hex, URLs, random strings. A byte-level BPE tokenizer (tiktoken,
	//     Llama 3, Qwen) spends at most one token per byte, and bytes are
	//     counted before unescaping, so the text part is at most 4 times
	//     low; adversarial text can get near that bound;
	//   - for templates that add more than the constants: a default system
	//     prompt (Llama 3.1's "Cutting Knowledge Date" block, Qwen 2.5's
	//     "You are Qwen...", about 20 to 25 tokens), a tool-use preamble
	//     (about 50 to 150 tokens in Hermes, Qwen and Llama 3.1 templates):
	//     a chat "Say hello in five words." is estimated at 16 tokens where
	//     a Llama 3.1 server counts 34. These are per request, not something
	//     a client can multiply within one;
	//   - for non-text parts: an image costs some servers more than
	//     OpenAI's tiles (gpt-4o-mini's 33 times as much, an open vision
	//     model thousands), audio may be denser, and a file, a video or
	//     audio by URL is estimated at TokensPerImage. What a pool proves
	//     above the estimate is charged, up to MaxPromptTokens, and a
	//     budget it overruns carries the excess as debt;
	//   - for fields not read: documents (RAG templates), a request's own
	//     chat_template or chat_template_kwargs, prompt_embeds,
	//     response_format (if a server renders it into the prompt).
	PromptTokens int
	// MaxPromptTokens is the most prompt tokens the body can make a server
	// count, whatever its tokenizer and template: see maxPrompt. 0 when
	// the body cannot bound it (it refers to input the gate cannot see: a
	// file, a video, audio by URL, a server-side tool, stored items).
	MaxPromptTokens int
	// Choices is the number of completions to charge for: max(n, best_of),
	// 1 when both are absent, for each prompt of a /v1/completions batch (an
	// array of strings, or of token-ID arrays, is a prompt per element,
	// each answered with that many completions).
	Choices int
	// PreviousResponseID is a Responses request's previous_response_id:
	// the stored conversation it continues; "" when unset.
	PreviousResponseID string
	// Background, Conversation and PromptID are a Responses request's
	// background (answered at once with no usage, generated later), the
	// id of its conversation (stored items the server adds to the input)
	// and of its prompt (a stored template the server renders); false and
	// "" when unset.
	Background   bool
	Conversation string
	PromptID     string
	// Store is a Responses request's store: true unless it sets false
	// (the API's default); false for every other API.
	Store bool
	// Dimensions is an embeddings request's dimensions; 0 when unset.
	Dimensions int
}

// Unbounded names the fields that make the request's cost one the gate
// cannot bound before it runs, in a fixed order: previous_response_id,
// conversation and prompt add stored input the gate never sees; with
// background the server answers at once with no usage and generates
// later, so nothing is left to settle. Each name is the body's key.
func (r *Request) Unbounded() iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, f := range [...]struct {
			name string
			set  bool
		}{
			{"background", r.Background},
			{"conversation", r.Conversation != ""},
			{"prompt", r.PromptID != ""},
			{"previous_response_id", r.PreviousResponseID != ""},
		} {
			if f.set && !yield(f.name) {
				return
			}
		}
	}
}

// maxPrompt is MaxPromptTokens for a body of size bytes estimated as e:
// 0 when the request carries stored input (Unbounded) or e saw input it
// cannot see.
func (r *Request) maxPrompt(e *estimate, size int) int {
	for range r.Unbounded() {
		return 0
	}
	if e.blind {
		return 0
	}
	return max(e.maxPrompt(size), e.promptTokens())
}

// Sentinel errors for request bodies; each maps to an OpenAI error code.
var (
	ErrInvalidJSON  = errors.New("request body is not a valid JSON object")
	ErrMissingModel = errors.New("you must provide a model parameter")
	ErrInvalidField = errors.New("invalid field")
)

// FieldError names the request field that is wrong.
type FieldError struct {
	Param string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Param, e.Msg) }
func (e *FieldError) Unwrap() error { return ErrInvalidField }

// ParseRequest reads the fields of a chat or text completion body that the
// gate needs, and rejects bodies an upstream would reject anyway. One
// validation pass, one pass over the top-level keys and one over the parts
// of the prompt, nothing decoded that is not needed.
//
// Keys match exactly, and a key the gate reads may appear only once: JSON
// decoders disagree on which duplicate wins (the gate must decide on the
// same model the upstream serves), so {"model":"a","model":"b"} is refused.
// So is any repeated key in stream_options and in the objects the prompt
// estimate reads: a message, a content part, a tool call and its function,
// a tool and its function. A Python server reads the last of them, gjson
// the first; the Param names the key, as in messages[3].content.
//
// A body nesting deeper than MaxDepth is refused (ErrTooDeep) before it is
// validated.
func ParseRequest(body []byte) (Request, error) {
	if !depthOK(body) {
		return Request{}, errBodyTooDeep
	}
	if !gjson.ValidBytes(body) {
		return Request{}, ErrInvalidJSON
	}
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !doc.IsObject() {
		return Request{}, ErrInvalidJSON
	}
	var (
		r                        Request
		model, stream, opts      gjson.Result
		maxTokens, maxCompletion gjson.Result
		messages, prompt, suffix gjson.Result
		tools, functions         gjson.Result
		n, bestOf                gjson.Result
		dup                      string
		blind                    bool
	)
	doc.ForEach(func(key, v gjson.Result) bool {
		var dst *gjson.Result
		switch key.Str {
		case "model":
			dst = &model
		case "stream":
			dst = &stream
		case "stream_options":
			dst = &opts
		case "max_tokens":
			dst = &maxTokens
		case "max_completion_tokens":
			dst = &maxCompletion
		case "messages":
			dst = &messages
		case "prompt":
			dst = &prompt
		case "suffix":
			dst = &suffix
		case "tools":
			dst = &tools
		case "functions":
			dst = &functions
		case "n":
			dst = &n
		case "best_of":
			dst = &bestOf
		case "web_search_options": // search results: input the gate cannot see
			blind = true
			return true
		default:
			return true
		}
		if dst.Exists() {
			dup = strings.Clone(key.Str) // key.Str may point into body
			return false
		}
		*dst = v
		return true
	})
	if dup != "" {
		return Request{}, &FieldError{dup, "appears more than once"}
	}
	if model.Type == gjson.Null { // absent or null
		return Request{}, ErrMissingModel
	}
	if model.Type != gjson.String {
		return Request{}, &FieldError{"model", "must be a string"}
	}
	if strings.TrimSpace(model.Str) == "" {
		return Request{}, ErrMissingModel
	}
	r.Model = strings.Clone(model.Str)
	switch stream.Type {
	case gjson.Null:
	case gjson.True, gjson.False:
		r.Stream = stream.Bool()
	default:
		return Request{}, &FieldError{"stream", "must be a boolean"}
	}
	for _, f := range []struct {
		name string
		v    gjson.Result
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletion}} {
		if f.v.Type == gjson.Null {
			continue
		}
		n, ok := positiveInt(f.v)
		if !ok {
			return Request{}, &FieldError{f.name, "must be a positive integer"}
		}
		r.MaxTokens = max(r.MaxTokens, n)
	}
	if opts.Type != gjson.Null {
		if !opts.IsObject() {
			return Request{}, &FieldError{"stream_options", "must be an object"}
		}
		// A repeated include_usage would be read true here and false by a
		// Python server: no usage on the stream.
		var iu gjson.Result
		if err := eachKey(opts, func() string { return "stream_options" }, func(k string, v gjson.Result) error {
			if k == "include_usage" {
				iu = v
			}
			return nil
		}); err != nil {
			return Request{}, err
		}
		switch iu.Type {
		case gjson.Null:
		case gjson.True, gjson.False:
			b := iu.Bool()
			r.IncludeUsage = &b
		default:
			return Request{}, &FieldError{"stream_options", "include_usage must be a boolean"}
		}
	}
	choices := 1
	for _, f := range []struct {
		name string
		v    gjson.Result
	}{{"n", n}, {"best_of", bestOf}} {
		if f.v.Type == gjson.Null {
			continue
		}
		c, ok := positiveInt(f.v)
		if !ok || c > MaxChoices {
			return Request{}, &FieldError{f.name, "must be an integer from 1 to " + strconv.Itoa(MaxChoices)}
		}
		choices = max(choices, c)
	}
	var e estimate
	if messages.Type != gjson.Null {
		if err := e.messages(messages); err != nil {
			return Request{}, err
		}
	}
	for _, f := range []struct {
		name string
		v    gjson.Result
	}{{"tools", tools}, {"functions", functions}} {
		if f.v.Type != gjson.Null {
			if err := e.tools(f.name, f.v); err != nil {
				return Request{}, err
			}
		}
	}
	e.prompt(prompt)
	e.text(suffix)
	e.blind = e.blind || blind
	r.PromptChars = e.chars
	r.PromptTokens = e.promptTokens()
	r.MaxPromptTokens = r.maxPrompt(&e, len(body))
	r.Choices = choices * max(e.prompts, 1)
	return r, nil
}

// positiveInt accepts a JSON integer >= 1 that fits an int32.
func positiveInt(v gjson.Result) (int, bool) {
	if v.Type != gjson.Number || v.Num < 1 || v.Num > math.MaxInt32 || v.Num != math.Trunc(v.Num) {
		return 0, false
	}
	return int(v.Num), true
}

// EstimateTokens is a fast prompt-token estimate: about four characters of
// English text per token, the rule of thumb OpenAI documents for its BPE
// tokenizers. It never returns less than 1 for a non-empty prompt.
func EstimateTokens(chars int) int {
	if chars <= 0 {
		return 0
	}
	return (chars + 3) / 4
}

// WithUsage returns body with stream_options.include_usage set to true, so
// the meter sees real token counts. It is only called when the client did
// not set include_usage itself; a client's explicit false is honoured.
// Like ParseRequest, it refuses a body nesting deeper than MaxDepth.
func WithUsage(body []byte) ([]byte, error) {
	if !depthOK(body) {
		return nil, errBodyTooDeep
	}
	if !gjson.ValidBytes(body) {
		return nil, ErrInvalidJSON
	}
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !doc.IsObject() {
		return nil, ErrInvalidJSON
	}
	if !doc.Get("stream_options").Exists() {
		// Fast path: splice the field before the closing brace, keeping the
		// client's bytes (and key order) as they were.
		empty := true
		doc.ForEach(func(_, _ gjson.Result) bool { empty = false; return false })
		end := bytes.LastIndexByte(body, '}')
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:end]...)
		if !empty {
			out = append(out, ',')
		}
		out = append(out, `"stream_options":{"include_usage":true}`...)
		return append(out, body[end:]...), nil
	}
	// Rare: the client sent stream_options without include_usage.
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(obj["stream_options"], &opts); err != nil {
		return nil, &FieldError{"stream_options", "must be an object"}
	}
	if opts == nil { // "stream_options": null
		opts = map[string]json.RawMessage{}
	}
	opts["include_usage"] = json.RawMessage("true")
	obj["stream_options"], _ = json.Marshal(opts)
	return json.Marshal(obj)
}
