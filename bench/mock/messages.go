package mock

import (
	"encoding/json"
	"net/http"
)

// The Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens), in the shapes of the anthropic SDKs' types.
// A streamed message is message_start (usage.input_tokens), then
// content_block_start and ping at t0, one content_block_delta (text_delta)
// per content event on the cadence, then content_block_stop, message_delta
// (stop_reason, usage.output_tokens) and message_stop. Each event has an
// "event:" line; its data repeats the name as "type". The mock's answer
// always ends as a natural stop: stop_reason "end_turn".

const stopEndTurn = "end_turn"

type anthropicMessage struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// anthropicUsage counts the input read from the prompt cache apart from
// input_tokens, as Anthropic does.
type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens,omitempty"`
	OutputTokens         int `json:"output_tokens"`
}

// Stream events, one struct per shape.
type (
	messageStartEvent struct {
		Type    string           `json:"type"`
		Message anthropicMessage `json:"message"`
	}
	contentBlockEvent struct {
		Type         string         `json:"type"`
		Index        int            `json:"index"`
		ContentBlock *anthropicText `json:"content_block,omitempty"` // content_block_start
		Delta        *anthropicText `json:"delta,omitempty"`         // content_block_delta
	}
	messageDeltaEvent struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage struct {
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	typeOnlyEvent struct {
		Type string `json:"type"`
	}
)

type countTokensResponse struct {
	InputTokens int `json:"input_tokens"`
}

// message is the message object: the whole answer when done, else the
// empty one message_start carries.
func (c *completion) message(text string, done bool) anthropicMessage {
	m := anthropicMessage{
		ID: c.id, Type: "message", Role: "assistant", Model: c.model, Content: []anthropicText{},
		Usage: anthropicUsage{InputTokens: c.promptTokens - c.cachedTokens, CacheReadInputTokens: c.cachedTokens},
	}
	if done {
		reason := stopEndTurn
		m.Content = []anthropicText{{Type: "text", Text: text}}
		m.StopReason, m.Usage.OutputTokens = &reason, c.outputTokens
	}
	return m
}

func (c *completion) messagesOpen(sw *sseWriter) error {
	err := sw.sendNamed("message_start", messageStartEvent{"message_start", c.message("", false)})
	if err == nil {
		err = sw.sendNamed("content_block_start",
			contentBlockEvent{Type: "content_block_start", ContentBlock: &anthropicText{Type: "text"}})
	}
	if err == nil {
		err = sw.sendNamed("ping", typeOnlyEvent{"ping"})
	}
	return err
}

func (c *completion) messagesContent(sw *sseWriter, text string) error {
	return sw.sendNamed("content_block_delta",
		contentBlockEvent{Type: "content_block_delta", Delta: &anthropicText{Type: "text_delta", Text: text}})
}

func (c *completion) messagesMalformed(sw *sseWriter) error {
	b, _ := json.Marshal(c.messageDelta())
	return sw.named("message_delta", b[:len(b)/2])
}

func (c *completion) messageDelta() messageDeltaEvent {
	ev := messageDeltaEvent{Type: "message_delta"}
	ev.Delta.StopReason = stopEndTurn
	ev.Usage.OutputTokens = c.outputTokens
	return ev
}

func (c *completion) messagesClose(sw *sseWriter) error {
	err := sw.sendNamed("content_block_stop", contentBlockEvent{Type: "content_block_stop"})
	if err == nil {
		err = sw.sendNamed("message_delta", c.messageDelta())
	}
	if err == nil {
		err = sw.sendNamed("message_stop", typeOnlyEvent{"message_stop"})
	}
	return err
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeAnthropicError writes Anthropic's error body, its type chosen by
// status as Anthropic's API does.
func writeAnthropicError(w http.ResponseWriter, status int, message string) int {
	e := anthropicError{Type: "error"}
	e.Error.Message = message
	switch {
	case status == http.StatusUnauthorized:
		e.Error.Type = "authentication_error"
	case status == http.StatusPaymentRequired:
		e.Error.Type = "billing_error"
	case status == http.StatusForbidden:
		e.Error.Type = "permission_error"
	case status == http.StatusNotFound:
		e.Error.Type = "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		e.Error.Type = "request_too_large"
	case status == http.StatusTooManyRequests:
		e.Error.Type = "rate_limit_error"
	case status == 529:
		e.Error.Type = "overloaded_error"
	case status >= 500:
		e.Error.Type = "api_error"
	default:
		e.Error.Type = "invalid_request_error"
	}
	return writeJSON(w, status, e)
}
