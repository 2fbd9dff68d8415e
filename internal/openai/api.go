package openai

import "strings"

// API is the inference API a request speaks, named as the policy input's
// request.api names it. The gate picks it from the request path.
type API string

// The APIs the gate parses.
const (
	APIChat        API = "chat"         // POST /v1/chat/completions
	APICompletions API = "completions"  // POST /v1/completions
	APIEmbeddings  API = "embeddings"   // POST /v1/embeddings
	APIResponses   API = "responses"    // POST /v1/responses
	APIMessages    API = "messages"     // POST /v1/messages, Anthropic's format
	APICountTokens API = "count_tokens" // POST /v1/messages/count_tokens, Anthropic's format
)

// apiSuffixes map a path's last segments to its API, longest first so that
// /chat/completions is not read as /completions. Anthropic's keep their
// /v1: OpenAI's Assistants API has /v1/threads/{id}/messages.
var apiSuffixes = []struct {
	suffix string
	api    API
}{
	{"/v1/messages/count_tokens", APICountTokens},
	{"/chat/completions", APIChat},
	{"/completions", APICompletions},
	{"/embeddings", APIEmbeddings},
	{"/responses", APIResponses},
	{"/v1/messages", APIMessages},
}

// APIOf names the API a request path serves by its last segments, so that
// a path under a prefix (/openai/v1/chat/completions) is known too; "" for
// a path that names none.
func APIOf(path string) API {
	for _, s := range apiSuffixes {
		if strings.HasSuffix(path, s.suffix) {
			return s.api
		}
	}
	return ""
}

// Operation is the API's OpenTelemetry GenAI operation name
// (gen_ai.operation.name): the semantic conventions' well-known values,
// "chat" for the Responses and Anthropic Messages APIs as their own
// conventions use; count_tokens has no well-known value and keeps its own.
func (a API) Operation() string {
	switch a {
	case APIChat, APIResponses, APIMessages:
		return "chat"
	case APICompletions:
		return "text_completion"
	case APIEmbeddings:
		return "embeddings"
	case APICountTokens:
		return "count_tokens"
	}
	return ""
}

// Generates reports whether the API writes output tokens: what a request's
// output reservation (its max_tokens) is for.
func (a API) Generates() bool {
	switch a {
	case APIChat, APICompletions, APIResponses, APIMessages:
		return true
	}
	return false
}

// Anthropic reports whether the API is Anthropic's: its clients expect
// errors in Anthropic's shape (Error.AnthropicJSON).
func (a API) Anthropic() bool { return a == APIMessages || a == APICountTokens }

// Parse reads a request body of the API (ParseRequest for chat, text
// completions, and an API the gate does not know).
func Parse(api API, body []byte) (Request, error) {
	switch api {
	case APIEmbeddings:
		return ParseEmbeddings(body)
	case APIResponses:
		return ParseResponses(body)
	case APIMessages:
		return ParseMessages(body)
	case APICountTokens:
		return ParseCountTokens(body)
	}
	return ParseRequest(body)
}
