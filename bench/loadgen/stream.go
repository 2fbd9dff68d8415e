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
	usage        bool
	outputTokens int
	inputTokens  int
	errMsg       string // an {"error":...} event
}

// inspect reads data (one event's payload) without allocating except for an
// error event. ok is false when data is not a JSON object.
func inspect(data []byte) (ev event, ok bool) {
	if len(data) == 0 || !gjson.ValidBytes(data) {
		return ev, false
	}
	// The unsafe view is only used during this call.
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(data), len(data)))
	if !doc.IsObject() {
		return ev, false
	}
	doc.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "choices":
			ev.content = firstDeltaHasContent(v)
		case "usage":
			if v.IsObject() {
				ev.usage = true
				ev.outputTokens = int(v.Get("completion_tokens").Int())
				ev.inputTokens = int(v.Get("prompt_tokens").Int())
			}
		case "error":
			if v.Type != gjson.Null {
				ev.errMsg = strings.Clone(v.Get("message").String())
				if ev.errMsg == "" {
					ev.errMsg = strings.Clone(v.Raw)
				}
			}
		}
		return true
	})
	return ev, true
}

// firstDeltaHasContent reports whether choices[0].delta carries output:
// non-empty content or reasoning, or a tool call. One pass, no lookups by
// path: this is most of the per-event cost.
func firstDeltaHasContent(choices gjson.Result) bool {
	content := false
	choices.ForEach(func(_, choice gjson.Result) bool {
		choice.ForEach(func(key, delta gjson.Result) bool {
			if key.Str != "delta" {
				return true
			}
			delta.ForEach(func(field, v gjson.Result) bool {
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

// read parses the stream from r into s, timing each event when the blank
// line that ends it arrives. Gaps between content events go to sr.gaps.
func (sr *streamReader) read(s *Sample, r io.Reader) error {
	sr.br.Reset(r)
	sr.gaps = sr.gaps[:0]
	var (
		pending, done bool
		last          time.Time
		events        int
		usage         event
		err           error
	)
	dispatch := func() bool { // reports whether to keep reading
		pending = false
		now := time.Now()
		if string(sr.data) == "[DONE]" {
			done = true
			s.E2E = now.Sub(s.Start)
			return false
		}
		ev, ok := inspect(sr.data)
		switch {
		case !ok:
			s.fail(ClassStream, "malformed stream event: "+truncate(string(sr.data), 200))
			return false
		case ev.errMsg != "":
			s.fail(ClassStream, "error event in stream: "+truncate(ev.errMsg, 200))
			return false
		case ev.usage:
			usage = ev
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
		// Drain the little that follows [DONE] so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(sr.br, maxErrorBody))
	} else if s.E2E == 0 {
		s.E2E = time.Since(s.Start)
	}

	s.Gaps = len(sr.gaps)
	s.OutputTokens, s.TokenSource = events, TokensEvents
	if usage.usage {
		s.OutputTokens, s.TokenSource = usage.outputTokens, TokensUsage
		if usage.inputTokens > 0 {
			s.InputTokens = usage.inputTokens
		}
	}
	switch {
	case s.Err != "":
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errStop):
		return err // the caller classifies read errors
	case !done:
		s.fail(ClassStream, "stream ended without data: [DONE]")
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
