package gate

import (
	"bytes"
	"errors"
	"slices"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/openai"
)

// withMaxTokens returns body with its output held to n, the effective
// output cap the gate reserved: a value of one of keys (the API's output
// caps, see outputLimitKeys) above n (or null) is set to n, and with none
// of them present keys[0] is added. Other bytes stay as the client sent
// them. body is an object the gate validated (openai.Parse: each of these
// keys at most once, a positive integer or null).
func withMaxTokens(body []byte, n int, keys ...string) ([]byte, error) {
	doc := gjson.ParseBytes(body)
	if !doc.IsObject() {
		return nil, errors.New("request body is not a JSON object")
	}
	num := strconv.AppendInt(nil, int64(n), 10)
	var (
		spans [][2]int // values to replace, in order
		found bool
		empty = true
		err   error
	)
	doc.ForEach(func(k, v gjson.Result) bool {
		empty = false
		if !slices.Contains(keys, k.Str) {
			return true
		}
		found = true
		if v.Type == gjson.Null || v.Type == gjson.Number && v.Num > float64(n) {
			if v.Index <= 0 || v.Index+len(v.Raw) > len(body) {
				err = errors.New("cannot locate " + k.Str + " in the request body")
				return false
			}
			spans = append(spans, [2]int{v.Index, v.Index + len(v.Raw)})
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if !found {
		end := bytes.LastIndexByte(body, '}')
		out := make([]byte, 0, len(body)+len(keys[0])+4+len(num))
		out = append(out, body[:end]...)
		if !empty {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, keys[0]...)
		out = append(out, `":`...)
		out = append(out, num...)
		return append(out, body[end:]...), nil
	}
	out := make([]byte, 0, len(body)+2*len(num))
	last := 0
	for _, s := range spans {
		out = append(out, body[last:s[0]]...)
		out = append(out, num...)
		last = s[1]
	}
	return append(out, body[last:]...), nil
}

// outputLimitKeys are the body keys that cap an API's output, the first
// the one added when none is sent (see withMaxTokens); chatKey is the one
// added to a chat completion (Options.ChatOutputLimit).
func outputLimitKeys(api openai.API, chatKey string) []string {
	switch api {
	case openai.APIResponses: // other APIs' caps are refused there (internal/openai)
		return []string{"max_output_tokens"}
	case openai.APIMessages:
		return []string{"max_tokens"}
	case openai.APIChat:
		if chatKey == "max_completion_tokens" {
			return []string{"max_completion_tokens", "max_tokens"}
		}
	}
	// Every OpenAI-compatible server and both completion endpoints know
	// max_tokens; max_completion_tokens is chat-only (both are read, so
	// both are capped).
	return []string{"max_tokens", "max_completion_tokens"}
}
