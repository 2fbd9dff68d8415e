package mock

import (
	"encoding/json"
	"strings"
)

// The OpenAI Responses API (POST /v1/responses), in the shapes of the
// openai SDKs' types (openai-python src/openai/types/responses/). A
// streamed response is the event sequence the API emits for one text
// message: response.created, response.in_progress,
// response.output_item.added and response.content_part.added at t0, one
// response.output_text.delta per content event on the cadence, then
// response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed (with usage). Each
// event has an "event:" line and a sequence_number; there is no [DONE].
// The mock's answer is always complete: status "completed", never
// "incomplete" at max_output_tokens.

type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Error              *struct{}         `json:"error"`
	IncompleteDetails  *struct{}         `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Model              string            `json:"model"`
	Output             []responseMessage `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	ToolChoice         string            `json:"tool_choice"`
	Tools              []struct{}        `json:"tools"`
	Truncation         string            `json:"truncation"`
	Usage              *responseUsage    `json:"usage"`
	Metadata           struct{}          `json:"metadata"`
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type responseMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
}

type outputText struct {
	Type        string     `json:"type"`
	Annotations []struct{} `json:"annotations"`
	Logprobs    []struct{} `json:"logprobs"`
	Text        string     `json:"text"`
}

// Stream events, one struct per shape.
type (
	responseLifecycleEvent struct {
		Type           string         `json:"type"`
		SequenceNumber int            `json:"sequence_number"`
		Response       responseObject `json:"response"`
	}
	responseItemEvent struct {
		Type           string          `json:"type"`
		SequenceNumber int             `json:"sequence_number"`
		OutputIndex    int             `json:"output_index"`
		Item           responseMessage `json:"item"`
	}
	responsePartEvent struct {
		Type           string     `json:"type"`
		SequenceNumber int        `json:"sequence_number"`
		ItemID         string     `json:"item_id"`
		OutputIndex    int        `json:"output_index"`
		ContentIndex   int        `json:"content_index"`
		Part           outputText `json:"part"`
	}
	responseDeltaEvent struct {
		Type           string     `json:"type"`
		SequenceNumber int        `json:"sequence_number"`
		ItemID         string     `json:"item_id"`
		OutputIndex    int        `json:"output_index"`
		ContentIndex   int        `json:"content_index"`
		Delta          string     `json:"delta"`
		Logprobs       []struct{} `json:"logprobs"`
	}
	responseTextDoneEvent struct {
		Type           string     `json:"type"`
		SequenceNumber int        `json:"sequence_number"`
		ItemID         string     `json:"item_id"`
		OutputIndex    int        `json:"output_index"`
		ContentIndex   int        `json:"content_index"`
		Text           string     `json:"text"`
		Logprobs       []struct{} `json:"logprobs"`
	}
)

// itemID is the output message's id, derived from the response's.
func (c *completion) itemID() string { return "msg_" + strings.TrimPrefix(c.id, "resp_") }

func (c *completion) outputText(text string) outputText {
	return outputText{Type: "output_text", Annotations: []struct{}{}, Logprobs: []struct{}{}, Text: text}
}

// outputMessage is the message item; content is nil while it is open.
func (c *completion) outputMessage(status string, content []outputText) responseMessage {
	if content == nil {
		content = []outputText{}
	}
	return responseMessage{ID: c.itemID(), Type: "message", Status: status, Content: content, Role: "assistant"}
}

// response is the response object in status; a completed one carries its
// message and usage.
func (c *completion) response(status, text string) responseObject {
	r := responseObject{
		ID: c.id, Object: "response", CreatedAt: c.created, Status: status,
		Instructions: c.instructions, MaxOutputTokens: c.maxOutputTokens, Model: c.model,
		Output: []responseMessage{}, ParallelToolCalls: true, ToolChoice: "auto", Tools: []struct{}{},
		Truncation: "disabled",
	}
	if status == "completed" {
		r.Output = []responseMessage{c.outputMessage("completed", []outputText{c.outputText(text)})}
		r.Usage = &responseUsage{InputTokens: c.promptTokens, OutputTokens: c.outputTokens, TotalTokens: c.promptTokens + c.outputTokens}
		r.Usage.InputTokensDetails.CachedTokens = c.cachedTokens
	}
	return r
}

func (c *completion) responsesOpen(sw *sseWriter) error {
	open := c.response("in_progress", "")
	err := sw.sendNamed("response.created", responseLifecycleEvent{"response.created", sw.seq, open})
	if err == nil {
		err = sw.sendNamed("response.in_progress", responseLifecycleEvent{"response.in_progress", sw.seq, open})
	}
	if err == nil {
		err = sw.sendNamed("response.output_item.added",
			responseItemEvent{"response.output_item.added", sw.seq, 0, c.outputMessage("in_progress", nil)})
	}
	if err == nil {
		err = sw.sendNamed("response.content_part.added",
			responsePartEvent{"response.content_part.added", sw.seq, c.itemID(), 0, 0, c.outputText("")})
	}
	return err
}

func (c *completion) responsesContent(sw *sseWriter, text string) error {
	return sw.sendNamed("response.output_text.delta",
		responseDeltaEvent{"response.output_text.delta", sw.seq, c.itemID(), 0, 0, text, []struct{}{}})
}

func (c *completion) responsesDone(seq int, text string) responseTextDoneEvent {
	return responseTextDoneEvent{"response.output_text.done", seq, c.itemID(), 0, 0, text, []struct{}{}}
}

func (c *completion) responsesMalformed(sw *sseWriter) error {
	b, _ := json.Marshal(c.responsesDone(sw.seq, ""))
	return sw.named("response.output_text.done", b[:len(b)/2])
}

func (c *completion) responsesClose(sw *sseWriter) error {
	text := c.words().next(c.outputTokens)
	part := c.outputText(text)
	err := sw.sendNamed("response.output_text.done", c.responsesDone(sw.seq, text))
	if err == nil {
		err = sw.sendNamed("response.content_part.done",
			responsePartEvent{"response.content_part.done", sw.seq, c.itemID(), 0, 0, part})
	}
	if err == nil {
		err = sw.sendNamed("response.output_item.done",
			responseItemEvent{"response.output_item.done", sw.seq, 0, c.outputMessage("completed", []outputText{part})})
	}
	if err == nil {
		err = sw.sendNamed("response.completed",
			responseLifecycleEvent{"response.completed", sw.seq, c.response("completed", text)})
	}
	return err
}
