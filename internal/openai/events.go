package openai

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// The meter's reading of the APIs that name their events: the Responses
// API and Anthropic's Messages. Like ParseChunk they run once per streamed
// token, so they scan the JSON in place (gjson over an unsafe view of the
// data, valid only during the call) in one pass over the top-level keys,
// and allocate only for the few events that carry the usage or the model.
//
// What counts as content (an output token):
//
//   - Responses: every "*.delta" event with a non-empty string delta:
//     the API streams all its output that way (output_text, refusal,
//     reasoning text and summaries, function-call and custom-tool
//     arguments, audio and its transcript). The usage is the lifecycle
//     event's response.usage (response.completed, .incomplete, .failed).
//   - Anthropic: content_block_delta with a non-empty text_delta text,
//     input_json_delta partial_json or thinking_delta thinking: the
//     model writes each, and each is billed as output tokens (as chat's
//     tool-call arguments and reasoning are). signature_delta and
//     citations_delta are not: a signature the API attaches, a citation
//     of the input. ping, content_block_start/stop, message_stop: no.
//     message_start carries the input's usage, message_delta the output's.

// ParseEvent reads one streamed event of api: name is its "event:" field
// (empty: the data's "type" names it). Chat, text completions and any API
// that streams no named events are ParseChunk's.
func ParseEvent(api API, name, data []byte) (Chunk, error) {
	switch api {
	case APIResponses:
		return parseResponsesEvent(name, data)
	case APIMessages:
		return parseMessagesEvent(name, data)
	}
	return ParseChunk(data)
}

// eventDoc is data as a JSON object, checked as ParseChunk checks a chunk.
func eventDoc(data []byte) (gjson.Result, error) {
	if !depthOK(data) {
		return gjson.Result{}, errChunkTooDeep
	}
	if len(data) == 0 || !gjson.ValidBytes(data) {
		return gjson.Result{}, ErrBadChunk
	}
	doc := gjson.Parse(view(data))
	if !doc.IsObject() {
		return gjson.Result{}, ErrBadChunk
	}
	return doc, nil
}

// view is b as a string without a copy, valid while b is.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// topFields reads an event's "type" and up to three other top-level keys in
// one pass (only the first of a repeated key counts, as with a lookup). The
// type must be a string; typ is it unless the event is named.
func topFields(doc gjson.Result, name []byte, keys [3]string) (typ string, vals [3]gjson.Result, ok bool) {
	typ, ok = view(name), true
	seen := 0
	doc.ForEach(func(key, v gjson.Result) bool {
		if key.Str == "type" {
			if seen&8 == 0 {
				seen |= 8
				ok = v.Type == gjson.String
				if len(name) == 0 {
					typ = v.Str
				}
			}
			return ok
		}
		for i, k := range keys {
			if key.Str == k && seen&(1<<i) == 0 {
				seen |= 1 << i
				vals[i] = v
			}
		}
		return true
	})
	return typ, vals, ok
}

func parseResponsesEvent(name, data []byte) (Chunk, error) {
	doc, err := eventDoc(data)
	if err != nil {
		return Chunk{}, err
	}
	typ, v, ok := topFields(doc, name, [3]string{"delta", "response"})
	if !ok {
		return Chunk{}, ErrBadChunk
	}
	var c Chunk
	switch delta, resp := v[0], v[1]; {
	case strings.HasSuffix(typ, ".delta"):
		c.Content = delta.Type == gjson.String && delta.Raw != `""`
	case resp.Exists() && strings.HasPrefix(typ, "response."):
		if !readModelUsage(resp, &c, responsesInput) {
			return Chunk{}, ErrBadChunk
		}
	}
	return c, nil
}

// readModelUsage reads the model and the usage of a response object (a
// Responses lifecycle event's response, Anthropic's message_start message),
// the usage's input counted from inputs.
func readModelUsage(obj gjson.Result, c *Chunk, inputs []string) bool {
	if !obj.IsObject() {
		return false
	}
	ok := true
	obj.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "model":
			if c.Model == "" {
				c.Model = strings.Clone(v.Str)
			}
		case "usage":
			if v.Type != gjson.Null && c.Usage == nil {
				c.Usage, _, ok = readTokens(v, inputs, "output_tokens")
			}
		}
		return ok
	})
	return ok
}

func parseMessagesEvent(name, data []byte) (Chunk, error) {
	doc, err := eventDoc(data)
	if err != nil {
		return Chunk{}, err
	}
	typ, v, ok := topFields(doc, name, [3]string{"delta", "message", "usage"})
	if !ok {
		return Chunk{}, ErrBadChunk
	}
	var c Chunk
	switch delta, message, usage := v[0], v[1], v[2]; typ {
	case "content_block_delta":
		if !delta.IsObject() {
			return Chunk{}, ErrBadChunk
		}
		delta.ForEach(func(key, v gjson.Result) bool {
			switch key.Str {
			case "text", "partial_json", "thinking":
				if v.Type == gjson.String && v.Raw != `""` {
					c.Content = true
				}
			}
			return !c.Content
		})
	case "message_start":
		if !readModelUsage(message, &c, anthropicInput) {
			return Chunk{}, ErrBadChunk
		}
		c.InputOnly = c.Usage != nil // its output_tokens is a placeholder
	case "message_delta":
		if usage.Type == gjson.Null || !usage.Exists() {
			break
		}
		var input bool
		if c.Usage, input, ok = readTokens(usage, anthropicInput, "output_tokens"); !ok {
			return Chunk{}, ErrBadChunk
		}
		c.OutputOnly = !input
	}
	return c, nil
}

// The usage fields each API counts its input in: Anthropic counts the
// input read from and written to its prompt cache apart from the rest;
// OpenAI's input_tokens includes the cached (a detail of it).
var (
	responsesInput = []string{"input_tokens"}
	anthropicInput = []string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}
)

// maxCount bounds one count before the input's are summed (the meter
// bounds the sum far lower).
const maxCount = 1 << 48

// readTokens reads a usage object in an API's names: the input is the sum
// of inputs, the output is output. A count that is neither a non-negative
// number nor null is malformed. input reports whether any input was there.
func readTokens(v gjson.Result, inputs []string, output string) (u *Usage, input, ok bool) {
	if !v.IsObject() {
		return nil, false, false
	}
	u = &Usage{}
	ok = true
	v.ForEach(func(key, n gjson.Result) bool {
		if key.Str == "input_tokens_details" && n.Type != gjson.Null { // Responses: a part of input_tokens
			u.CachedTokens, ok = cachedDetail(n)
			return ok
		}
		in := false
		for _, k := range inputs {
			in = in || key.Str == k
		}
		if !in && key.Str != output || n.Type == gjson.Null {
			return true
		}
		if n.Type != gjson.Number || n.Num < 0 {
			ok = false
			return false
		}
		count := int(min(n.Int(), maxCount))
		if in {
			input = true
			u.PromptTokens += count
			switch key.Str { // Anthropic's cache parts, counted apart from input_tokens
			case "cache_read_input_tokens":
				u.CachedTokens = count
			case "cache_creation_input_tokens":
				u.CacheWriteTokens = count
			}
		} else {
			u.CompletionTokens = count
		}
		return true
	})
	if !ok {
		return nil, false, false
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u, input, true
}

// ParseBody reads a whole non-streamed response of api for the meter: its
// usage and whether it carries content (its model is ChunkModel's). A
// Responses answer carries content when its output holds an item, an
// Anthropic message when its content holds a block; count_tokens' count is
// its usage's input. Chat, text completions and embeddings (whose usage
// has prompt_tokens alone, and no choices) are ParseChunk's.
func ParseBody(api API, data []byte) (Chunk, error) {
	var contentKey string
	var inputs []string
	switch api {
	case APIResponses:
		contentKey, inputs = "output", responsesInput
	case APIMessages:
		contentKey, inputs = "content", anthropicInput
	case APICountTokens:
		return parseCount(data)
	default:
		return ParseChunk(data)
	}
	doc, err := eventDoc(data)
	if err != nil {
		return Chunk{}, err
	}
	var c Chunk
	ok := true
	doc.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case contentKey:
			if v.Type != gjson.Null && !v.IsArray() {
				ok = false
			} else if v.IsArray() && v.Get("#").Int() > 0 {
				c.Content = true
			}
		case "usage":
			if v.Type != gjson.Null && c.Usage == nil {
				c.Usage, _, ok = readTokens(v, inputs, "output_tokens")
			}
		case "model":
			ok = v.Type == gjson.String || v.Type == gjson.Null
		}
		return ok
	})
	if !ok {
		return Chunk{}, ErrBadChunk
	}
	return c, nil
}

// parseCount reads count_tokens' answer, {"input_tokens": N}.
func parseCount(data []byte) (Chunk, error) {
	doc, err := eventDoc(data)
	if err != nil {
		return Chunk{}, err
	}
	n := doc.Get("input_tokens")
	switch {
	case n.Type == gjson.Number && n.Num >= 0:
		return Chunk{Usage: &Usage{PromptTokens: int(min(n.Int(), maxCount)), TotalTokens: int(min(n.Int(), maxCount))}}, nil
	case n.Exists() && n.Type != gjson.Null:
		return Chunk{}, ErrBadChunk
	}
	return Chunk{}, nil
}

// anthropicEvents are the names of Anthropic's stream events that no
// other API uses.
var anthropicEvents = map[string]bool{
	"message_start": true, "message_delta": true, "message_stop": true,
	"content_block_start": true, "content_block_delta": true, "content_block_stop": true,
}

// StreamAPI names the API of a stream from one of its events, for a meter
// the gate did not tell: a "response.*" event is the Responses API's, an
// Anthropic event name Anthropic's, an unnamed event whose "type" is
// neither a text completion's or a chat's. It is "" for an event that
// does not tell (a named event of no known API: an error, a ping).
func StreamAPI(name, data []byte) API {
	typ := view(name)
	if len(name) == 0 && depthOK(data) {
		typ = gjson.GetBytes(data, "type").Str
	}
	switch {
	case strings.HasPrefix(typ, "response."):
		return APIResponses
	case anthropicEvents[typ]:
		return APIMessages
	case len(name) > 0:
		return ""
	}
	if depthOK(data) && gjson.GetBytes(data, "object").Str == "text_completion" {
		return APICompletions
	}
	return APIChat
}

// BodyAPI names the API of a non-streamed response from its start, by its
// "object" (or Anthropic's "type"); "" when it does not tell.
func BodyAPI(data []byte) API {
	if !depthOK(data) {
		return ""
	}
	r := gjson.GetManyBytes(data, "object", "type")
	switch r[0].Str {
	case "chat.completion":
		return APIChat
	case "text_completion":
		return APICompletions
	case "response":
		return APIResponses
	case "list": // embeddings, or a model listing
		if gjson.GetBytes(data, "data.0.object").Str == "embedding" {
			return APIEmbeddings
		}
	}
	if r[1].Str == "message" {
		return APIMessages
	}
	return ""
}
