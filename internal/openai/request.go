// Package openai holds the small part of the OpenAI wire format infergate
// needs: the fields of a request body the gate decides on, the stream chunks
// the meter counts, and the error body every denial uses.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Request is what the gate reads from a completion request body.
type Request struct {
	Model     string
	Stream    bool
	MaxTokens int // max_completion_tokens, else max_tokens; 0 when unset
	// IncludeUsage is the client's stream_options.include_usage; nil when absent.
	IncludeUsage *bool
	// PromptChars is the number of characters of text in messages/prompt:
	// the input to prompt-token estimation.
	PromptChars int
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
// validation pass and one pass over the top-level keys, nothing decoded that
// is not needed.
//
// Keys match exactly, and a key the gate reads may appear only once: JSON
// decoders disagree on which duplicate wins (the gate must decide on the
// same model the upstream serves), so {"model":"a","model":"b"} is refused.
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
		messages, prompt         gjson.Result
		dup                      string
	)
	fields := map[string]*gjson.Result{
		"model": &model, "stream": &stream, "stream_options": &opts, "max_tokens": &maxTokens,
		"max_completion_tokens": &maxCompletion, "messages": &messages, "prompt": &prompt,
	}
	doc.ForEach(func(key, v gjson.Result) bool {
		if dst, ok := fields[key.Str]; ok {
			if dst.Exists() {
				dup = key.Str
				return false
			}
			*dst = v
		}
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
		if r.MaxTokens == 0 || f.name == "max_completion_tokens" {
			r.MaxTokens = n
		}
	}
	if opts.Type != gjson.Null {
		if !opts.IsObject() {
			return Request{}, &FieldError{"stream_options", "must be an object"}
		}
		switch iu := opts.Get("include_usage"); iu.Type {
		case gjson.Null:
		case gjson.True, gjson.False:
			b := iu.Bool()
			r.IncludeUsage = &b
		default:
			return Request{}, &FieldError{"stream_options", "include_usage must be a boolean"}
		}
	}
	n, err := promptChars(messages, prompt)
	if err != nil {
		return Request{}, err
	}
	r.PromptChars = n
	return r, nil
}

// positiveInt accepts a JSON integer >= 1 that fits an int32.
func positiveInt(v gjson.Result) (int, bool) {
	if v.Type != gjson.Number || v.Num < 1 || v.Num > math.MaxInt32 || v.Num != math.Trunc(v.Num) {
		return 0, false
	}
	return int(v.Num), true
}

// promptChars counts the text a model will read, for token estimation.
// Non-text parts (images, audio) are not counted.
func promptChars(messages, prompt gjson.Result) (int, error) {
	n := 0
	if messages.Type != gjson.Null {
		if !messages.IsArray() {
			return 0, &FieldError{"messages", "must be an array of message objects"}
		}
		ok := true
		messages.ForEach(func(_, m gjson.Result) bool {
			if ok = m.IsObject(); ok {
				n += textChars(m.Get("content"))
			}
			return ok
		})
		if !ok {
			return 0, &FieldError{"messages", "must be an array of message objects"}
		}
	}
	return n + textChars(prompt), nil
}

// textChars accepts a string, an array of strings, or an array of content
// parts ({"type":"text","text":...}); it counts bytes of JSON text, which
// is close enough for an estimate and needs no unescaping.
func textChars(v gjson.Result) int {
	switch {
	case v.Type == gjson.String:
		return len(v.Raw) - 2
	case v.IsArray():
		n := 0
		v.ForEach(func(_, p gjson.Result) bool {
			if p.Type == gjson.String {
				n += len(p.Raw) - 2
			} else if t := p.Get("text"); t.Type == gjson.String {
				n += len(t.Raw) - 2
			}
			return true
		})
		return n
	}
	return 0
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
