package loadgen

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const (
	roleChunk  = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	tokenChunk = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n"
	usageChunk = `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}` + "\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

func readBody(body string) Sample {
	s := Sample{Start: time.Now(), InputTokens: 3}
	if err := newStreamReader().read(&s, strings.NewReader(body)); err != nil {
		s.fail("read", err.Error())
	}
	return s
}

// TestReadStream covers stream shapes the mock never produces.
func TestReadStream(t *testing.T) {
	long := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("y", 40<<10) + `"}}]}` + "\n\n"
	for _, tc := range []struct {
		name, body    string
		tokens, input int
		source        TokenSource
		err           string
	}{
		{"no usage counts content events", roleChunk + tokenChunk + tokenChunk + tokenChunk + doneEvent, 3, 3, TokensEvents, ""},
		{"usage wins", roleChunk + tokenChunk + usageChunk + doneEvent, 7, 12, TokensUsage, ""},
		{"crlf and comments", ": ping\r\n" + strings.ReplaceAll(tokenChunk, "\n", "\r\n") + "data: [DONE]\r\n\r\n", 1, 3, TokensEvents, ""},
		{"no space after data:", "data:" + tokenChunk[len("data: "):] + "data:[DONE]\n\n", 1, 3, TokensEvents, ""},
		{"multi-line data", "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n" + doneEvent, 1, 3, TokensEvents, ""},
		{"reasoning counts", `data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}` + "\n\n" + doneEvent, 1, 3, TokensEvents, ""},
		{"tool call counts", `data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}` + "\n\n" + doneEvent, 1, 3, TokensEvents, ""},
		{"line longer than the buffer", long + doneEvent, 1, 3, TokensEvents, ""},
		{"last event without blank line", tokenChunk + "data: [DONE]", 1, 3, TokensEvents, ""},
		{"truncated", roleChunk + tokenChunk, 1, 3, TokensEvents, "stream ended without data: [DONE]"},
		{"role only", roleChunk + doneEvent, 0, 3, TokensEvents, "stream carried no content"},
		{"error event", tokenChunk + `data: {"error":{"message":"overloaded"}}` + "\n\n", 1, 3, TokensEvents, "error event in stream: overloaded"},
		{"malformed", "data: {nope\n\n", 0, 3, TokensEvents, "malformed stream event: {nope"},
		{"not an object", "data: [1,2]\n\n", 0, 3, TokensEvents, "malformed stream event: [1,2]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := readBody(tc.body)
			if s.Err != tc.err || s.OutputTokens != tc.tokens || s.InputTokens != tc.input || s.TokenSource != tc.source {
				t.Errorf("got err %q, %d tokens (%s), %d input; want err %q, %d (%s), %d",
					s.Err, s.OutputTokens, s.TokenSource, s.InputTokens, tc.err, tc.tokens, tc.source, tc.input)
			}
			if s.Err == "" && (s.E2E < s.TTFT || s.Gaps != max(tc.tokens-1, 0) && tc.source == TokensEvents) {
				t.Errorf("ttft %s, e2e %s, %d gaps", s.TTFT, s.E2E, s.Gaps)
			}
			if s.Err != "" && s.Class != ClassStream {
				t.Errorf("class %q, want stream", s.Class)
			}
		})
	}
}

func TestReadStreamGaps(t *testing.T) {
	s := readBody(tokenChunk + tokenChunk + tokenChunk + doneEvent)
	if s.Gaps != 2 || s.MaxGap > s.GapSum || s.GapSum > s.E2E {
		t.Errorf("gaps %d, sum %s, max %s, e2e %s", s.Gaps, s.GapSum, s.MaxGap, s.E2E)
	}
	if d, ok := s.MeanGap(); !ok || d != s.GapSum/2 {
		t.Errorf("mean gap %s, %v", d, ok)
	}
}

// FuzzReadStream feeds arbitrary bodies to the stream reader: it must not
// panic, and what it reports must be self-consistent.
func FuzzReadStream(f *testing.F) {
	f.Add(roleChunk + tokenChunk + usageChunk + doneEvent)
	f.Add(tokenChunk + "data: [DONE]")
	f.Add("data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n")
	f.Add(": c\r\n\r\ndata: {\"error\":null}\n\ndata: {}\n\n")
	f.Add("data: {\"usage\":{\"completion_tokens\":-3}}\n\ndata: [DONE]\n\n")
	f.Fuzz(func(t *testing.T, body string) {
		s := readBody(body)
		if s.Gaps < 0 || s.MaxGap < 0 || s.MaxGap > s.GapSum || s.E2E < 0 {
			t.Fatalf("inconsistent sample %+v", s)
		}
		if s.OK() && (s.TTFT > s.E2E || s.TokenSource == 0) {
			t.Fatalf("successful sample with ttft %s > e2e %s or no token source", s.TTFT, s.E2E)
		}
		if s.OK() != (s.Class == "") {
			t.Fatalf("error %q with class %q", s.Err, s.Class)
		}
	})
}

// BenchmarkReadStreamPerEvent is the generator's cost per streamed token:
// line splitting, the event's JSON inspection and its timestamp. The
// reported ns/event is what the client adds to every ITL it measures.
func BenchmarkReadStreamPerEvent(b *testing.B) {
	const events = 1000
	var body bytes.Buffer
	body.WriteString(roleChunk)
	for range events {
		body.WriteString(tokenChunk)
	}
	body.WriteString(usageChunk + doneEvent)
	raw := body.Bytes()
	sr := newStreamReader()
	r := bytes.NewReader(raw)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(raw)
		s := Sample{Start: time.Now()}
		if err := sr.read(&s, r); err != nil || !s.OK() {
			b.Fatal(err, s.Err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/events, "ns/event")
}

// BenchmarkInspect is the JSON part of the per-event cost alone.
func BenchmarkInspect(b *testing.B) {
	data := []byte(tokenChunk[len("data: ") : len(tokenChunk)-2])
	b.ReportAllocs()
	for b.Loop() {
		if ev, ok := inspect(data); !ok || !ev.content {
			b.Fatal("not content")
		}
	}
}
