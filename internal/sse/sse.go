// Package sse splits a Server-Sent Events byte stream into events as chunks
// arrive, without re-scanning what it has already seen.
//
// It is on the per-chunk path of every streamed response the meter observes,
// so it keeps two buffers, the carry-over of a partial line and the data of
// the event being assembled, each bounded by MaxLine, and never allocates
// per byte: callbacks receive slices into the chunk (or those buffers) that
// are only valid during the call.
package sse

import "bytes"

// DefaultMaxLine bounds each of the parser's buffers: a line, or the data of
// an event, longer than this is dropped (and counted) rather than growing
// memory without limit.
const DefaultMaxLine = 1 << 20

// Parser turns chunks of an SSE stream into data payloads. The zero value is
// ready to use with DefaultMaxLine.
type Parser struct {
	// MaxLine is the longest line kept (across chunks or not), and the
	// most data one event may gather from its data lines (joined by '\n').
	// A longer line is dropped and counted in Dropped; an event whose data
	// would grow longer is dropped whole and counted in Overflowed. 0 means
	// DefaultMaxLine. The parser holds at most 3*MaxLine bytes (the event
	// name's buffer is the third).
	MaxLine int

	carry     []byte // the incomplete trailing line of the previous chunk
	skipping  bool   // inside an overlong line being discarded
	data      []byte // data lines of the event being assembled (multi-line data)
	name      []byte // the event being assembled's "event:" field
	dataLines int    // -1: the event was dropped (overflow), ignored up to its blank line
	// Dropped counts overlong lines that were discarded; the other lines of
	// their event are still delivered.
	Dropped int
	// Overflowed counts events discarded because their data lines together
	// exceeded MaxLine (a pool that never sends the blank line ending an
	// event). The parser resynchronises at the next blank line.
	Overflowed int
}

// Event is one dispatched SSE event's data and name. Done reports the
// OpenAI end-of-stream sentinel "[DONE]".
type Event struct {
	Data []byte
	// Name is the event's "event:" field (empty without one): the
	// Responses and Anthropic APIs name every event, chat names none.
	Name []byte
	Done bool
}

var doneSentinel = []byte("[DONE]")

// Feed parses chunk and calls emit for every event completed by it. Data
// passed to emit must not be retained.
func (p *Parser) Feed(chunk []byte, emit func(Event)) {
	limit := p.maxLine()
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			p.keep(chunk)
			return
		}
		line := chunk[:i]
		chunk = chunk[i+1:]
		if p.skipping {
			p.skipping = false
			p.carry = p.carry[:0]
			continue
		}
		if len(p.carry)+len(line) > limit {
			// Overlong, whether or not it was split across chunks: drop it
			// the same way keep does, so the result does not depend on
			// where the chunk boundaries fall.
			p.carry = p.carry[:0]
			p.Dropped++
			continue
		}
		if len(p.carry) > 0 {
			p.carry = p.appendBounded(p.carry, line)
			line = p.carry
		}
		p.line(line, emit)
		p.carry = p.carry[:0]
	}
}

// Flush dispatches an event left pending at the end of the stream (a server
// that closes without the final blank line).
func (p *Parser) Flush(emit func(Event)) {
	if len(p.carry) > 0 && !p.skipping {
		p.line(p.carry, emit)
	}
	p.carry = p.carry[:0]
	p.skipping = false
	p.line(nil, emit)
}

func (p *Parser) keep(partial []byte) {
	if p.skipping {
		return
	}
	if len(p.carry)+len(partial) > p.maxLine() {
		p.carry = p.carry[:0]
		p.skipping = true
		p.Dropped++
		return
	}
	p.carry = p.appendBounded(p.carry, partial)
}

func (p *Parser) maxLine() int {
	if p.MaxLine > 0 {
		return p.MaxLine
	}
	return DefaultMaxLine
}

// line handles one complete line (without its '\n'); a blank line dispatches.
func (p *Parser) line(line []byte, emit func(Event)) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) == 0 {
		p.dispatch(emit)
		return
	}
	if line[0] == ':' { // comment / keep-alive
		return
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
	case "event": // a line is no longer than MaxLine: neither is the name
		p.name = p.appendBounded(p.name[:0], value)
		return
	default: // id, retry: not needed by the meter
		return
	}
	switch {
	case p.dataLines < 0:
		return
	case p.dataLines > 0:
		// A first data line always fits (no line is longer than MaxLine);
		// a later one may take the event over it. Checked before
		// appending: the whole event is dropped, never delivered cut short.
		if len(p.data)+1+len(value) > p.maxLine() {
			p.data = p.data[:0]
			p.dataLines = -1
			p.Overflowed++
			return
		}
		p.data = p.appendBounded(p.data, newline)
	}
	p.data = p.appendBounded(p.data, value)
	p.dataLines++
}

var newline = []byte{'\n'}

// appendBounded appends src to dst without letting dst's capacity grow past
// MaxLine when the result fits in it (the callers check that it does): what
// the parser retains is bounded by MaxLine itself, not by append's growth
// policy.
func (p *Parser) appendBounded(dst, src []byte) []byte {
	if n := len(dst) + len(src); n > cap(dst) {
		grown := make([]byte, len(dst), max(min(2*cap(dst), p.maxLine()), n))
		copy(grown, dst)
		dst = grown
	}
	return append(dst, src...)
}

func (p *Parser) dispatch(emit func(Event)) {
	if p.dataLines <= 0 {
		p.dataLines = 0 // after an overflow: resynchronised, the next event starts clean
		p.name = p.name[:0]
		return
	}
	emit(Event{Data: p.data, Name: p.name, Done: bytes.Equal(p.data, doneSentinel)})
	p.data = p.data[:0]
	p.name = p.name[:0]
	p.dataLines = 0
}
