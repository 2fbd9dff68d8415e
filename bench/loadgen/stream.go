package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
)

// streamReader reads one server-sent-event stream. It runs once per token,
// so it reuses its buffers (pooled with the reader) and inspects each
// event's JSON in place instead of decoding it.
type streamReader struct {
	br   *bufio.Reader
	line []byte // holds lines longer than br's buffer
	data []byte // the pending event's data
	gaps []time.Duration
	raw  *Raw // what was read, for Config.Capture; nil when not capturing
}

// Raw is one response body as the client read it, for Config.Capture.
type Raw struct {
	Body []byte // every byte of the body (of a stream, up to its [DONE] event)
	// Lines are a stream's lines: Body[previous End:End], read at At
	// (lines that arrived in one read share about the same time).
	Lines []RawLine
}

// RawLine is where a streamed line ends in Raw.Body and when it was read.
type RawLine struct {
	End int
	At  time.Time
}

// capture makes the next request keep its raw body.
func (sr *streamReader) capture() {
	if sr.raw == nil {
		sr.raw = &Raw{}
	}
	sr.raw.Body, sr.raw.Lines = sr.raw.Body[:0], sr.raw.Lines[:0]
}

func newStreamReader() *streamReader {
	return &streamReader{br: bufio.NewReaderSize(nil, 16<<10), gaps: make([]time.Duration, 0, 256)}
}

// event is what the client needs from one chunk.
type event struct {
	content      bool // carries output: content, reasoning or a tool call
	usage        bool // carries the output tokens' count
	outputTokens int
	inputTokens  int
	done         bool   // ends the stream (Responses and Anthropic: no [DONE])
	errMsg       string // an error event
}

// inspect reads data (one event's payload) of an api stream without
// allocating except for an error event. ok is false when data is not a
// JSON object. This is the one place that knows which events of each API
// carry content, usage, the end or an error.
func inspect(api API, data []byte) (ev event, ok bool) {
	if len(data) == 0 || !gjson.ValidBytes(data) {
		return ev, false
	}
	// The unsafe view is only used during this call.
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(data), len(data)))
	if !doc.IsObject() {
		return ev, false
	}
	switch api {
	case APIResponses:
		return inspectResponses(doc), true
	case APIMessages:
		return inspectMessages(doc), true
	}
	doc.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "choices":
			ev.content = firstChoiceHasContent(v)
		case "usage":
			if v.IsObject() {
				ev.usage = true
				ev.outputTokens = int(v.Get("completion_tokens").Int())
				ev.inputTokens = int(v.Get("prompt_tokens").Int())
			}
		case "error":
			if v.Type != gjson.Null {
				ev.errMsg = errorMessage(v)
			}
		}
		return true
	})
	return ev, true
}

// inspectResponses reads a Responses API event: any "*.delta" event with
// a non-empty delta is output (text, refusal, reasoning, tool arguments);
// response.completed and response.incomplete end the stream with usage.
func inspectResponses(doc gjson.Result) (ev event) {
	typ := doc.Get("type").Str
	switch {
	case strings.HasSuffix(typ, ".delta"):
		d := doc.Get("delta")
		ev.content = d.Type == gjson.String && len(d.Raw) > 2
	case typ == "response.completed" || typ == "response.incomplete":
		ev.done = true
		if u := doc.Get("response.usage"); u.IsObject() {
			ev.usage = true
			ev.inputTokens, ev.outputTokens = usageTokens(u)
		}
	case typ == "response.failed":
		ev.errMsg = errorMessage(doc.Get("response.error"))
	case typ == "error":
		ev.errMsg = errorMessage(doc)
	}
	return ev
}

// inspectMessages reads an Anthropic event: content_block_delta carries
// output (text, thinking or tool input), message_start the input tokens,
// message_delta the output tokens so far, message_stop the end.
func inspectMessages(doc gjson.Result) (ev event) {
	switch doc.Get("type").Str {
	case "content_block_delta":
		doc.Get("delta").ForEach(func(field, v gjson.Result) bool {
			switch field.Str {
			case "text", "thinking", "partial_json":
				ev.content = v.Type == gjson.String && len(v.Raw) > 2 // not ""
			}
			return !ev.content
		})
	case "message_start":
		ev.inputTokens = int(doc.Get("message.usage.input_tokens").Int())
	case "message_delta":
		if u := doc.Get("usage"); u.IsObject() {
			ev.usage = true
			ev.inputTokens, ev.outputTokens = usageTokens(u)
		}
	case "message_stop":
		ev.done = true
	case "error":
		ev.errMsg = errorMessage(doc.Get("error"))
	}
	return ev
}

// errorMessage is an error object's message, else its JSON.
func errorMessage(v gjson.Result) string {
	if msg := v.Get("message").String(); msg != "" {
		return strings.Clone(msg)
	}
	return strings.Clone(v.Raw)
}

// firstChoiceHasContent reports whether choices[0] carries output: in its
// delta, non-empty content or reasoning, or a tool call; or a non-empty
// text (legacy completions). One pass, no lookups by path: this is most of
// the per-event cost.
func firstChoiceHasContent(choices gjson.Result) bool {
	content := false
	choices.ForEach(func(_, choice gjson.Result) bool {
		choice.ForEach(func(key, v gjson.Result) bool {
			switch key.Str {
			case "text":
				content = v.Type == gjson.String && len(v.Raw) > 2 // not ""
				return !content
			case "delta":
			default:
				return true
			}
			v.ForEach(func(field, v gjson.Result) bool {
				switch field.Str {
				case "content", "reasoning_content", "reasoning":
					content = v.Type == gjson.String && len(v.Raw) > 2 // not ""
				case "tool_calls":
					content = v.IsArray() && v.Get("0").Exists()
				}
				return !content
			})
			return false
		})
		return false // the first choice only
	})
	return content
}

// read parses the api stream from r into s, timing each event when the
// blank line that ends it arrives. Gaps between content events go to
// sr.gaps.
func (sr *streamReader) read(s *Sample, api API, r io.Reader) error {
	sr.br.Reset(r)
	sr.gaps = sr.gaps[:0]
	api = api.orDefault()
	openAI := api == APIChat || api == APICompletions
	var (
		pending, done bool
		last          time.Time
		events        int
		usage         bool // seen: output tokens from the server
		input, output int
		err           error
	)
	dispatch := func() bool { // reports whether to keep reading
		pending = false
		now := time.Now()
		if openAI && string(sr.data) == "[DONE]" {
			done = true
			s.E2E = now.Sub(s.Start)
			return false
		}
		ev, ok := inspect(api, sr.data)
		switch {
		case !ok:
			s.fail(ClassStream, "malformed stream event: "+truncate(string(sr.data), 200))
			return false
		case ev.errMsg != "":
			s.fail(ClassStream, "error event in stream: "+truncate(ev.errMsg, 200))
			return false
		}
		if ev.inputTokens > 0 {
			input = ev.inputTokens
		}
		if ev.usage {
			usage, output = true, ev.outputTokens
		}
		if ev.done {
			done = true
			s.E2E = now.Sub(s.Start)
			return false
		}
		if ev.content {
			if events == 0 {
				s.TTFT = now.Sub(s.Start)
			} else {
				gap := now.Sub(last)
				sr.gaps = append(sr.gaps, gap)
				s.GapSum += gap
				s.MaxGap = max(s.MaxGap, gap)
			}
			last = now
			events++
		}
		return true
	}

	for err == nil {
		var line []byte
		line, err = sr.readLine()
		if sr.raw != nil && len(line) > 0 {
			sr.raw.Body = append(sr.raw.Body, line...)
			sr.raw.Lines = append(sr.raw.Lines, RawLine{End: len(sr.raw.Body), At: time.Now()})
		}
		l := bytes.TrimRight(line, "\r\n")
		switch {
		case len(l) == 0:
			if pending && !dispatch() {
				err = errStop
			}
		case bytes.HasPrefix(l, []byte("data:")):
			v := l[len("data:"):]
			if len(v) > 0 && v[0] == ' ' {
				v = v[1:]
			}
			if pending {
				sr.data = append(sr.data, '\n')
			} else {
				sr.data = sr.data[:0]
			}
			sr.data = append(sr.data, v...)
			pending = true
		}
		// Comments (":...") and other fields (event, id, retry) are ignored.
	}
	if pending && errors.Is(err, io.EOF) && s.Err == "" {
		dispatch() // a last event without its blank line
	}
	if done {
		// Drain the little that follows the end so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(sr.br, maxErrorBody))
	} else if s.E2E == 0 {
		s.E2E = time.Since(s.Start)
	}

	s.Gaps = len(sr.gaps)
	s.OutputTokens, s.TokenSource = events, TokensEvents
	if usage {
		s.OutputTokens, s.TokenSource = output, TokensUsage
	}
	if input > 0 {
		s.InputTokens = input
	}
	switch {
	case s.Err != "":
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errStop):
		return err // the caller classifies read errors
	case !done:
		s.fail(ClassStream, "stream ended without "+api.streamEnd())
	case events == 0:
		s.fail(ClassStream, "stream carried no content")
	}
	return nil
}

var errStop = errors.New("stop")

// readLine returns the next line including its newline; lines longer than
// the reader's buffer are assembled in sr.line. The result is valid until
// the next call.
func (sr *streamReader) readLine() ([]byte, error) {
	line, err := sr.br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, err
	}
	sr.line = append(sr.line[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = sr.br.ReadSlice('\n')
		sr.line = append(sr.line, line...)
	}
	return sr.line, err
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
