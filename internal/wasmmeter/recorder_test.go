package wasmmeter

import (
	"reflect"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

func chunk(content string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","model":"m-1","choices":[{"index":0,"delta":{"content":"` + content + `"}}]}` + "\n\n"
}

// The recorder times what extproc's meter times: the first content event
// from the request's start, each gap between content events (events in one
// chunk share its arrival), usage from the final chunk, unreadable events,
// lines split across chunks.
func TestRecorderStream(t *testing.T) {
	t0 := time.UnixMicro(1_767_000_000_000_000)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var r Recorder
	r.Start(t0, "")
	r.ResponseHeaders("text/event-stream; charset=utf-8")
	role := `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	r.Body([]byte(role), at(40))
	r.Body([]byte(chunk("a")), at(50))
	two := chunk("b") + chunk("c")
	r.Body([]byte(two[:30]), at(60)) // split mid-line: the event completes at 70
	r.Body([]byte(two[30:]), at(70))
	r.Body([]byte("data: not json\n\n: keep-alive\n\n"), at(75))
	r.Body([]byte(chunk("d")), at(100))
	r.Body([]byte(`data: {"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":4,"total_tokens":10}}`+"\n\ndata: [DONE]\n\n"), at(101))
	s, ok := r.End(true, at(102))
	if !ok {
		t.Fatal("no summary")
	}
	want := []time.Duration{20 * time.Millisecond, 0, 30 * time.Millisecond}
	if !s.Complete || !s.SSE || !s.HasFirst || s.TTFT != 50*time.Millisecond || s.E2E != 102*time.Millisecond ||
		s.ContentEvents != 4 || s.BadEvents != 1 || s.ITLMax != 30*time.Millisecond || !reflect.DeepEqual(s.Gaps, want) ||
		s.ResponseModel != "m-1" || s.Usage == nil || s.Usage.PromptTokens != 6 || s.Usage.CompletionTokens != 4 {
		t.Errorf("summary %+v (usage %+v)", s, s.Usage)
	}
	if _, again := r.End(false, at(200)); again {
		t.Error("a second End wrote another summary")
	}
	if _, err := Parse(s.Encode()); err != nil {
		t.Error(err)
	}
}

// A client that left at [DONE] (the OpenAI SDKs close there) had the whole
// response: complete, ended at [DONE], not when Envoy saw the reset.
func TestRecorderClientLeftAtDone(t *testing.T) {
	t0 := time.Now()
	var r Recorder
	r.Start(t0, "")
	r.ResponseHeaders("text/event-stream")
	r.Body([]byte(chunk("a")), t0.Add(50*time.Millisecond))
	r.Body([]byte("data: [DONE]\n\n"), t0.Add(60*time.Millisecond))
	s, _ := r.End(false, t0.Add(5*time.Second))
	if !s.Complete || s.E2E != 60*time.Millisecond || s.ContentEvents != 1 {
		t.Errorf("left at [DONE]: complete %v, E2E %v, %d events", s.Complete, s.E2E, s.ContentEvents)
	}
}

// A cut stream, an event with no blank line before the end, a bounded
// number of gaps, a response the gate answered itself (never started).
func TestRecorderCutAndBounds(t *testing.T) {
	t0 := time.Now()
	var r Recorder
	r.Start(t0, "")
	r.ResponseHeaders("text/event-stream")
	for i := range MaxGaps + 5 {
		r.Body([]byte(chunk("x")), t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	r.Body([]byte(`data: {"choices":[{"delta":{"content":"y"}}]}`), t0.Add(time.Minute)) // no "\n\n": flushed at the end
	s, _ := r.End(false, t0.Add(time.Minute))
	if s.Complete || len(s.Gaps) != MaxGaps || s.ContentEvents != MaxGaps+6 || s.ITLMax < 40*time.Second || s.Usage != nil {
		t.Errorf("cut: complete %v, %d gaps, %d events, max %v", s.Complete, len(s.Gaps), s.ContentEvents, s.ITLMax)
	}
	if enc := s.Encode(); len(enc) > MaxSummary {
		t.Errorf("summary of %d bytes", len(enc))
	}
	var never Recorder
	if _, ok := never.End(false, t0); ok {
		t.Error("a request never started has a summary")
	}
}

// A non-streamed response is read whole at its end, as internal/tally
// reads one: usage, model, content (its one "event" at the end).
func TestRecorderJSON(t *testing.T) {
	t0 := time.Now()
	var r Recorder
	r.Start(t0, "")
	r.ResponseHeaders("application/json")
	body := `{"model":"m-2","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	r.Body([]byte(body[:20]), t0.Add(time.Millisecond))
	r.Body([]byte(body[20:]), t0.Add(2*time.Millisecond))
	s, _ := r.End(true, t0.Add(3*time.Millisecond))
	if s.SSE || s.ContentEvents != 1 || !s.HasFirst || s.TTFT != 3*time.Millisecond || s.ResponseModel != "m-2" ||
		s.Usage == nil || s.Usage.CompletionTokens != 1 {
		t.Errorf("json: %+v", s)
	}
}

// Every API is read as extproc's meter reads it (internal/tally): an
// Anthropic stream cut after message_start carries its input; an API named
// by the request's path reads an answer that does not name its own.
func TestRecorderAPIs(t *testing.T) {
	t0 := time.UnixMicro(time.Now().UnixMicro()) // as Parse reads it
	var r Recorder
	r.Start(t0, "")
	r.ResponseHeaders("text/event-stream")
	r.Body([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-m\",\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n"), t0.Add(5*time.Millisecond))
	r.Body([]byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"), t0.Add(50*time.Millisecond))
	s, _ := r.End(false, t0.Add(60*time.Millisecond))
	if s.API != openai.APIMessages || !s.HasInput || s.Input != 30 || s.Usage != nil || s.ContentEvents != 1 ||
		s.TTFT != 50*time.Millisecond || s.ResponseModel != "claude-m" {
		t.Errorf("cut messages stream: %+v", s)
	}
	if got, err := Parse(s.Encode()); err != nil || !reflect.DeepEqual(got, *s) {
		t.Errorf("round trip: %+v, %v", got, err)
	}

	var c Recorder
	c.Start(t0, openai.APICountTokens)
	c.ResponseHeaders("application/json")
	c.Body([]byte(`{"input_tokens":21}`), t0.Add(time.Millisecond))
	s, _ = c.End(true, t0.Add(time.Millisecond))
	if s.API != openai.APICountTokens || s.Usage == nil || s.Usage.PromptTokens != 21 || s.HasFirst {
		t.Errorf("count_tokens: %+v", s)
	}
}
