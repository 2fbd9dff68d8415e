package sse

import (
	"bytes"
	"encoding/json"
)

// MaxUsageEvent bounds the usage-only line a UsageStripper recognises, and
// so what it holds: a line not ended within this many bytes is not the usage
// event (a real one is a few hundred bytes) and is passed on as it arrives.
const MaxUsageEvent = 8 << 10

// UsageStripper removes, from a chat or text completions SSE stream, the
// usage-only event a gateway asked for on the client's behalf (it set
// stream_options.include_usage on a request that did not): an event of one
// data line, a JSON object whose "choices" is [] and whose "usage" is an
// object, and its blank line. Everything else passes byte for byte, in
// order: a client that never asked for usage sees the stream it would have
// had without asking. Use one per response; the zero value is ready.
//
// What it holds back, and how long: the incomplete trailing line of a
// chunk while it may still be the usage event (a "data:" line that starts
// an event and is not longer than MaxUsageEvent) or a blank line ("\r"),
// until its '\n' arrives; and a complete usage line until the next line
// shows whether the event ends there (a blank line: both dropped; anything
// else: both passed). Every other byte leaves in the call that brought it,
// and a stream with no usage event leaves exactly as it came.
//
// Lines end in '\n' ("\r\n" included); a bare '\r' line end (allowed by
// SSE, sent by no pool) is not split on, so such a stream passes unchanged.
type UsageStripper struct {
	held     []byte // the line so far, while it may be blank or the usage event
	usage    []byte // a complete usage line, until the next line shows its event ends there
	passing  bool   // inside a line that is neither, passed as it arrives
	midEvent bool   // the last line passed was not blank: the next one continues an event
	out      []byte
}

// Strip returns what of chunk to forward now. When that is chunk whole it
// returns chunk itself and changed false (the caller forwards its own
// buffer untouched); otherwise a slice of the stripper's buffer, valid
// until the next call. The common chunk (no "usage" key in it) costs one
// scan and no copy.
func (s *UsageStripper) Strip(chunk []byte) (out []byte, changed bool) {
	if s.plain(chunk) {
		return chunk, false
	}
	s.out = s.out[:0]
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 && s.passing {
			s.out = append(s.out, chunk...)
			break
		}
		if i < 0 {
			s.partial(chunk)
			break
		}
		line := chunk[:i+1]
		chunk = chunk[i+1:]
		switch {
		case s.passing:
			s.out = append(s.out, line...)
			s.passing, s.midEvent = false, true
		case len(s.held) > 0:
			s.held = append(s.held, line...)
			s.line(s.held)
		default:
			s.line(line)
		}
	}
	return s.out, true
}

// End returns what is still held when the stream ends: a last line without
// its '\n', passed on. A usage event the stream ended before its blank line
// is dropped (an SSE client discards an unterminated event anyway).
func (s *UsageStripper) End() []byte {
	b := s.held
	*s = UsageStripper{}
	return b
}

// line handles one complete line (with its '\n'); it may alias s.held.
func (s *UsageStripper) line(line []byte) {
	blank := isBlank(line)
	if len(s.usage) > 0 {
		if blank { // the usage event, whole: dropped
			s.usage, s.held, s.midEvent = s.usage[:0], s.held[:0], false
			return
		}
		s.out = append(s.out, s.usage...) // an event of more lines: not it
		s.usage, s.midEvent = s.usage[:0], true
	}
	if !s.midEvent && isUsageLine(line) {
		s.usage, s.held = append(s.usage, line...), s.held[:0]
		return
	}
	s.out = append(s.out, line...)
	s.held, s.midEvent = s.held[:0], !blank
}

// partial handles the start of a line whose '\n' has not arrived: held
// while it may be blank or the usage event, else passed with what was held.
func (s *UsageStripper) partial(p []byte) {
	s.held = append(s.held, p...)
	if len(s.held) == 1 && s.held[0] == '\r' ||
		len(s.usage) == 0 && !s.midEvent && len(s.held) <= MaxUsageEvent && dataPrefix(s.held) {
		return
	}
	if len(s.usage) > 0 { // a line after it that is not blank: not it
		s.out = append(s.out, s.usage...)
		s.usage, s.midEvent = s.usage[:0], true
	}
	s.out = append(s.out, s.held...)
	s.held, s.passing = s.held[:0], true
}

// plain reports, without copying, that chunk passes whole: nothing is held,
// it ends a line and holds no usage event.
func (s *UsageStripper) plain(chunk []byte) bool {
	if len(s.held) > 0 || len(s.usage) > 0 || s.passing || len(chunk) == 0 || chunk[len(chunk)-1] != '\n' {
		return false
	}
	if !bytes.Contains(chunk, usageKey) { // the common chunk: one scan
		s.midEvent = !isBlank(chunk[bytes.LastIndexByte(chunk[:len(chunk)-1], '\n')+1:])
		return true
	}
	mid := s.midEvent
	for rest := chunk; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		line := rest[:i+1]
		rest = rest[i+1:]
		if !mid && isUsageLine(line) {
			return false
		}
		mid = !isBlank(line)
	}
	s.midEvent = mid
	return true
}

var (
	dataField  = []byte("data:")
	usageKey   = []byte(`"usage"`)
	choicesKey = []byte(`"choices"`)
)

// keyThen reports that some occurrence of key in b is followed by a colon
// and then the bytes of want, JSON whitespace allowed around each.
func keyThen(b, key []byte, want string) bool {
	for {
		i := bytes.Index(b, key)
		if i < 0 {
			return false
		}
		b = b[i+len(key):]
		rest := skipSpace(b)
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = rest[1:]
		ok := true
		for j := range len(want) {
			rest = skipSpace(rest)
			if len(rest) == 0 || rest[0] != want[j] {
				ok = false
				break
			}
			rest = rest[1:]
		}
		if ok {
			return true
		}
	}
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}

// dataPrefix reports that a line starting with b may be a data line.
func dataPrefix(b []byte) bool {
	n := min(len(b), len(dataField))
	return bytes.Equal(b[:n], dataField[:n])
}

func isBlank(line []byte) bool {
	return len(line) == 1 || len(line) == 2 && line[0] == '\r'
}

// isUsageLine reports that line is "data:" and a JSON object whose "choices"
// is an empty array and whose "usage" is an object: the usage-only chunk
// include_usage adds. A content chunk (with "usage": null, or a running
// usage as vLLM's continuous stats send) is not. The key test comes first:
// only a line naming "usage" is decoded (a string's quote is escaped, so
// the bytes "usage" with their quotes are a key), and only when a key
// "usage" opens an object and a key "choices" an empty array.
func isUsageLine(line []byte) bool {
	if len(line) > MaxUsageEvent || !bytes.HasPrefix(line, dataField) ||
		!keyThen(line, usageKey, "{") || !keyThen(line, choicesKey, "[]") {
		return false
	}
	payload := bytes.TrimSpace(line[len(dataField):])
	if len(payload) == 0 || payload[0] != '{' {
		return false
	}
	var v struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if json.Unmarshal(payload, &v) != nil {
		return false
	}
	return v.Choices != nil && len(*v.Choices) == 0 && len(v.Usage) > 0 && v.Usage[0] == '{'
}
