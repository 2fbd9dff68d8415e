package openai

import (
	"cmp"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// The fixed costs of Request.PromptTokens, in tokens. Where servers differ,
// each is the higher of the common figures, so that the estimate errs high:
// a reservation that is too large is settled down by the meter, one that is
// too small lets a client past its budget.
const (
	// TokensPerMessage is what a chat template wraps around each message.
	// OpenAI's cookbook counts 3 for its chat models (<|start|>{role}
	// <|message|>…<|end|>) and 1 more for a name; Llama 3 uses 5
	// (<|start_header_id|>{role}<|end_header_id|>\n\n…<|eot_id|>), as does
	// ChatML (<|im_start|>{role}\n…<|im_end|>\n, Qwen and others).
	TokensPerMessage = 5
	// TokensPerRequest is what a chat template puts around the conversation:
	// OpenAI primes the reply with 3 (<|start|>assistant<|message|>), ChatML
	// with 3; Llama 3 adds <|begin_of_text|> and a 4-token assistant header.
	TokensPerRequest = 5
	// TokensPerTool is the markup around each tool (and legacy function)
	// definition beyond its JSON: OpenAI's cookbook counts 7 per function for
	// gpt-4o and 10 for gpt-3.5-turbo and gpt-4 (and 12 once per request,
	// covered here by the JSON's own braces and keys, which OpenAI's
	// rendering does not spend).
	TokensPerTool = 10
	// TokensPerToolCall is the markup around each tool call in an assistant
	// message: Hermes-style templates (Qwen and others) write
	// <tool_call>\n{"name": …, "arguments": …}\n</tool_call>, 10 tokens or
	// more around the name and arguments.
	TokensPerToolCall = 10
	// TokensPerPrompt is the beginning-of-sequence token a server adds to
	// each text prompt of /v1/completions (vLLM with Llama's tokenizer does;
	// OpenAI counts none). Token-ID prompts are taken as they are.
	TokensPerPrompt = 1
	// MaxChoices is the largest n or best_of accepted, OpenAI's limit on n.
	MaxChoices = 128
)

// estimate accumulates a request's prompt size in one pass over the parts a
// model reads.
type estimate struct {
	chars   int // text of message content and prompts: Request.PromptChars
	extra   int // other text: roles, names, tool calls, tools, refusals, other message keys
	tokens  int // counted exactly or fixed: token IDs, overheads, images
	prompts int // prompts in a /v1/completions batch
	// list names the array of messages in errors: "messages" when empty,
	// "input" for a Responses request.
	list string
	// anthropic: content blocks are Anthropic's, where tool_use,
	// tool_result and thinking blocks carry text of their own.
	anthropic bool
	// mediaMax is the most the media parts may count (MaxTokensPerImage
	// an image); blind: a part or a tool adds input the gate cannot see.
	mediaMax int
	blind    bool
	// rendered is the JSON text a template may render again with spaces
	// (tools, tool calls and their arguments, Anthropic's tool_use input).
	rendered int
}

// maxPrompt is the most prompt tokens a body of size bytes can make a
// server count (Request.MaxPromptTokens), whatever its tokenizer and
// template: a byte-level tokenizer spends at most a token a byte (JSON's
// escapes only lengthen text), a template that renders JSON again with
// a space after each separator at most a token more a byte of it
// (rendered), what a server adds on its own at most
// MaxHiddenPromptTokens, and a media part at most MaxTokensPerImage. 0
// when a part or tool adds input the gate cannot see.
func (e *estimate) maxPrompt(size int) int {
	if e.blind {
		return 0
	}
	return size + e.rendered + MaxHiddenPromptTokens + e.mediaMax
}

// promptTokens is the estimate: all text at EstimateTokens' rate (so never
// less than EstimateTokens(chars)), plus what was counted in tokens.
func (e *estimate) promptTokens() int { return EstimateTokens(e.chars+e.extra) + e.tokens }

// messages walks a chat conversation. Each message is an object; any key
// in it, in its content parts, its tool calls and their functions may
// appear only once (Python servers read the last of a repeated key, gjson
// the first: the gate must count what the server reads).
func (e *estimate) messages(msgs gjson.Result) error {
	if !msgs.IsArray() {
		return &FieldError{"messages", "must be an array of message objects"}
	}
	e.tokens += TokensPerRequest
	i := 0
	var err error
	msgs.ForEach(func(_, m gjson.Result) bool {
		if !m.IsObject() {
			err = &FieldError{"messages", "must be an array of message objects"}
			return false
		}
		err = e.message(i, m)
		i++
		return err == nil
	})
	return err
}

// message counts one message: its content, its tool calls, and every other
// key's value as text (a role beyond the standard ones, a name, a tool call
// ID, reasoning_content: vLLM hands the whole message to the chat template,
// which may render any of them).
func (e *estimate) message(i int, m gjson.Result) error {
	e.tokens += TokensPerMessage
	path := func() string { return e.itemPath(i) }
	return eachKey(m, path, func(k string, v gjson.Result) error {
		switch k {
		case "content":
			return e.content(func() string { return path() + ".content" }, v)
		case "role":
			if v.Type == gjson.String && standardRole(v.Str) {
				return nil // part of TokensPerMessage
			}
			e.text(v)
		case "tool_calls":
			return e.toolCalls(i, v)
		case "function_call": // the legacy form of one tool call
			e.tokens += TokensPerToolCall
			return e.function(v, func() string { return path() + ".function_call" })
		case "encrypted_content": // reasoning the server decrypts into input
			e.blind = true
			e.text(v)
		case "type":
			// A reference to a stored item: input the gate cannot see.
			e.blind = e.blind || v.Str == "item_reference"
			e.text(v)
		default:
			e.text(v)
		}
		return nil
	})
}

func standardRole(r string) bool {
	switch r {
	case "system", "developer", "user", "assistant", "tool", "function":
		return true
	}
	return false
}

// content counts a message's content (path names it in errors): a string,
// or an array of parts. A part is a string, or an object whose "text" (and
// an assistant's "refusal") is read; any part that is not text
// (image_url, input_audio, file, video_url, ...) costs TokensPerImage.
// PromptChars counts what it always did: strings and "text".
func (e *estimate) content(path func() string, c gjson.Result) error {
	switch {
	case c.Type == gjson.String:
		e.chars += len(c.Raw) - 2
		return nil
	case !c.IsArray():
		e.text(c) // null, or a shape no server accepts
		return nil
	}
	j := 0
	var err error
	c.ForEach(func(_, p gjson.Result) bool {
		switch {
		case p.Type == gjson.String:
			e.chars += len(p.Raw) - 2
		case p.IsObject():
			n := j
			err = e.part(func() string { return path() + "[" + strconv.Itoa(n) + "]" }, p)
		default:
			e.text(p)
		}
		j++
		return err == nil
	})
	return err
}

func (e *estimate) part(path func() string, p gjson.Result) error {
	var typ string
	hasText := false
	if err := eachKey(p, path, func(k string, v gjson.Result) error {
		switch k {
		case "type":
			if v.Type == gjson.String {
				typ = v.Str
			}
		case "text":
			if v.Type == gjson.String {
				e.chars += len(v.Raw) - 2
				hasText = true
			}
		case "refusal":
			if v.Type == gjson.String {
				e.extra += len(v.Raw) - 2
				hasText = true
			}
		}
		return nil
	}); err != nil {
		return err
	}
	switch {
	case textPart(typ):
	case typ == "" && hasText: // vLLM infers the type of an untyped part from its keys
	case e.anthropic && typ != "image" && typ != "document":
		return e.block(path, p)
	default:
		e.media(typ, p)
	}
	return nil
}

// textPart reports whether a content part of type typ is text: chat's
// types, and the Responses API's (which vLLM also accepts in a chat).
func textPart(typ string) bool {
	switch typ {
	case "text", "refusal", "input_text", "output_text":
		return true
	}
	return false
}

// block counts an Anthropic content block that is neither text nor media
// (tool_use, tool_result, thinking, ...): a template renders its values as
// text, and its markup costs TokensPerToolCall.
func (e *estimate) block(path func() string, b gjson.Result) error {
	e.tokens += TokensPerToolCall
	defer e.renders(e.extra)
	var err error
	b.ForEach(func(k, v gjson.Result) bool { // keys already checked for repeats
		switch k.Str {
		case "type", "text", "cache_control", "signature":
		case "content":
			err = e.toolResult(path, v)
		default:
			e.text(v)
		}
		return err == nil
	})
	return err
}

// toolResult counts a tool result's content: a string, or blocks whose
// text is read and whose image or document (its source) costs
// TokensPerImage. Not through content: a walk that does not recurse keeps
// the paths of errors off the heap.
func (e *estimate) toolResult(path func() string, c gjson.Result) error {
	if !c.IsArray() {
		e.text(c)
		return nil
	}
	j := 0
	var err error
	c.ForEach(func(_, p gjson.Result) bool {
		if !p.IsObject() {
			e.text(p)
			j++
			return true
		}
		n := j
		blockPath := func() string { return path() + ".content[" + strconv.Itoa(n) + "]" }
		err = eachKey(p, blockPath, func(k string, v gjson.Result) error {
			switch k {
			case "type", "cache_control":
			case "source":
				e.anthropicSource(v)
			default:
				e.text(v)
			}
			return nil
		})
		j++
		return err == nil
	})
	return err
}

// toolCalls counts an assistant's tool calls: each call's keys but "type"
// (its function's name and arguments, its ID) as text, and
// TokensPerToolCall.
func (e *estimate) toolCalls(i int, calls gjson.Result) error {
	if !calls.IsArray() {
		e.text(calls)
		return nil
	}
	j := 0
	var err error
	calls.ForEach(func(_, c gjson.Result) bool {
		e.tokens += TokensPerToolCall
		if !c.IsObject() {
			e.text(c)
			j++
			return true
		}
		n := j
		path := func() string { return e.itemPath(i) + ".tool_calls[" + strconv.Itoa(n) + "]" }
		err = eachKey(c, path, func(k string, v gjson.Result) error {
			switch k {
			case "type":
			case "function":
				return e.function(v, func() string { return path() + ".function" })
			default:
				e.text(v)
			}
			return nil
		})
		j++
		return err == nil
	})
	return err
}

// renders counts the text e.extra gained since it stood at from as JSON
// a template may render again.
func (e *estimate) renders(from int) { e.rendered += e.extra - from }

// function counts a called function (name, arguments) as text.
func (e *estimate) function(fn gjson.Result, path func() string) error {
	defer e.renders(e.extra)
	if !fn.IsObject() {
		e.text(fn)
		return nil
	}
	return eachKey(fn, path, func(_ string, v gjson.Result) error {
		e.text(v)
		return nil
	})
}

// tools counts tool definitions (tools, or the legacy functions): each
// entry's JSON text without insignificant whitespace (what a template such
// as Hermes' renders, and more than OpenAI's own rendering spends), and
// TokensPerTool. An entry and its function object may not repeat a key.
//
// Tool schemas are most of a body that has them, so this is one pass over
// their bytes (walking them with gjson would read each level again).
func (e *estimate) tools(param string, tools gjson.Result) error {
	if !tools.IsArray() {
		e.text(tools)
		return nil
	}
	raw := tools.Raw // valid JSON: ParseRequest validated the body
	var (
		depth          int
		object         uint64 // bit d: the container at depth d is an object (d <= MaxDepth)
		key            bool   // the next string is a key
		entry          int    // the current entry's index: commas at depth 1
		entries        bool   // the array has an entry
		function       bool   // the last key of the entry was "function"
		inFunction     bool   // the object at depth 3 is the entry's function
		chars          int
		entryKeys, fns keySet
	)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		chars++
		if depth == 1 && c != ']' && c != ',' {
			entries = true
		}
		switch c {
		case '{', '[':
			depth++
			key = c == '{'
			object = object&^(1<<depth) | boolBit(key)<<depth
			switch {
			case depth == 2:
				entryKeys, function = keySet{}, false
			case depth == 3 && key && function:
				fns, inFunction = keySet{}, true
			}
		case '}', ']':
			if depth == 3 {
				inFunction = false
			}
			depth--
			key = false
		case ',':
			key = object&(1<<depth) != 0
			switch depth {
			case 1:
				entry++
			case 2:
				function = false
			}
		case ':':
			key = false
		case '"':
			j := i + 1
			for {
				j += strings.IndexByte(raw[j:], '"')
				b := 0
				for raw[j-1-b] == '\\' {
					b++
				}
				if b%2 == 0 {
					break
				}
				j++
			}
			if key && (depth == 2 || depth == 3 && inFunction) {
				k := raw[i+1 : j]
				if strings.IndexByte(k, '\\') >= 0 {
					k = gjson.Parse(raw[i : j+1]).Str
				}
				if depth == 2 {
					if entryKeys.add(k) {
						return duplicate(param+"["+strconv.Itoa(entry)+"]", k)
					}
					function = k == "function"
				} else if fns.add(k) {
					return duplicate(param+"["+strconv.Itoa(entry)+"].function", k)
				}
			}
			chars += j - i
			i = j
		}
	}
	if entries {
		e.tokens += (entry + 1) * TokensPerTool
	}
	e.extra += chars - 2 - entry // the array's brackets and commas
	e.rendered += chars
	tools.ForEach(func(_, t gjson.Result) bool {
		// A tool the server runs itself (web or file search, code
		// execution, a connector) adds input the gate cannot see; only
		// functions (and Anthropic's, untyped) are the client's.
		switch typ := t.Get("type"); typ.Str {
		case "function", "custom":
		default:
			e.blind = e.blind || typ.Exists()
		}
		return !e.blind
	})
	return nil
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// prompt counts a /v1/completions prompt: a string, an array of strings,
// an array of token IDs, or an array of arrays of token IDs. Each ID is one
// token; each string, or array of IDs, is one prompt of a batch. PromptChars
// counts what it always did: strings, and "text" of objects in an array.
func (e *estimate) prompt(p gjson.Result) {
	switch {
	case p.Type == gjson.String:
		e.chars += len(p.Raw) - 2
		e.tokens += TokensPerPrompt
		e.prompts = 1
	case p.IsArray():
		e.promptArray(p.Raw)
	}
	// Anything else is null, or a shape no server accepts.
}

// promptArray counts an array prompt in one pass over its bytes: token IDs
// are the cheapest bytes a client can send (2 bytes an ID) and the dearest
// to walk value by value, so each value is counted by its first byte and
// skipped, with no value decoded. raw is valid JSON (the body was
// validated); on anything else it neither panics nor reads past raw.
//
// Of each element: a string is a text prompt; an array is a prompt of
// token IDs, each of its values one token (a string there, which no
// server accepts, is counted as text); any other value is a token ID of
// the one prompt all of them make (an object, which no server accepts,
// adds its "text").
func (e *estimate) promptArray(raw string) {
	inner := false // in an array element
	ids := false   // an element was a bare token ID
scan:
	for i := 1; i < len(raw); i++ {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r', ',':
		case ']':
			if !inner {
				break scan // the prompt's end
			}
			inner = false
		case '"':
			j := stringEnd(raw, i)
			if inner {
				e.extra += j - i - 1
			} else {
				e.chars += j - i - 1
				e.tokens += TokensPerPrompt
				e.prompts++
			}
			i = j
		case '[', '{':
			if c == '[' && !inner {
				inner = true
				e.prompts++
				continue
			}
			j := containerEnd(raw, i)
			e.tokens++
			if !inner {
				ids = true
				if t := gjson.Get(raw[i:j+1], "text"); c == '{' && t.Type == gjson.String {
					e.chars += len(t.Raw) - 2
				}
			}
			i = j
		default: // a number, true, false or null: one token ID
			e.tokens++
			ids = ids || !inner
			for i+1 < len(raw) && !valueEnd(raw[i+1]) {
				i++
			}
		}
	}
	if ids {
		e.prompts++
	}
}

// valueEnd reports whether c ends a number or a literal.
func valueEnd(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// stringEnd is the index of the quote that closes the string opening at
// raw[i]: the first one after an even run of backslashes (the run cannot
// reach back past the opening quote). Without one, the last index.
func stringEnd(raw string, i int) int {
	j := i + 1
	for {
		k := strings.IndexByte(raw[j:], '"')
		if k < 0 {
			return len(raw) - 1
		}
		j += k
		b := 0
		for raw[j-1-b] == '\\' {
			b++
		}
		if b%2 == 0 {
			return j
		}
		j++
	}
}

// containerEnd is the index of the bracket that closes the array or
// object opening at raw[i], strings skipped. Without one, the last index.
func containerEnd(raw string, i int) int {
	depth := 0
	for ; i < len(raw); i++ {
		switch raw[i] {
		case '[', '{':
			depth++
		case ']', '}':
			if depth--; depth == 0 {
				return i
			}
		case '"':
			i = stringEnd(raw, i)
		}
	}
	return len(raw) - 1
}

// text counts a value a template may render as text: a string by its
// length, anything else by its JSON text without insignificant whitespace.
func (e *estimate) text(v gjson.Result) {
	switch v.Type {
	case gjson.Null:
	case gjson.String:
		e.extra += len(v.Raw) - 2
	case gjson.JSON:
		e.extra += compactLen(v.Raw)
	default:
		e.extra += len(v.Raw)
	}
}

// compactLen is the length of JSON text without the whitespace between its
// tokens: the same for a body however the client formatted it.
func compactLen(raw string) int {
	n := 0
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
		case '"':
			// The closing quote is the first one after an even run of
			// backslashes; the run cannot reach back past the opening one.
			j := i + 1
			for {
				k := strings.IndexByte(raw[j:], '"')
				if k < 0 {
					return n + len(raw) - i // not JSON: count the rest
				}
				j += k
				b := 0
				for raw[j-1-b] == '\\' {
					b++
				}
				if b%2 == 0 {
					break
				}
				j++
			}
			n += j + 1 - i
			i = j
		default:
			n++
		}
	}
	return n
}

// eachKey calls fn for each key of obj until fn fails, and fails itself
// on the first key that appears a second time (the empty key too), naming
// it under path().
func eachKey(obj gjson.Result, path func() string, fn func(key string, v gjson.Result) error) error {
	var seen keySet
	var err error
	obj.ForEach(func(k, v gjson.Result) bool {
		if seen.add(k.Str) {
			err = duplicate(path(), k.Str)
		} else {
			err = fn(k.Str, v)
		}
		return err == nil
	})
	return err
}

// ignore is an eachKey callback for objects only checked for repeats.
func ignore(string, gjson.Result) error { return nil }

// keySet finds a repeated key: a scan while the object is small (a message
// has two to four keys), a map past that, so an object of many keys is
// still read in linear time.
type keySet struct {
	n     int
	small [8]string
	big   map[string]struct{}
}

// add reports whether k was already in the set, and adds it.
func (s *keySet) add(k string) bool {
	if s.big == nil {
		for _, x := range s.small[:s.n] {
			if x == k {
				return true
			}
		}
		if s.n < len(s.small) {
			s.small[s.n] = k
			s.n++
			return false
		}
		s.big = make(map[string]struct{}, 4*len(s.small))
		for _, x := range s.small {
			s.big[x] = struct{}{}
		}
	}
	if _, ok := s.big[k]; ok {
		return true
	}
	s.big[k] = struct{}{}
	return false
}

// itemPath names message i in errors, as in messages[3].
func (e *estimate) itemPath(i int) string {
	return cmp.Or(e.list, "messages") + "[" + strconv.Itoa(i) + "]"
}

// maxKeyInParam bounds how much of a client's key an error repeats.
const maxKeyInParam = 64

// duplicate is the error for key repeated in the object at path: the Param
// names the key, as for a repeated top-level key.
func duplicate(path, key string) error {
	if len(key) > maxKeyInParam {
		key = key[:maxKeyInParam] + "..."
	}
	return &FieldError{path + "." + strings.ToValidUTF8(key, "\uFFFD"), "appears more than once"}
}
