package mock

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The board profile answers every request with the same bytes, in the
// board mock's shape, on its cadence.
func TestBoardProfile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := DefaultBoard
		b.Chunks, b.Interval = 5, 10*time.Millisecond
		_, ts := newVirtualServer(t, Config{Board: &b})

		resp, body := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[]}`, nil)
		if resp.StatusCode != 200 || string(body) != boardMessage || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("non-streaming: %d %q", resp.StatusCode, body)
		}
		c := decode(t, string(body))
		if c.Choices[0].Message.Content != "ok" || c.Usage.TotalTokens != 12 {
			t.Fatalf("non-streaming answer %+v", c)
		}

		req := `{"model":"anything","stream":true,"messages":[{"role":"user","content":"u-1-2"}],"max_tokens":16}`
		events, total := streamRequest(t, ts, "/v1/chat/completions", req, nil)
		if len(events) != 1+5+1+1 {
			t.Fatalf("%d events, want role + 5 deltas + finish + [DONE]", len(events))
		}
		if r := decode(t, events[0].data); r.Choices[0].Delta.Role == nil || *r.Choices[0].Delta.Role != "assistant" {
			t.Fatalf("first event is not the role chunk: %s", events[0].data)
		}
		for k, ev := range events[1:6] {
			c := decode(t, ev.data)
			text := *c.Choices[0].Delta.Content
			if len(text) != 16 || !strings.HasPrefix(text, []string{"0x", "1x", "2x", "3x", "4x"}[k]) {
				t.Fatalf("delta %d = %q", k, text)
			}
		}
		if f := decode(t, events[6].data); *f.Choices[0].FinishReason != "stop" || events[7].data != "[DONE]" {
			t.Fatalf("tail %q %q", events[6].data, events[7].data)
		}
		// The first delta is not paced; the four others are 10ms apart (in
		// virtual time, exactly).
		var at []time.Duration
		for _, ev := range events[1:6] {
			at = append(at, ev.at)
		}
		if want := []time.Duration{0, ms(10), ms(20), ms(30), ms(40)}; !slices.Equal(at, want) || total != ms(40) {
			t.Fatalf("deltas at %v, stream over at %v; want %v, over at 40ms", at, total, want)
		}

		// The same bytes for any request; headers override the cadence.
		_, a := do(t, ts, http.MethodPost, "/v1/chat/completions", req, nil)
		_, other := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"stream":true,"model":"m2"}`,
			map[string]string{"x-mock-itl-ms": "0"})
		if string(a) != string(other) {
			t.Fatal("two streams differ")
		}
		_, three := do(t, ts, http.MethodPost, "/v1/chat/completions", req, map[string]string{"x-mock-tokens": "3", "x-mock-itl-ms": "0"})
		if n := strings.Count(string(three), "data: "); n != 1+3+2 {
			t.Fatalf("x-mock-tokens 3: %d events", n)
		}
		_, stamped := do(t, ts, http.MethodPost, "/v1/chat/completions", req, map[string]string{"x-mock-emit-timestamps": "1", "x-mock-itl-ms": "0"})
		var rest strings.Builder
		for line := range strings.SplitAfterSeq(string(stamped), "\n") {
			if !strings.HasPrefix(line, ": t=") {
				rest.WriteString(line)
			}
		}
		if strings.Count(string(stamped), ": t=") != 8 || rest.String() != string(a) {
			t.Fatalf("stamped stream:\n%s", stamped)
		}
		if resp, _ := do(t, ts, http.MethodPost, "/v1/chat/completions", req, map[string]string{"x-mock-itl-ms": "x"}); resp.StatusCode != 400 {
			t.Fatalf("bad override: %d", resp.StatusCode)
		}
	})
}

// The delay applies before any response, streaming or not.
func TestBoardDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := DefaultBoard
		b.Delay, b.Chunks, b.Interval = 30*time.Millisecond, 2, 0
		_, ts := newVirtualServer(t, Config{Board: &b})
		start := time.Now()
		do(t, ts, http.MethodPost, "/v1/chat/completions", `{}`, nil)
		if d := time.Since(start); d != 30*time.Millisecond {
			t.Fatalf("answered after %s", d)
		}
		events, _ := streamRequest(t, ts, "/v1/chat/completions", `{"stream": true}`, nil)
		if events[0].at != 30*time.Millisecond {
			t.Fatalf("stream started after %s", events[0].at)
		}
	})
}
