package openai

import "encoding/json"

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Chunk is what the meter needs from one streamed event (chat.completion.chunk
// or text_completion) or from a whole non-streamed response.
type Chunk struct {
	// Content is true when the event carries at least one output token:
	// non-empty delta content, reasoning, refusal or tool-call arguments, or
	// completion text. A role-only first chunk has no content.
	Content bool
	Usage   *Usage
	Model   string
}

type wireChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta *struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
			Refusal          string `json:"refusal"`
			ToolCalls        []struct {
				Function struct {
					Arguments string `json:"arguments"`
					Name      string `json:"name"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

// ParseChunk decodes one event's data. Errors mean the event is not JSON the
// meter understands; callers skip it without failing the stream.
func ParseChunk(data []byte) (Chunk, error) {
	var w wireChunk
	if err := json.Unmarshal(data, &w); err != nil {
		return Chunk{}, err
	}
	c := Chunk{Usage: w.Usage, Model: w.Model}
	for _, ch := range w.Choices {
		if ch.Text != "" || (ch.Message != nil && ch.Message.Content != "") {
			c.Content = true
		}
		if d := ch.Delta; d != nil {
			if d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" || d.Refusal != "" {
				c.Content = true
			}
			for _, tc := range d.ToolCalls {
				if tc.Function.Arguments != "" || tc.Function.Name != "" {
					c.Content = true
				}
			}
		}
	}
	return c, nil
}
