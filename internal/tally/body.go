package tally

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/openai"
)

// A non-streamed response is read for its model, whether it carries
// content, and its usage, without being held. One pass over the chunks as
// they arrive follows the JSON's depth and string state across chunk
// boundaries and copies the top-level "usage" and "model" values wherever
// they are: vLLM writes prompt_logprobs and prompt_token_ids after the
// usage, megabytes of them, so neither end of the body is the place to
// look. The meter also keeps the body's first jsonKeep bytes: they name the
// API, and a response that fits is parsed whole for its content. A
// response costs the meter at most jsonKeep + maxUsageValue + maxModelValue
// bytes, whatever its size.
const (
	jsonKeep = 64 << 10
	// maxUsageValue bounds the usage value copied: a real one is a few
	// hundred bytes (with its details). A larger one is unreadable, and
	// the request keeps its reservation.
	maxUsageValue = 4 << 10
	// maxModelValue bounds the model name copied (as a JSON string).
	maxModelValue = 512
)

// jsonBody reads a non-streamed response body as it passes.
type jsonBody struct {
	head  []byte // the first jsonKeep bytes
	total int
	scan  topLevel
}

func (j *jsonBody) write(p []byte) {
	j.total += len(p)
	if room := jsonKeep - len(j.head); room > 0 {
		j.head = append(j.head, p[:min(room, len(p))]...)
	}
	j.scan.feed(p)
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
	s := &j.scan
	if s.model.done && !s.model.over {
		if m := gjson.ParseBytes(s.model.buf); m.Type == gjson.String {
			model = m.Str
		}
	}
	usage = s.usage.read(*api, s.escapedKey || s.bad)
	if j.total == len(j.head) {
		// Small enough to keep: parsed whole for its content (and refused
		// whole when it is not the API's shape).
		c, err := openai.ParseBody(*api, j.head)
		if err != nil {
			return nil, "", false
		}
		if *api == openai.APICountTokens { // a count is its whole body, not a usage key
			usage = c.Usage
		}
		return usage, model, c.Content
	}
	// Too large to keep: a response this long carries content, unless it
	// is a batch of embeddings.
	return usage, model, *api == "" || api.Generates()
}

// read is the usage a captured value states, read as api's; nil when the
// value is absent, cut, larger than its cap, or not the API's usage, or
// when doubt is true: a body that is not JSON, or a top-level key written
// with an escape (it might be "usage" too: the meter cannot tell which
// one the pool meant).
func (v *captured) read(api openai.API, doubt bool) *openai.Usage {
	if !v.done || v.over || doubt {
		return nil
	}
	// The value alone, as the API's body: {"usage": <value>}.
	var buf [maxUsageValue + 16]byte
	obj := append(append(append(buf[:0], `{"usage":`...), v.buf...), '}')
	c, err := openai.ParseBody(api, obj)
	if err != nil {
		return nil
	}
	return c.Usage
}

// captured is one top-level value copied as it passes, up to its cap.
type captured struct {
	buf  []byte
	cap  int
	done bool // the whole value was seen
	over bool // it was longer than cap: not copied whole
}

func (v *captured) reset() { v.buf, v.done, v.over = v.buf[:0], false, false }

func (v *captured) add(p []byte) {
	if v.over {
		return
	}
	if len(v.buf)+len(p) > v.cap {
		v.over, v.buf = true, v.buf[:0]
		return
	}
	v.buf = append(v.buf, p...)
}

// topLevel follows a JSON text a chunk at a time: its depth, whether it is
// in a string (and after a backslash), and at the top level of the outer
// object which key it is at; it copies the values of "usage" and "model".
// It checks no more of the grammar than it needs: a body that is not JSON
// gives no usage that encoding/json would not read, or none at all.
type topLevel struct {
	depth  int
	inStr  bool
	esc    bool
	state  keyState
	key    [8]byte // the top-level key being read, enough to tell usage and model
	keyLen int     // its length so far (past len(key): another key)
	keyEsc bool    // the key has an escape in it
	// escapedKey: some top-level key was written with an escape.
	escapedKey bool
	bad        bool      // not an object, or not JSON where it matters
	target     *captured // the value being copied, nil when none
	scalar     bool      // the value copied is a number, true, false or null
	usage      captured
	model      captured
}

type keyState uint8

const (
	beforeObject keyState = iota // nothing yet: the outer '{' is next
	wantKey                      // at depth 1, a key (or the end) is next
	inKey                        // in a top-level key
	wantColon                    // after a key
	wantValue                    // after its colon
	inValue                      // in a top-level value
	wantComma                    // after a top-level value
	afterObject                  // the outer object ended
)

// feed takes the next chunk. The loop is the per-chunk hot path: no
// allocation (a copied value grows once, to its cap at most), strings
// skipped a run at a time.
func (s *topLevel) feed(p []byte) {
	if s.bad {
		return
	}
	if s.usage.cap == 0 {
		s.usage.cap, s.model.cap = maxUsageValue, maxModelValue
	}
	start := 0 // where the value copied starts in p
	for i := 0; i < len(p); i++ {
		if s.inStr {
			if s.esc { // p[i] is escaped
				s.esc = false
				continue
			}
			i = s.skipString(p, i)
			if i == len(p) {
				break
			}
			if p[i] == '\\' {
				s.esc = true
				if s.state == inKey {
					s.keyEsc = true
				}
				continue
			}
			s.inStr = false // p[i] is the closing quote
			switch {
			case s.state == inKey:
				s.endKey()
			case s.state == inValue && s.depth == 1: // a top-level string
				s.endValue(p, start, i+1)
			}
			continue
		}
		if s.state == inValue && !s.scalar {
			// Inside a value: only quotes and brackets matter.
			for i < len(p) && !structural[p[i]] {
				i++
			}
			if i == len(p) {
				break
			}
		}
		c := p[i]
		switch c {
		case ' ', '\t', '\r', '\n':
			if s.scalar {
				s.endValue(p, start, i)
			}
			continue
		}
		switch s.state {
		case beforeObject:
			if c != '{' {
				s.bad = true
				return
			}
			s.depth, s.state = 1, wantKey
		case wantKey:
			if c != '"' {
				if c == '}' { // an empty object
					s.depth, s.state = 0, afterObject
					continue
				}
				s.bad = true
				return
			}
			s.inStr, s.state, s.keyLen, s.keyEsc = true, inKey, 0, false
		case wantColon:
			if c != ':' {
				s.bad = true
				return
			}
			s.state = wantValue
		case wantValue:
			s.state = inValue
			if s.target != nil {
				s.target.reset()
				start = i
			}
			switch c {
			case '{', '[':
				s.depth++
			case '"':
				s.inStr = true
			case '}', ']', ',', ':':
				s.bad = true
				return
			default:
				s.scalar = true
			}
		case inValue:
			switch c {
			case '{', '[':
				s.depth++
			case '"':
				s.inStr = true
			case ',':
				if s.scalar {
					s.endValue(p, start, i)
					s.state = wantKey
				}
			case '}', ']':
				if s.scalar { // the outer object ends after a scalar
					s.endValue(p, start, i)
					s.depth, s.state = 0, afterObject
					continue
				}
				if s.depth--; s.depth == 1 {
					s.endValue(p, start, i+1)
				}
			}
		case wantComma:
			switch c {
			case ',':
				s.state = wantKey
			case '}':
				s.depth, s.state = 0, afterObject
			default:
				s.bad = true
				return
			}
		case afterObject:
			s.bad = true // something after the outer object
			return
		}
	}
	if s.target != nil && s.state == inValue {
		s.target.add(p[start:])
	}
}

// structural marks the bytes that change a value's depth or string state.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// skipString returns the index of the next quote or backslash in p from
// i (len(p) if none), taking a top-level key's bytes on the way. Both
// searches are vectorised.
func (s *topLevel) skipString(p []byte, i int) int {
	end := len(p)
	if q := bytes.IndexByte(p[i:], '"'); q >= 0 {
		end = i + q
	}
	if b := bytes.IndexByte(p[i:end], '\\'); b >= 0 {
		end = i + b
	}
	if s.state == inKey {
		s.keyBytes(p[i:end])
	}
	return end
}

// keyBytes takes part of a top-level key.
func (s *topLevel) keyBytes(b []byte) {
	if n := copy(s.key[min(s.keyLen, len(s.key)):], b); n < len(b) {
		s.keyLen = len(s.key) + 1 // longer than any key read
		return
	}
	s.keyLen += len(b)
}

// endKey is a top-level key's closing quote: its value is copied when it
// is one of those read.
func (s *topLevel) endKey() {
	s.state, s.target = wantColon, nil
	if s.keyEsc {
		s.escapedKey = true
		return
	}
	switch string(s.key[:min(s.keyLen, len(s.key))]) {
	case "usage":
		if s.keyLen == 5 {
			s.target = &s.usage
		}
	case "model":
		if s.keyLen == 5 {
			s.target = &s.model
		}
	}
}

// endValue is the end of a top-level value, at p[:end]: what is left of a
// copied one is added, and it is complete. A scalar ends at the byte after
// it (whitespace, ',' or '}'), a string or a bracketed value at its last.
func (s *topLevel) endValue(p []byte, start, end int) {
	s.scalar, s.state = false, wantComma
	if s.target == nil {
		return
	}
	s.target.add(p[start:end])
	s.target.done = !s.target.over
	s.target = nil
}
