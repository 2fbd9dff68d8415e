package openai

import (
	"bytes"
	"errors"
	"strconv"
)

// MaxDepth is the deepest nesting of arrays and objects accepted in JSON
// from a client or a pool. gjson's validator recurses once per level with
// no limit of its own: a 1 MiB body of '[' is a million nested calls on a
// long-lived goroutine and, with a larger body limit, past Go's maximum
// stack, a fatal error rather than a panic. 64 is the default of .NET's
// System.Text.Json and Json.NET, and far more than a real request needs: a
// chat body nests about 5 levels, its tools' JSON schemas rarely 20.
const MaxDepth = 64

// ErrTooDeep is JSON that nests deeper than MaxDepth, refused before it is
// validated. The errors returned for it name what nested too deep and match
// ErrTooDeep with errors.Is.
var ErrTooDeep = errors.New("JSON nests deeper than " + strconv.Itoa(MaxDepth) + " levels")

var (
	errBodyTooDeep  error = &depthError{"request body", nil}
	errChunkTooDeep error = &depthError{"stream chunk", ErrBadChunk} // still a bad event to the meter
)

// depthError is ErrTooDeep naming what nested too deep; kind, when set, is
// the error the same input would otherwise get, so errors.Is matches both.
type depthError struct {
	what string
	kind error
}

func (e *depthError) Error() string {
	return e.what + " nests deeper than " + strconv.Itoa(MaxDepth) + " levels"
}

func (e *depthError) Is(target error) bool {
	return target == ErrTooDeep || (e.kind != nil && target == e.kind)
}

var openBracket, openBrace = []byte{'['}, []byte{'{'}

// depthOK reports whether no array or object in data nests deeper than
// MaxDepth. It does not validate: one pass, iterative, no allocation,
// counting brackets outside strings exactly as a JSON parser reads them for
// as long as the bytes are valid JSON; where they stop being valid, the
// validator stops too, so nothing after that point matters. That is also
// why it stops at a closing bracket without an opening one, or at a string
// without an end.
func depthOK(data []byte) bool {
	// Nesting deeper takes more opening brackets than most bodies have at
	// all, and counting them is vectorised: the scan below is for the rest.
	// Counted a block at a time, so a body full of them goes to the scan
	// (which stops at the first MaxDepth+1 levels) without being read whole.
	openers := 0
	for rest := data; len(rest) > 0 && openers <= MaxDepth; {
		block := rest[:min(len(rest), 4<<10)]
		rest = rest[len(block):]
		openers += bytes.Count(block, openBracket) + bytes.Count(block, openBrace)
	}
	if openers <= MaxDepth {
		return true
	}
	depth := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '[', '{':
			if depth++; depth > MaxDepth {
				return false
			}
		case ']', '}':
			if depth--; depth < 0 {
				return true
			}
		case '"':
			// Jump to the closing quote (IndexByte is vectorised: strings
			// are most of a chat body): the first one preceded by an even
			// run of backslashes. The run cannot reach past the opening
			// quote, so each byte is looked at a bounded number of times.
			for {
				j := bytes.IndexByte(data[i+1:], '"')
				if j < 0 {
					return true
				}
				i += 1 + j
				n := 0
				for data[i-1-n] == '\\' {
					n++
				}
				if n%2 == 0 {
					break
				}
			}
		}
	}
	return true
}
