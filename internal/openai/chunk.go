package openai

import (
	"errors"
	"slices"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// CachedTokens is the part of PromptTokens read from the pool's prompt
	// cache (prompt_tokens_details.cached_tokens, Responses'
	// input_tokens_details.cached_tokens, Anthropic's
	// cache_read_input_tokens); CacheWriteTokens the part written to it
	// (Anthropic's cache_creation_input_tokens). Each is priced apart.
	CachedTokens     int `json:"cached_tokens,omitempty"`
	CacheWriteTokens int `json:"cache_write_tokens,omitempty"`
}

// Chunk is what the meter needs from one streamed event (chat.completion.chunk
// or text_completion; a Responses or Anthropic event, see ParseEvent) or
// from a whole non-streamed response (ParseBody).
type Chunk struct {
	// Content is true when the event carries at least one output token:
	// non-empty delta content, reasoning, refusal or tool-call name or
	// arguments, or completion text. A role-only first chunk has no content.
	Content bool
	Usage   *Usage
	// InputOnly: Usage counts the input alone, ahead of the output
	// (Anthropic's message_start). OutputOnly: it counts the output alone,
	// the input being an earlier event's (Anthropic's message_delta
	// without input_tokens).
	InputOnly, OutputOnly bool
	// Model is the model an event's nested object names (a Responses
	// lifecycle event's response.model, message_start's message.model);
	// a top-level "model" is ChunkModel's.
	Model string
}

// ErrBadChunk is an event the meter cannot read; it is skipped, never fatal.
var ErrBadChunk = errors.New("not an OpenAI stream chunk")

// contentFields are the delta/message fields that carry output tokens.
var contentFields = [...]string{"content", "reasoning_content", "reasoning", "refusal"}

// ParseChunk reads one event's data. It runs once per streamed token, so it
// scans the JSON in place (gjson over an unsafe string view of data, valid
// only during the call) and allocates only for a usage chunk. Data nesting
// deeper than MaxDepth is a bad chunk (ErrBadChunk and ErrTooDeep), refused
// before it is validated.
func ParseChunk(data []byte) (Chunk, error) {
	if !depthOK(data) {
		return Chunk{}, errChunkTooDeep
	}
	if len(data) == 0 || !gjson.ValidBytes(data) {
		return Chunk{}, ErrBadChunk
	}
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(data), len(data)))
	if !doc.IsObject() {
		return Chunk{}, ErrBadChunk
	}
	var c Chunk
	ok := true
	doc.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "model":
			ok = v.Type == gjson.String || v.Type == gjson.Null
		case "choices":
			ok = readChoices(v, &c)
		case "usage":
			if v.Type == gjson.Null {
				break
			}
			c.Usage, ok = readUsage(v)
		}
		return ok
	})
	if !ok {
		return Chunk{}, ErrBadChunk
	}
	return c, nil
}

func readChoices(v gjson.Result, c *Chunk) bool {
	if v.Type == gjson.Null {
		return true
	}
	if !v.IsArray() {
		return false
	}
	ok := true
	v.ForEach(func(_, choice gjson.Result) bool {
		if !choice.IsObject() {
			ok = false
			return false
		}
		choice.ForEach(func(key, field gjson.Result) bool {
			switch key.Str {
			case "text":
				ok = textField(field, c)
			case "delta", "message":
				if field.Type == gjson.Null {
					break
				}
				if !field.IsObject() {
					ok = false
					break
				}
				ok = readDelta(field, c)
			}
			return ok
		})
		return ok
	})
	return ok
}

// readDelta reads a delta or message in one pass over its fields (a
// lookup per field name would scan it five times).
func readDelta(delta gjson.Result, c *Chunk) bool {
	ok, seen := true, 0
	delta.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "content", "reasoning_content", "reasoning", "refusal":
			// Like a lookup by name, only the first of a repeated key counts.
			bit := 1 << slices.Index(contentFields[:], key.Str)
			if seen&bit == 0 {
				seen |= bit
				ok = textField(v, c)
			}
		case "tool_calls":
			if seen&16 == 0 && v.IsArray() {
				v.ForEach(func(_, call gjson.Result) bool {
					fn := call.Get("function")
					if fn.Get("name").Str != "" || fn.Get("arguments").Str != "" {
						c.Content = true
					}
					return true
				})
			}
			seen |= 16
		}
		return ok
	})
	return ok
}

// textField marks content for a non-empty string; null and absent are fine,
// any other type is a malformed chunk.
func textField(v gjson.Result, c *Chunk) bool {
	switch v.Type {
	case gjson.String:
		if v.Raw != `""` {
			c.Content = true
		}
		return true
	case gjson.Null:
		return true
	}
	return !v.Exists()
}

func readUsage(v gjson.Result) (*Usage, bool) {
	if !v.IsObject() {
		return nil, false
	}
	u := &Usage{}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"prompt_tokens", &u.PromptTokens}, {"completion_tokens", &u.CompletionTokens}, {"total_tokens", &u.TotalTokens}} {
		n := v.Get(f.name)
		if !n.Exists() || n.Type == gjson.Null {
			continue
		}
		if n.Type != gjson.Number || n.Num < 0 {
			return nil, false
		}
		*f.dst = int(n.Int())
	}
	if d := v.Get("prompt_tokens_details"); d.Exists() && d.Type != gjson.Null {
		n, ok := cachedDetail(d)
		if !ok {
			return nil, false
		}
		u.CachedTokens = n
	}
	return u, true
}

// cachedDetail reads a usage's input details' cached_tokens (0 when
// absent or null); a details value that is not an object, or a count that
// is not a non-negative number, is malformed.
func cachedDetail(d gjson.Result) (int, bool) {
	if !d.IsObject() {
		return 0, false
	}
	n := d.Get("cached_tokens")
	switch {
	case !n.Exists() || n.Type == gjson.Null:
		return 0, true
	case n.Type != gjson.Number || n.Num < 0:
		return 0, false
	}
	return int(min(n.Int(), maxCount)), true
}

// ChunkModel returns the "model" an event or response names ("" if none).
// The meter calls it until it has learned the model, not on every event,
// and only on data ParseChunk accepted. Data nesting deeper than MaxDepth
// names no model: gjson's lookup of a top-level key does not recurse, but
// a chunk that deep is a bad event, whoever calls.
func ChunkModel(data []byte) string {
	if !depthOK(data) {
		return ""
	}
	return strings.Clone(gjson.GetBytes(data, "model").Str)
}
