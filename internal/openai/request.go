// Package openai holds the small part of the OpenAI wire format infergate
// needs: the fields of a request body the gate decides on, the stream chunks
// the meter counts, and the error body every denial uses.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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

type rawRequest struct {
	Model               json.RawMessage `json:"model"`
	Stream              json.RawMessage `json:"stream"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
}

// FieldError names the request field that is wrong.
type FieldError struct {
	Param string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Param, e.Msg) }
func (e *FieldError) Unwrap() error { return ErrInvalidField }

// ParseRequest decodes the fields of a chat or text completion body that the
// gate needs, and rejects bodies an upstream would reject anyway.
func ParseRequest(body []byte) (Request, error) {
	// Decode into a map, not straight into rawRequest: encoding/json matches
	// struct fields case-insensitively, so {"model":"a","MODEL":"b"} would be
	// gated (and routed) as "b" while the model server serves "a". Keys must
	// match exactly, as they do upstream.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' {
		return Request{}, ErrInvalidJSON
	}
	raw := rawRequest{
		Model:               fields["model"],
		Stream:              fields["stream"],
		MaxTokens:           fields["max_tokens"],
		MaxCompletionTokens: fields["max_completion_tokens"],
		StreamOptions:       fields["stream_options"],
		Messages:            fields["messages"],
		Prompt:              fields["prompt"],
	}
	var r Request
	if isNull(raw.Model) {
		return Request{}, ErrMissingModel
	}
	if err := json.Unmarshal(raw.Model, &r.Model); err != nil {
		return Request{}, &FieldError{"model", "must be a string"}
	}
	if strings.TrimSpace(r.Model) == "" {
		return Request{}, ErrMissingModel
	}
	if !isNull(raw.Stream) {
		if err := json.Unmarshal(raw.Stream, &r.Stream); err != nil {
			return Request{}, &FieldError{"stream", "must be a boolean"}
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"max_tokens", raw.MaxTokens}, {"max_completion_tokens", raw.MaxCompletionTokens}} {
		if isNull(f.raw) {
			continue
		}
		var n int
		if err := json.Unmarshal(f.raw, &n); err != nil || n < 1 {
			return Request{}, &FieldError{f.name, "must be a positive integer"}
		}
		if r.MaxTokens == 0 || f.name == "max_completion_tokens" {
			r.MaxTokens = n
		}
	}
	if !isNull(raw.StreamOptions) {
		var so map[string]json.RawMessage // exact keys, as above
		if err := json.Unmarshal(raw.StreamOptions, &so); err != nil {
			return Request{}, &FieldError{"stream_options", "must be an object"}
		}
		if iu := so["include_usage"]; !isNull(iu) {
			var b bool
			if err := json.Unmarshal(iu, &b); err != nil {
				return Request{}, &FieldError{"stream_options", "must be an object"}
			}
			r.IncludeUsage = &b
		}
	}
	n, err := promptChars(raw.Messages, raw.Prompt)
	if err != nil {
		return Request{}, err
	}
	r.PromptChars = n
	return r, nil
}

func isNull(b json.RawMessage) bool { return len(b) == 0 || string(b) == "null" }

// promptChars counts the text a model will read, for token estimation.
// Non-text parts (images, audio) are not counted.
func promptChars(messages, prompt json.RawMessage) (int, error) {
	n := 0
	if !isNull(messages) {
		var msgs []struct {
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(messages, &msgs); err != nil {
			return 0, &FieldError{"messages", "must be an array of message objects"}
		}
		for _, m := range msgs {
			n += textChars(m.Content)
		}
	}
	if !isNull(prompt) {
		n += textChars(prompt)
	}
	return n, nil
}

// textChars accepts a string, an array of strings, or an array of content
// parts ({"type":"text","text":...}).
func textChars(v json.RawMessage) int {
	if isNull(v) {
		return 0
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return len(s)
	}
	var parts []json.RawMessage
	if json.Unmarshal(v, &parts) != nil {
		return 0
	}
	n := 0
	for _, p := range parts {
		if json.Unmarshal(p, &s) == nil {
			n += len(s)
			continue
		}
		var part struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(p, &part) == nil {
			n += len(part.Text)
		}
	}
	return n
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
func WithUsage(body []byte) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	if obj == nil { // "null" decodes without error and has no '}' to splice at
		return nil, ErrInvalidJSON
	}
	so, ok := obj["stream_options"]
	if !ok {
		// Fast path: splice the field before the closing brace, keeping the
		// client's bytes (and key order) as they were.
		end := bytes.LastIndexByte(body, '}')
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:end]...)
		if len(obj) > 0 {
			out = append(out, ',')
		}
		out = append(out, `"stream_options":{"include_usage":true}`...)
		return append(out, body[end:]...), nil
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(so, &opts); err != nil {
		return nil, &FieldError{"stream_options", "must be an object"}
	}
	if opts == nil { // "stream_options": null
		opts = map[string]json.RawMessage{}
	}
	opts["include_usage"] = json.RawMessage("true")
	obj["stream_options"], _ = json.Marshal(opts)
	return json.Marshal(obj)
}
