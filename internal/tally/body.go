package tally

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/openai"
)

// A non-streamed response is read for its model, whether it carries
// content, and its usage, without being held: the meter keeps its first
// and last jsonKeep bytes. A response that fits is parsed whole; a larger
// one (logprobs with top_logprobs: 20 run to megabytes) is read from its
// ends: the model from the head, the usage from the tail, where OpenAI and
// vLLM put it. Either way a response costs the meter at most 2 × jsonKeep.
const jsonKeep = 64 << 10

// jsonBody is the kept part of a non-streamed response body.
type jsonBody struct {
	head  []byte // the first jsonKeep bytes
	tail  []byte // the last jsonKeep bytes once past head (a sliding window)
	total int
}

func (j *jsonBody) write(p []byte) {
	j.total += len(p)
	if room := jsonKeep - len(j.head); room > 0 {
		n := min(room, len(p))
		j.head = append(j.head, p[:n]...)
		p = p[n:]
	}
	if len(p) == 0 {
		return
	}
	if len(p) >= jsonKeep {
		j.tail = append(j.tail[:0], p[len(p)-jsonKeep:]...)
		return
	}
	if over := len(j.tail) + len(p) - jsonKeep; over > 0 {
		j.tail = append(j.tail[:0], j.tail[over:]...)
	}
	j.tail = append(j.tail, p...)
}

// read returns what the response says, read as *api's (named from the
// response's start when *api is empty): its usage (nil when absent or
// unreadable), its model, and whether it carries content.
func (j *jsonBody) read(api *openai.API) (usage *openai.Usage, model string, content bool) {
	if j.total == 0 {
		return nil, "", false
	}
	if *api == "" {
		*api = openai.BodyAPI(j.head)
	}
	if j.total == len(j.head)+len(j.tail) && len(j.tail) == 0 {
		c, err := openai.ParseBody(*api, j.head)
		if err != nil {
			return nil, "", false
		}
		return c.Usage, openai.ChunkModel(j.head), c.Content
	}
	// Too large to keep: the model is near the start, the usage at the end,
	// and a response this long carries content, unless it is a batch of
	// embeddings.
	model = gjson.GetBytes(j.head, "model").String()
	if model == "" { // after the data, as embeddings put it
		model = modelFromTail(j.tail)
	}
	return usageFromTail(*api, j.tail), model, *api == "" || api.Generates()
}

// modelFromTail finds the last top-level "model" in the tail, as
// usageFromTail finds the usage.
func modelFromTail(tail []byte) string {
	for end, tries := len(tail), 0; tries < 8; tries++ {
		i := bytes.LastIndex(tail[:end], []byte(`"model"`))
		if i < 0 {
			return ""
		}
		end = i
		if i > 0 && tail[i-1] == '\\' {
			continue
		}
		obj := append([]byte{'{'}, bytes.TrimRight(tail[i:], " \t\r\n")...)
		if gjson.ValidBytes(obj) {
			if m := gjson.GetBytes(obj, "model"); m.Type == gjson.String {
				return m.Str
			}
		}
	}
	return ""
}

// usageFromTail finds the last top-level "usage" key in the tail of a JSON
// object and reads its value: from that key to the end, the tail is the
// rest of the top-level object, so "{" + it is a JSON object of its own.
// (In JSON text a quote inside a string is escaped, so an unescaped
// "usage" is a key; one nested deeper leaves brackets unbalanced and is
// passed over.)
func usageFromTail(api openai.API, tail []byte) *openai.Usage {
	// A few tries: a pool cannot make the meter parse its tail many times.
	for end, tries := len(tail), 0; tries < 8; tries++ {
		i := bytes.LastIndex(tail[:end], []byte(`"usage"`))
		if i < 0 {
			return nil
		}
		end = i
		if i > 0 && tail[i-1] == '\\' {
			continue
		}
		rest := bytes.TrimRight(tail[i:], " \t\r\n")
		obj := make([]byte, 0, len(rest)+1)
		obj = append(append(obj, '{'), rest...)
		if c, err := openai.ParseBody(api, obj); err == nil && c.Usage != nil {
			return c.Usage
		}
	}
	return nil
}
