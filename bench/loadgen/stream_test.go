package loadgen

import (
	"bytes"
	"encoding/json"
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

func readBody(body string) Sample { return readAPIBody(APIChat, body) }

func readAPIBody(api API, body string) Sample {
	s := Sample{Start: time.Now(), InputTokens: 3}
	if err := newStreamReader().read(&s, api, strings.NewReader(body)); err != nil {
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

// TestReadStreamAPIs covers each API's events: which carry content, usage,
// the end and errors.
func TestReadStreamAPIs(t *testing.T) {
	sse := func(events ...string) string {
		var b strings.Builder
		for _, e := range events {
			name := gjsonType(e)
			if name != "" {
				b.WriteString("event: " + name + "\n")
			}
			b.WriteString("data: " + e + "\n\n")
		}
		return b.String()
	}
	const (
		textChunk   = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"word ","logprobs":null,"finish_reason":null}]}`
		textFinish  = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}`
		respCreated = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","output":[],"usage":null}}`
		respDelta   = `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"word ","logprobs":[]}`
		respEmpty   = `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"","logprobs":[]}`
		respReason  = `{"type":"response.reasoning_text.delta","sequence_number":1,"item_id":"rs_1","output_index":0,"content_index":0,"delta":"hm"}`
		respDone    = `{"type":"response.output_text.done","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"text":"word word ","logprobs":[]}`
		respEnd     = `{"type":"response.completed","sequence_number":4,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19}}}`
		respFailed  = `{"type":"response.failed","sequence_number":2,"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`
		msgStart    = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":12,"output_tokens":1}}}`
		msgBlock    = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
		msgPing     = `{"type":"ping"}`
		msgDelta    = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"word "}}`
		msgThink    = `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}`
		msgTool     = `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}`
		msgSig      = `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}`
		msgStop     = `{"type":"content_block_stop","index":0}`
		msgUsage    = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}`
		msgEnd      = `{"type":"message_stop"}`
		msgError    = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	)
	for _, tc := range []struct {
		name          string
		api           API
		body          string
		tokens, input int
		source        TokenSource
		err           string
	}{
		{"completions", APICompletions, sse(textChunk, textChunk, textFinish) + doneEvent, 2, 3, TokensEvents, ""},
		{"responses", APIResponses, sse(respCreated, respDelta, respDelta, respDone, respEnd), 7, 12, TokensUsage, ""},
		{"responses: empty and reasoning deltas", APIResponses, sse(respEmpty, respReason, respEnd), 7, 12, TokensUsage, ""},
		{"responses: no content", APIResponses, sse(respCreated, respEmpty, respEnd), 7, 12, TokensUsage, "stream carried no content"},
		{"responses: truncated", APIResponses, sse(respCreated, respDelta, respDone), 1, 3, TokensEvents, "stream ended without response.completed"},
		{"responses: [DONE] is not an end", APIResponses, sse(respDelta) + doneEvent, 1, 3, TokensEvents, "malformed stream event: [DONE]"},
		{"responses: failed", APIResponses, sse(respCreated, respDelta, respFailed), 1, 3, TokensEvents, "error event in stream: boom"},
		{"messages", APIMessages, sse(msgStart, msgBlock, msgPing, msgDelta, msgDelta, msgStop, msgUsage, msgEnd), 7, 12, TokensUsage, ""},
		{"messages: thinking and tool input count", APIMessages, sse(msgStart, msgThink, msgSig, msgTool, msgEnd), 2, 12, TokensEvents, ""},
		{"messages: truncated", APIMessages, sse(msgStart, msgBlock, msgDelta), 1, 12, TokensEvents, "stream ended without message_stop"},
		{"messages: error", APIMessages, sse(msgStart, msgDelta, msgError), 1, 12, TokensEvents, "error event in stream: Overloaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := readAPIBody(tc.api, tc.body)
			if s.Err != tc.err || s.OutputTokens != tc.tokens || s.InputTokens != tc.input || s.TokenSource != tc.source {
				t.Errorf("got err %q, %d tokens (%s), %d input; want err %q, %d (%s), %d",
					s.Err, s.OutputTokens, s.TokenSource, s.InputTokens, tc.err, tc.tokens, tc.source, tc.input)
			}
			if s.Err == "" && (s.TTFT <= 0 || s.E2E < s.TTFT) {
				t.Errorf("ttft %s, e2e %s", s.TTFT, s.E2E)
			}
		})
	}
}

// gjsonType is an event's "type", the name of its event: line.
func gjsonType(data string) string {
	var v struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal([]byte(data), &v)
	return v.Type
}

func TestReadWhole(t *testing.T) {
	for _, tc := range []struct {
		name          string
		api           API
		body          string
		tokens, input int
		source        TokenSource
		err           string
	}{
		{"chat", APIChat, `{"choices":[{"message":{"content":"a b c"}}],"usage":{"prompt_tokens":4,"completion_tokens":3}}`, 3, 4, TokensUsage, ""},
		{"chat without usage", APIChat, `{"choices":[{"message":{"content":"a b c"}}]}`, 3, 9, TokensWords, ""},
		{"completions", APICompletions, `{"choices":[{"text":"a b"}]}`, 2, 9, TokensWords, ""},
		{"responses", APIResponses, `{"output":[{"type":"message","content":[{"type":"output_text","text":"a b"}]}],"usage":{"input_tokens":4,"output_tokens":2}}`, 2, 4, TokensUsage, ""},
		{"messages", APIMessages, `{"type":"message","content":[{"type":"text","text":"a b"}],"usage":{"input_tokens":4,"output_tokens":2}}`, 2, 4, TokensUsage, ""},
		{"messages error", APIMessages, `{"type":"error","error":{"type":"api_error","message":"boom"}}`, 0, 9, 0, "error in response: boom"},
		{"embeddings", APIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.5]}],"usage":{"prompt_tokens":4,"total_tokens":4}}`, 0, 4, TokensUsage, ""},
		{"embeddings base64", APIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AAAAPw=="}],"usage":{"prompt_tokens":4,"total_tokens":4}}`, 0, 4, TokensUsage, ""},
		{"embeddings without data", APIEmbeddings, `{"object":"list","data":[],"usage":{"prompt_tokens":4,"total_tokens":4}}`, 0, 4, TokensUsage, "response carried no content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Sample{Start: time.Now(), InputTokens: 9}
			readWhole(&s, tc.api, strings.NewReader(tc.body), 0, nil)
			if s.Err != tc.err || s.OutputTokens != tc.tokens || s.InputTokens != tc.input || s.TokenSource != tc.source {
				t.Errorf("got err %q, %d tokens (%s), %d input; want err %q, %d (%s), %d",
					s.Err, s.OutputTokens, s.TokenSource, s.InputTokens, tc.err, tc.tokens, tc.source, tc.input)
			}
			if noTTFT := s.TTFT == 0; noTTFT != (tc.api == APIEmbeddings) {
				t.Errorf("ttft %s for %s", s.TTFT, tc.api)
			}
		})
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
		if err := sr.read(&s, APIChat, r); err != nil || !s.OK() {
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
		if ev, ok := inspect(APIChat, data); !ok || !ev.content {
			b.Fatal("not content")
		}
	}
}
