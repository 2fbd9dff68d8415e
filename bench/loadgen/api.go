package loadgen

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// API is the inference API a run speaks: it decides the path, the request
// body and how the response is read (see inspect for streams).
type API string

// APIs; the zero value is APIChat.
const (
	APIChat        API = "chat"        // OpenAI /v1/chat/completions
	APICompletions API = "completions" // OpenAI /v1/completions
	APIResponses   API = "responses"   // OpenAI /v1/responses
	APIMessages    API = "messages"    // Anthropic /v1/messages
	APIEmbeddings  API = "embeddings"  // OpenAI /v1/embeddings: no stream, no tokens out
)

// APIs lists the APIs in the order the help text gives them.
var APIs = []API{APIChat, APICompletions, APIResponses, APIMessages, APIEmbeddings}

// ParseAPI reads an --api value.
func ParseAPI(s string) (API, error) {
	for _, a := range APIs {
		if string(a) == s {
			return a, nil
		}
	}
	names := make([]string, len(APIs))
	for i, a := range APIs {
		names[i] = string(a)
	}
	return "", fmt.Errorf("unknown API %q (want %s)", s, strings.Join(names, ", "))
}

func (a API) orDefault() API {
	if a == "" {
		return APIChat
	}
	return a
}

// Path is the API's path, appended to each Target's URL.
func (a API) Path() string {
	switch a.orDefault() {
	case APICompletions:
		return "/v1/completions"
	case APIResponses:
		return "/v1/responses"
	case APIMessages:
		return "/v1/messages"
	case APIEmbeddings:
		return "/v1/embeddings"
	}
	return ChatPath
}

// streamEnd names the event that ends a complete stream of the API.
func (a API) streamEnd() string {
	switch a {
	case APIResponses:
		return "response.completed"
	case APIMessages:
		return "message_stop"
	}
	return "data: [DONE]"
}

// whole is what a non-streamed response of the API says: its output (the
// first text part; for embeddings, the first vector) and its usage.
func (a API) whole(b []byte) (output string, usage gjson.Result) {
	path := "choices.0.message.content"
	switch a {
	case APICompletions:
		path = "choices.0.text"
	case APIResponses:
		path = "output.0.content.0.text"
	case APIMessages:
		path = "content.0.text"
	case APIEmbeddings:
		path = "data.0.embedding"
	}
	r := gjson.GetManyBytes(b, path, "usage")
	return r[0].String(), r[1]
}

// usageTokens reads a usage object: OpenAI's chat and completions names,
// else the Responses and Anthropic ones.
func usageTokens(u gjson.Result) (input, output int) {
	if in := u.Get("prompt_tokens"); in.Exists() {
		return int(in.Int()), int(u.Get("completion_tokens").Int())
	}
	return int(u.Get("input_tokens").Int()), int(u.Get("output_tokens").Int())
}
