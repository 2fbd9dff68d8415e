package openai

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// ParseResponses reads a /v1/responses body with ParseRequest's guarantees
// (strict JSON, a read key at most once, MaxDepth): model, stream,
// max_output_tokens (MaxTokens), previous_response_id, and what the model
// reads for PromptTokens: instructions, input (a string, or an array of
// items: messages whose content is a string or input_text, input_image,
// ... parts, and other items such as function_call_output, counted as
// text) and tools, as a chat's messages and tools are counted. Any key of
// an item or a content part may appear only once.
//
// It also reads what makes a request's cost one the gate cannot bound
// (Request.Unbounded): background, conversation, prompt (a stored
// template: its id, and its variables counted as text) and
// previous_response_id, and store. Such a request is estimated on what it
// sends: the server adds the stored turns or template, which the gate
// cannot see.
//
// Keys other APIs' servers read as an output cap or a multiplier
// (max_tokens, max_completion_tokens, n, best_of) are refused: OpenAI
// refuses them on this API too, and a server built on a chat engine that
// read one would write past the reservation, which counts
// max_output_tokens once.
func ParseResponses(body []byte) (Request, error) {
	var v [len(responsesKeys)]gjson.Result
	if err := topLevel(body, responsesKeys[:], v[:]); err != nil {
		return Request{}, err
	}
	model, stream, maxOutput, input, instructions, tools, previous := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	background, conversation, prompt, store := v[7], v[8], v[9], v[10]
	if err := refuseForeign(v[11:], responsesKeys[11:], "max_output_tokens"); err != nil {
		return Request{}, err
	}
	var (
		r   Request
		err error
	)
	if r.Model, err = readModel(model); err != nil {
		return Request{}, err
	}
	if r.Stream, err = readBool("stream", stream); err != nil {
		return Request{}, err
	}
	if r.MaxTokens, err = readPositive("max_output_tokens", maxOutput); err != nil {
		return Request{}, err
	}
	if r.PreviousResponseID, err = readID("previous_response_id", previous); err != nil {
		return Request{}, err
	}
	if r.Background, err = readBool("background", background); err != nil {
		return Request{}, err
	}
	r.Store = true // the API's default: responses are stored unless told not to
	if store.Type != gjson.Null {
		if r.Store, err = readBool("store", store); err != nil {
			return Request{}, err
		}
	}
	if r.Conversation, err = readConversation(conversation); err != nil {
		return Request{}, err
	}
	e := estimate{list: "input", tokens: TokensPerRequest}
	if r.PromptID, err = e.storedPrompt(prompt); err != nil {
		return Request{}, err
	}
	switch {
	case instructions.Type == gjson.Null:
	case instructions.Type == gjson.String:
		e.chars += len(instructions.Raw) - 2
		e.tokens += TokensPerMessage // rendered as a system message
	default:
		return Request{}, &FieldError{"instructions", "must be a string"}
	}
	if err := e.responsesInput(input); err != nil {
		return Request{}, err
	}
	if err := e.readTools(tools); err != nil {
		return Request{}, err
	}
	r.PromptChars = e.chars
	r.PromptTokens = e.promptTokens()
	r.MaxPromptTokens = r.maxPrompt(&e, len(body))
	r.Choices = 1
	return r, nil
}

var responsesKeys = [...]string{"model", "stream", "max_output_tokens", "input", "instructions", "tools", "previous_response_id",
	"background", "conversation", "prompt", "store",
	"max_tokens", "max_completion_tokens", "n", "best_of"} // the last four refused (refuseForeign)

// readConversation is a conversation's id: the string itself or an
// object's id; "" when absent or null.
func readConversation(v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.Null:
		return "", nil
	case v.Type == gjson.String:
		return readID("conversation", v)
	case !v.IsObject():
		return "", &FieldError{"conversation", "must be a conversation id or an object with an id"}
	}
	var id gjson.Result
	if err := eachKey(v, func() string { return "conversation" }, func(k string, x gjson.Result) error {
		if k == "id" {
			id = x
		}
		return nil
	}); err != nil {
		return "", err
	}
	if id.Type == gjson.Null {
		return "", &FieldError{"conversation.id", "field required"}
	}
	return readID("conversation.id", id)
}

// storedPrompt reads a prompt template reference, {"id", "version",
// "variables"}, and counts its variables as text (the server renders them
// into a template the gate cannot see); it returns the id, "" when absent
// or null.
func (e *estimate) storedPrompt(v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.Null:
		return "", nil
	case !v.IsObject():
		return "", &FieldError{"prompt", "must be an object with an id"}
	}
	var id, version, vars gjson.Result
	if err := eachKey(v, func() string { return "prompt" }, func(k string, x gjson.Result) error {
		switch k {
		case "id":
			id = x
		case "version":
			version = x
		case "variables":
			vars = x
		}
		return nil
	}); err != nil {
		return "", err
	}
	if id.Type == gjson.Null {
		return "", &FieldError{"prompt.id", "field required"}
	}
	s, err := readID("prompt.id", id)
	if err != nil {
		return "", err
	}
	if _, err := readID("prompt.version", version); err != nil {
		return "", err
	}
	switch {
	case vars.Type == gjson.Null:
	case !vars.IsObject():
		return "", &FieldError{"prompt.variables", "must be an object"}
	default:
		if err := eachKey(vars, func() string { return "prompt.variables" }, func(_ string, x gjson.Result) error {
			e.text(x)
			return nil
		}); err != nil {
			return "", err
		}
	}
	return s, nil
}

// refuseForeign refuses any of keys present (not null) in vals: output
// caps and multipliers an API does not define, which a server of another
// API's engine may read anyway. The message names the API's own key.
func refuseForeign(vals []gjson.Result, keys []string, own string) error {
	for i, v := range vals {
		if v.Type != gjson.Null {
			msg := "is not a parameter of this API"
			if strings.HasPrefix(keys[i], "max_") {
				msg += "; use " + own
			}
			return &FieldError{keys[i], msg}
		}
	}
	return nil
}

// responsesInput counts a Responses input: a string is one user message;
// each item of an array is counted as a chat message is (its content, and
// every other key's value as text).
func (e *estimate) responsesInput(in gjson.Result) error {
	switch {
	case in.Type == gjson.Null:
		return nil
	case in.Type == gjson.String:
		e.chars += len(in.Raw) - 2
		e.tokens += TokensPerMessage
		return nil
	case !in.IsArray():
		return &FieldError{"input", "must be a string or an array of input items"}
	}
	i := 0
	var err error
	in.ForEach(func(_, item gjson.Result) bool {
		if !item.IsObject() {
			err = &FieldError{"input[" + strconv.Itoa(i) + "]", "must be an input item object"}
			return false
		}
		err = e.message(i, item)
		i++
		return err == nil
	})
	return err
}
