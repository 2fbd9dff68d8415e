package mock

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Wire types. Structs (not maps) keep the field order fixed, which the
// byte-for-byte comparisons in end-to-end tests rely on.

// OpenAI error types used by the mock.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

const finishLength = "length"

// envelope is the top level shared by every chunk and full response.
type envelope struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
	// vLLM writes these after usage (see completion.promptLogprobs).
	PromptLogprobs any `json:"prompt_logprobs,omitempty"`
}

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *promptDetail `json:"prompt_tokens_details,omitempty"`
}

type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	FinishReason *string   `json:"finish_reason"`
}

// chatDelta uses a pointer for content so the role chunk can carry an
// explicit "content":"" while the finish chunk's delta is an empty object.
type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	FinishReason string      `json:"finish_reason"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// textChoice serves both streaming and full legacy completions, which share
// one shape; logprobs is always null as the mock never computes them.
type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

func (c *completion) envelope(object string, choices any) envelope {
	return envelope{ID: c.id, Object: object, Created: c.created, Model: c.model, Choices: choices}
}

func (c *completion) usage() *usage {
	u := &usage{
		PromptTokens:     c.promptTokens,
		CompletionTokens: c.outputTokens * c.choices,
		TotalTokens:      c.promptTokens + c.outputTokens*c.choices,
	}
	if c.cachedTokens > 0 {
		u.PromptTokensDetails = &promptDetail{CachedTokens: c.cachedTokens}
	}
	return u
}

// roleChunk is the chat stream's opening chunk; it carries no token.
func (c *completion) roleChunk() envelope {
	empty := ""
	return c.envelope("chat.completion.chunk", []chatChunkChoice{{
		Delta: chatDelta{Role: "assistant", Content: &empty},
	}})
}

// contentChunk is choice i's content event.
func (c *completion) contentChunk(i int, text string) envelope {
	if c.kind == kindChat {
		return c.envelope("chat.completion.chunk", []chatChunkChoice{{Index: i, Delta: chatDelta{Content: &text}}})
	}
	return c.envelope("text_completion", []textChoice{{Index: i, Text: text}})
}

func (c *completion) finishChunk(i int) envelope {
	reason := finishLength
	if c.kind == kindChat {
		return c.envelope("chat.completion.chunk", []chatChunkChoice{{Index: i, FinishReason: &reason}})
	}
	return c.envelope("text_completion", []textChoice{{Index: i, FinishReason: &reason}})
}

// usageChunk follows vLLM: usage rides on an extra chunk with no choices
// instead of a "usage":null on every chunk.
func (c *completion) usageChunk() envelope {
	object := "text_completion"
	if c.kind == kindChat {
		object = "chat.completion.chunk"
	}
	e := c.envelope(object, []struct{}{})
	e.Usage = c.usage()
	return e
}

// fullResponse is the non-streaming body; its content is exactly the
// concatenation of the streamed content events.
func (c *completion) fullResponse() any {
	text := c.words().next(c.outputTokens)
	var e envelope
	switch c.kind {
	case kindResponses:
		return c.response("completed", text)
	case kindMessages:
		return c.message(text, true)
	case kindChat:
		choices := make([]chatChoice, c.choices)
		for i := range choices {
			choices[i] = chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: text}, FinishReason: finishLength}
		}
		e = c.envelope("chat.completion", choices)
	default:
		reason := finishLength
		choices := make([]textChoice, c.choices)
		for i := range choices {
			choices[i] = textChoice{Index: i, Text: text, FinishReason: &reason}
		}
		e = c.envelope("text_completion", choices)
	}
	e.Usage = c.usage()
	e.PromptLogprobs = c.promptLogprobs()
	return e
}

// streamOpen writes what a stream sends before its first token.
func (c *completion) streamOpen(sw *sseWriter) error {
	switch c.kind {
	case kindChat:
		// Chat streams open with a role-only chunk, as OpenAI and vLLM do.
		return sw.send(c.roleChunk())
	case kindResponses:
		return c.responsesOpen(sw)
	case kindMessages:
		return c.messagesOpen(sw)
	}
	// Legacy completions open with content: flush the headers alone so
	// the client still sees the response start at t0.
	return sw.flush()
}

// streamContent writes one content event carrying text.
func (c *completion) streamContent(sw *sseWriter, text string) error {
	switch c.kind {
	case kindResponses:
		return c.responsesContent(sw, text)
	case kindMessages:
		return c.messagesContent(sw, text)
	}
	// n choices: one event per choice, as vLLM streams them.
	for i := range c.choices {
		if err := sw.send(c.contentChunk(i, text)); err != nil {
			return err
		}
	}
	return nil
}

// streamMalformed writes the malformed fault's event: half of a valid one,
// framed as an event, unparseable as JSON.
func (c *completion) streamMalformed(sw *sseWriter) error {
	switch c.kind {
	case kindResponses:
		return c.responsesMalformed(sw)
	case kindMessages:
		return c.messagesMalformed(sw)
	}
	b, _ := json.Marshal(c.finishChunk(0))
	return sw.event(b[:len(b)/2])
}

// streamClose writes what follows the last token.
func (c *completion) streamClose(sw *sseWriter) error {
	switch c.kind {
	case kindResponses:
		return c.responsesClose(sw)
	case kindMessages:
		return c.messagesClose(sw)
	}
	var err error
	for i := 0; i < c.choices && err == nil; i++ {
		err = sw.send(c.finishChunk(i))
	}
	if err == nil && c.includeUsage {
		err = sw.send(c.usageChunk())
		if err == nil && c.lockstep != nil && c.usageUnseen {
			// A gateway removes the usage the client did not ask for:
			// the client will never acknowledge it, so [DONE] follows
			// without waiting (every event before it was in lock step).
			c.lockstep.Ack(sw.seq - 1)
		}
	}
	if err == nil {
		err = sw.event([]byte("[DONE]"))
	}
	return err
}

// writeJSON writes v with an explicit Content-Length and returns status, so
// callers can record the code they sent in one expression.
func writeJSON(w http.ResponseWriter, status int, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		// Unreachable with the wire types above; fail loudly but validly.
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"mock: encoding response","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return status
}

func writeError(w http.ResponseWriter, status int, typ, code, message string) int {
	return writeJSON(w, status, apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
}
