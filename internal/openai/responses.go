package openai

import (
	"strconv"

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
// A request continuing a stored conversation (previous_response_id) is
// estimated on what it sends: the server adds the earlier turns, which the
// gate cannot see.
func ParseResponses(body []byte) (Request, error) {
	var v [len(responsesKeys)]gjson.Result
	if err := topLevel(body, responsesKeys[:], v[:]); err != nil {
		return Request{}, err
	}
	model, stream, maxOutput, input, instructions, tools, previous := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
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
	e := estimate{list: "input", tokens: TokensPerRequest}
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
	r.Choices = 1
	return r, nil
}

var responsesKeys = [...]string{"model", "stream", "max_output_tokens", "input", "instructions", "tools", "previous_response_id"}

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
