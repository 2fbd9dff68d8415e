// Package wasmmeter is the in-Envoy meter: the per-request recorder that
// cmd/infergate-meter-wasm runs inside Envoy's Wasm filter, and the summary
// it hands infergate once per request.
//
// The ext_proc meter gets one gRPC message per streamed chunk; this one
// counts the response where it passes (internal/tally, the ext_proc
// meter's own counting, for every API), and Envoy's gRPC access log
// carries one summary per request to infergate, which turns it into the
// same stamp and the same settlement (extproc's access-log service). It
// builds for the host and for wasip1: only the standard library,
// internal/tally and what it uses.
package wasmmeter

import (
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/openai"
)

// The summary, version 2: sixteen fields separated by '|'.
//
//	2|flags|start_us|ttft_us|e2e_us|content_events|prompt_tokens|completion_tokens|bad_events|dropped_lines|overflowed_events|itl_max_us|response_model|gaps_us|api|input_tokens
//
// flags is a decimal bit set (FlagComplete, FlagSSE, FlagUsage, FlagFirst,
// FlagInput, FlagOutputOnly); start_us is when the request left the
// gateway (the Wasm filter saw its headers, after the gate answered), Unix
// microseconds of Envoy's clock; ttft_us (meaningful with FlagFirst) and
// e2e_us are microseconds after it; the token counts are meaningful with
// FlagUsage, input_tokens with FlagInput; response_model has '%' and '|'
// escaped as %25 and %7C; gaps_us is the kept inter-token gaps in
// microseconds, comma-separated, in order; api is the API the module read
// the response as (empty: none known). Every number is a decimal integer
// within its bound; a summary longer than MaxSummary, of another version,
// with fewer fields or a value out of bounds is malformed as a whole.
// Fields after the last are ignored (a later writer of the same version
// may append some).
//
// Version 1, which Parse still reads (a module built before infergate was
// upgraded), is version 2's first fourteen fields with flags up to 15.
const (
	Version     = "2|"
	version1    = "1|"
	fields      = 16 // the version included
	fields1     = 14 // version 1's
	MaxSummary  = 256 << 10
	MaxGaps     = 16384 // as extproc's MaxTrackedGaps default
	MaxModel    = 256   // as the stamp's bound on names
	maxDuration = 24 * time.Hour
	maxCount    = 1 << 30 // as the stamp's bound on tokens

	FlagComplete = 1 // the response reached its end (else Envoy cut it)
	FlagSSE      = 2 // a text/event-stream response
	FlagUsage    = 4 // the response reported usage
	FlagFirst    = 8 // a content-bearing event (or a non-streamed body with content) was seen
	// FlagInput: the response reported its input ahead of the output
	// (Anthropic's message_start): input_tokens replaces the gate's estimate.
	FlagInput = 16
	// FlagOutputOnly: the usage counts the output alone, its input being
	// the gate's estimate (prompt_tokens is then 0).
	FlagOutputOnly = 32
)

// Summary is what the in-Envoy meter saw of one response.
type Summary struct {
	Start         time.Time // the request left the gateway (µs precision)
	Complete, SSE bool
	HasFirst      bool
	TTFT, E2E     time.Duration // after Start
	API           openai.API    // as the module read the response ("" none)
	ContentEvents int
	Usage         *openai.Usage // nil: none reported
	OutputOnly    bool          // Usage's input is the gate's estimate
	Input         int           // the input reported ahead of the output, with HasInput
	HasInput      bool
	// What the meter could not read: events that were not chunks, lines
	// and events over the parser's bound.
	BadEvents, Dropped, Overflowed int
	ITLMax                         time.Duration
	ResponseModel                  string
	Gaps                           []time.Duration // at most MaxGaps, in order
}

// Encode renders s in version 2, within MaxSummary: out-of-range values are
// clamped and the gaps cut to MaxGaps.
func (s *Summary) Encode() string {
	flags := 0
	for _, f := range [...]struct {
		on  bool
		bit int
	}{{s.Complete, FlagComplete}, {s.SSE, FlagSSE}, {s.Usage != nil, FlagUsage}, {s.HasFirst, FlagFirst},
		{s.HasInput, FlagInput}, {s.Usage != nil && s.OutputOnly, FlagOutputOnly}} {
		if f.on {
			flags |= f.bit
		}
	}
	var prompt, completion, input int
	if s.Usage != nil {
		prompt, completion = s.Usage.PromptTokens, s.Usage.CompletionTokens
	}
	if s.HasInput {
		input = s.Input
	}
	gaps := s.Gaps[:min(len(s.Gaps), MaxGaps)]
	b := make([]byte, 0, 128+len(s.ResponseModel)+8*len(gaps))
	b = append(b, Version...)
	b = strconv.AppendInt(b, int64(flags), 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, max(s.Start.UnixMicro(), 0), 10)
	for _, d := range [...]time.Duration{s.TTFT, s.E2E} {
		b = append(b, '|')
		b = appendMicros(b, d)
	}
	for _, n := range [...]int{s.ContentEvents, prompt, completion, s.BadEvents, s.Dropped, s.Overflowed} {
		b = append(b, '|')
		b = strconv.AppendInt(b, int64(min(max(n, 0), maxCount)), 10)
	}
	b = append(b, '|')
	b = appendMicros(b, s.ITLMax)
	b = append(b, '|')
	b = appendEscaped(b, truncate(s.ResponseModel, MaxModel))
	b = append(b, '|')
	for i, g := range gaps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendMicros(b, g)
	}
	b = append(b, '|')
	if s.API.Operation() != "" { // a known API's name needs no escaping
		b = append(b, s.API...)
	}
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(min(max(input, 0), maxCount)), 10)
	return string(b)
}

func appendMicros(b []byte, d time.Duration) []byte {
	return strconv.AppendInt(b, int64(min(max(d, 0), maxDuration)/time.Microsecond), 10)
}

// ErrMalformed is a summary that Parse refuses.
var ErrMalformed = errors.New("malformed meter summary")

// Parse decodes a summary, range-checking everything in it: it comes
// through Envoy from a Wasm module, and anything that reaches infergate's
// port may send one.
func Parse(s string) (Summary, error) {
	var out Summary
	n, maxFlags := fields-1, int64(63)
	switch {
	case len(s) > MaxSummary:
		return out, ErrMalformed
	case strings.HasPrefix(s, version1):
		n, maxFlags = fields1-1, 15
	case !strings.HasPrefix(s, Version):
		return out, ErrMalformed
	}
	var v [fields - 1]string
	rest := s[len(Version):]
	for i := range n {
		j := strings.IndexByte(rest, '|')
		if j < 0 {
			if i != n-1 {
				return out, ErrMalformed
			}
			v[i] = rest
			break
		}
		v[i], rest = rest[:j], rest[j+1:]
	}
	var bad bool
	num := func(s string, hi int64) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n > hi {
			bad = true
			return 0
		}
		return n
	}
	micros := func(s string) time.Duration {
		return time.Duration(num(s, int64(maxDuration/time.Microsecond))) * time.Microsecond
	}
	flags := num(v[0], maxFlags)
	start := num(v[1], 1<<53) // far past any clock; keeps UnixMicro in range
	out.TTFT, out.E2E = micros(v[2]), micros(v[3])
	out.ContentEvents = int(num(v[4], maxCount))
	prompt, completion := int(num(v[5], maxCount)), int(num(v[6], maxCount))
	out.BadEvents, out.Dropped, out.Overflowed = int(num(v[7], maxCount)), int(num(v[8], maxCount)), int(num(v[9], maxCount))
	out.ITLMax = micros(v[10])
	model := unescape(v[11])
	if len(model) > MaxModel || !utf8.ValidString(model) {
		return Summary{}, ErrMalformed
	}
	out.ResponseModel = model
	if g := v[12]; g != "" {
		if n := strings.Count(g, ",") + 1; n > MaxGaps {
			return Summary{}, ErrMalformed
		}
		out.Gaps = make([]time.Duration, 0, strings.Count(g, ",")+1)
		for p := range strings.SplitSeq(g, ",") {
			out.Gaps = append(out.Gaps, micros(p))
		}
	}
	if n == fields-1 {
		out.API = openai.API(v[13])
		if out.API != "" && out.API.Operation() == "" {
			return Summary{}, ErrMalformed
		}
		out.Input = int(num(v[14], maxCount))
	}
	if bad || start == 0 {
		return Summary{}, ErrMalformed
	}
	out.Start = time.UnixMicro(start)
	out.Complete, out.SSE = flags&FlagComplete != 0, flags&FlagSSE != 0
	out.HasFirst = flags&FlagFirst != 0
	if flags&FlagUsage != 0 {
		out.Usage = &openai.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
		out.OutputOnly = flags&FlagOutputOnly != 0
	}
	out.HasInput = flags&FlagInput != 0
	if !out.HasInput {
		out.Input = 0 // meaningless without the flag
	}
	return out, nil
}

// appendEscaped appends s with '%' and '|' escaped.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b = append(b, "%25"...)
		case '|':
			b = append(b, "%7C"...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// unescape undoes appendEscaped; any other '%' is kept as it is.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%25", "%", "%7C", "|").Replace(s)
}

// truncate cuts s to at most n bytes on a rune boundary, and to valid UTF-8.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// Property is the proxy-wasm property the module sets; Envoy keeps it as
// the filter state object FilterStateKey.
const (
	Property       = "infergate.meter"
	FilterStateKey = "wasm." + Property
)
