package openai

import "github.com/tidwall/gjson"

// ParseMessages reads an Anthropic /v1/messages body with ParseRequest's
// guarantees (strict JSON, a read key at most once, MaxDepth): model, the
// required max_tokens (MaxTokens), stream, and what the model reads for
// PromptTokens: system (a string or text blocks), messages (content a
// string or blocks: text, image and document blocks as a chat's parts;
// tool_use, tool_result and thinking blocks by their text) and tools.
//
// Keys other APIs' servers read as an output cap or a multiplier
// (max_completion_tokens, max_output_tokens, n, best_of) are refused:
// Anthropic refuses them too, and a server that translates to a chat
// engine and passed one on would write past the reservation, which counts
// max_tokens once.
func ParseMessages(body []byte) (Request, error) {
	return parseAnthropic(body, true)
}

// ParseCountTokens reads an Anthropic /v1/messages/count_tokens body: a
// Messages body without max_tokens or stream (both ignored if sent). It
// writes nothing, so MaxTokens is 0.
func ParseCountTokens(body []byte) (Request, error) {
	return parseAnthropic(body, false)
}

var anthropicKeys = [...]string{"model", "max_tokens", "stream", "system", "messages", "tools",
	"mcp_servers", "container", // input the gate cannot see: MCP servers' tools, a code container's files
	"max_completion_tokens", "max_output_tokens", "n", "best_of"} // the last four refused where it generates

func parseAnthropic(body []byte, generates bool) (Request, error) {
	var v [len(anthropicKeys)]gjson.Result
	if err := topLevel(body, anthropicKeys[:], v[:]); err != nil {
		return Request{}, err
	}
	model, maxTokens, stream, system, messages, tools := v[0], v[1], v[2], v[3], v[4], v[5]
	var (
		r   Request
		err error
	)
	if r.Model, err = readModel(model); err != nil {
		return Request{}, err
	}
	if generates {
		if err := refuseForeign(v[8:], anthropicKeys[8:], "max_tokens"); err != nil {
			return Request{}, err
		}
		if maxTokens.Type == gjson.Null {
			return Request{}, &FieldError{"max_tokens", "field required"}
		}
		if r.MaxTokens, err = readPositive("max_tokens", maxTokens); err != nil {
			return Request{}, err
		}
		if r.Stream, err = readBool("stream", stream); err != nil {
			return Request{}, err
		}
	}
	e := estimate{anthropic: true}
	switch {
	case system.Type == gjson.Null:
	case system.Type == gjson.String || system.IsArray():
		e.tokens += TokensPerMessage
		if err := e.content(func() string { return "system" }, system); err != nil {
			return Request{}, err
		}
	default:
		return Request{}, &FieldError{"system", "must be a string or an array of text blocks"}
	}
	if messages.Type == gjson.Null {
		return Request{}, &FieldError{"messages", "field required"}
	}
	if err := e.messages(messages); err != nil {
		return Request{}, err
	}
	if err := e.readTools(tools); err != nil {
		return Request{}, err
	}
	e.blind = e.blind || v[6].Exists() || v[7].Exists()
	r.PromptChars = e.chars
	r.PromptTokens = e.promptTokens()
	r.MaxPromptTokens = r.maxPrompt(&e, len(body))
	r.Choices = 1
	return r, nil
}
