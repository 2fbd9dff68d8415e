package extproc

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/tidwall/gjson"
)

// withMaxTokens returns body with its output held to n, the effective
// max_tokens the gate reserved: a max_tokens or max_completion_tokens above
// n (or null) is set to n, and with neither present max_tokens is added
// (every OpenAI-compatible server and both completion endpoints know it;
// max_completion_tokens is chat-only). Other bytes stay as the client sent
// them. body is an object the gate validated (openai.ParseRequest: each of
// these keys at most once, a positive integer or null).
func withMaxTokens(body []byte, n int) ([]byte, error) {
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
		if k.Str != "max_tokens" && k.Str != "max_completion_tokens" {
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
		out := make([]byte, 0, len(body)+len(`,"max_tokens":`)+len(num))
		out = append(out, body[:end]...)
		if !empty {
			out = append(out, ',')
		}
		out = append(out, `"max_tokens":`...)
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
