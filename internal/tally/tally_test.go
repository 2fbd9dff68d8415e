package tally

import (
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

// A stream's cached prompt tokens are read in each API's names, and
// Anthropic's, reported with the input ahead of the output, are kept when
// the output's count comes alone.
func TestStreamReadsCachedTokens(t *testing.T) {
	for _, tc := range []struct {
		name          string
		api           openai.API
		stream        string
		prompt        int
		cached, write int
	}{
		{"chat", openai.APIChat,
			"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1500,\"completion_tokens\":1,\"total_tokens\":1501,\"prompt_tokens_details\":{\"cached_tokens\":1280}}}\n\n" +
				"data: [DONE]\n\n", 1500, 1280, 0},
		{"responses", openai.APIResponses,
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":60,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":1}}}\n\n",
			60, 40, 0},
		{"messages, output alone at the end", openai.APIMessages,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 125, 100, 20},
		{"messages, the whole usage at the end", openai.APIMessages,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":1,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":9}}\n\n", 105, 100, 0},
	} {
		r := Response{API: tc.api, SSE: true, MaxGaps: 8}
		r.Parser.MaxLine = 1 << 16
		r.Body([]byte(tc.stream), time.Unix(1, 0))
		r.End(time.Unix(2, 0))
		if u := r.Usage; u == nil || u.PromptTokens != tc.prompt || u.CachedTokens != tc.cached || u.CacheWriteTokens != tc.write {
			t.Errorf("%s: usage %+v, want prompt %d, cached %d, written %d", tc.name, u, tc.prompt, tc.cached, tc.write)
		}
	}
}
