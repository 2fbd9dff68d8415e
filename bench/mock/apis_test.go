package mock

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Tests of the Responses, Anthropic Messages and embeddings APIs.

type namedEvent struct {
	name string
	data string
}

// namedEvents splits a stream of "event:"/"data:" pairs, failing on any
// other framing or on an event whose name is not its data's "type".
func namedEvents(t testing.TB, body string) []namedEvent {
	t.Helper()
	var events []namedEvent
	for _, e := range strings.SplitAfter(body, "\n\n") {
		if e == "" {
			continue
		}
		name, data, ok := strings.Cut(strings.TrimSuffix(e, "\n\n"), "\n")
		name, ok1 := strings.CutPrefix(name, "event: ")
		data, ok2 := strings.CutPrefix(data, "data: ")
		if !ok || !ok1 || !ok2 || strings.Contains(data, "\n") {
			t.Fatalf("bad event framing %q", e)
		}
		var v struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil || v.Type != name {
			t.Fatalf("event %q: data type %q (%v)", name, v.Type, err)
		}
		events = append(events, namedEvent{name, data})
	}
	return events
}

func names(events []namedEvent) []string {
	var out []string
	for _, e := range events {
		out = append(out, e.name)
	}
	return out
}

const responsesBody = `{"model":"m1","instructions":"be brief","max_output_tokens":7,"input":[` +
	`{"role":"user","content":"one two"},` +
	`{"type":"message","role":"user","content":[{"type":"input_text","text":"three"},{"type":"input_image","image_url":"x y"}]},` +
	`{"type":"function_call_output","call_id":"c","output":"ignored words"}]}`

func TestResponsesFormat(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	resp, full := do(t, ts, http.MethodPost, "/v1/responses", responsesBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d: %s", resp.StatusCode, full)
	}
	var r struct {
		ID        string `json:"id"`
		Object    string `json:"object"`
		CreatedAt int64  `json:"created_at"`
		Status    string `json:"status"`
		Model     string `json:"model"`
		Output    []struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Status  string `json:"status"`
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(full, &r); err != nil {
		t.Fatal(err)
	}
	// be brief + one two + three: 5 words; images and tool outputs count none.
	if r.Object != "response" || r.Status != "completed" || r.Model != "m1" || !strings.HasPrefix(r.ID, "resp_") ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || r.Output[0].Status != "completed" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" ||
		r.Usage.InputTokens != 5 || r.Usage.OutputTokens != 7 || r.Usage.TotalTokens != 12 {
		t.Fatalf("response %s", full)
	}
	text := r.Output[0].Content[0].Text
	if len(strings.Fields(text)) != 7 {
		t.Fatalf("text %q", text)
	}

	_, b := do(t, ts, http.MethodPost, "/v1/responses", strings.Replace(responsesBody, `{"model"`, `{"stream":true,"model"`, 1), nil)
	events := namedEvents(t, string(b))
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range 7 {
		want = append(want, "response.output_text.delta")
	}
	want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
	if got := names(events); !slices.Equal(got, want) {
		t.Fatalf("events %v", got)
	}
	var streamed strings.Builder
	for i, e := range events {
		var v struct {
			SequenceNumber int    `json:"sequence_number"`
			ItemID         string `json:"item_id"`
			Delta          string `json:"delta"`
			Text           string `json:"text"`
			Response       *struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(e.data), &v); err != nil || v.SequenceNumber != i {
			t.Fatalf("event %d: sequence_number %d (%v)", i, v.SequenceNumber, err)
		}
		if v.ItemID != "" && v.ItemID != r.Output[0].ID || v.Response != nil && v.Response.ID != r.ID {
			t.Fatalf("event %d ids differ from the full response's: %s", i, e.data)
		}
		streamed.WriteString(v.Delta)
		if e.name == "response.output_text.done" && v.Text != text {
			t.Fatalf("done text %q, want %q", v.Text, text)
		}
	}
	if streamed.String() != text {
		t.Fatalf("stream text %q != full text %q", streamed.String(), text)
	}
	// The completed event carries the full response, bytes and all.
	if last := events[len(events)-1].data; !strings.HasSuffix(last, `,"response":`+string(full)+`}`) {
		t.Fatalf("response.completed %s\nfull %s", last, full)
	}
	if got := events[0].data; !strings.Contains(got, `"status":"in_progress"`) || !strings.Contains(got, `"output":[],`) || !strings.Contains(got, `"usage":null`) {
		t.Fatalf("response.created %s", got)
	}
	if u := s.Usage(); u != (Usage{PromptTokens: 10, CompletionTokens: 14}) {
		t.Fatalf("ledger %+v", u)
	}
}

const messagesBody = `{"model":"m1","max_tokens":6,"system":[{"type":"text","text":"be brief"}],"messages":[` +
	`{"role":"user","content":"one two"},` +
	`{"role":"assistant","content":[{"type":"text","text":"three"},{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`

func TestMessagesFormat(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	resp, full := do(t, ts, http.MethodPost, "/v1/messages", messagesBody, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, full)
	}
	var m struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Model   string `json:"model"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(full, &m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || m.Role != "assistant" || m.Model != "m1" || !strings.HasPrefix(m.ID, "msg_") ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.Content[0].Text)) != 6 ||
		m.StopReason != "end_turn" || m.Usage.InputTokens != 5 || m.Usage.OutputTokens != 6 {
		t.Fatalf("message %s", full)
	}
	if !strings.Contains(string(full), `"stop_sequence":null`) {
		t.Fatalf("no stop_sequence: %s", full)
	}

	_, b := do(t, ts, http.MethodPost, "/v1/messages", strings.Replace(messagesBody, `{"model"`, `{"stream":true,"model"`, 1), nil)
	events := namedEvents(t, string(b))
	want := []string{"message_start", "content_block_start", "ping"}
	for range 6 {
		want = append(want, "content_block_delta")
	}
	want = append(want, "content_block_stop", "message_delta", "message_stop")
	if got := names(events); !slices.Equal(got, want) {
		t.Fatalf("events %v", got)
	}
	wantStart := `{"type":"message_start","message":{"id":"` + m.ID + `","type":"message","role":"assistant","model":"m1",` +
		`"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":0}}}`
	if events[0].data != wantStart {
		t.Fatalf("message_start\n got %s\nwant %s", events[0].data, wantStart)
	}
	for i, want := range map[int]string{
		1:  `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		2:  `{"type":"ping"}`,
		9:  `{"type":"content_block_stop","index":0}`,
		10: `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`,
		11: `{"type":"message_stop"}`,
	} {
		if events[i].data != want {
			t.Errorf("event %d\n got %s\nwant %s", i, events[i].data, want)
		}
	}
	var streamed strings.Builder
	for _, e := range events[3:9] {
		var v struct {
			Index int `json:"index"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(e.data), &v); err != nil || v.Delta.Type != "text_delta" || len(strings.Fields(v.Delta.Text)) != 1 {
			t.Fatalf("delta %s", e.data)
		}
		streamed.WriteString(v.Delta.Text)
	}
	if streamed.String() != m.Content[0].Text {
		t.Fatalf("stream text %q != full text %q", streamed.String(), m.Content[0].Text)
	}

	// count_tokens: what the same body bills, at once and for nothing.
	before := s.Usage()
	resp, b = do(t, ts, http.MethodPost, "/v1/messages/count_tokens", messagesBody, nil)
	if resp.StatusCode != 200 || string(b) != `{"input_tokens":5}` {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
	}
	if s.Usage() != before || before != (Usage{PromptTokens: 10, CompletionTokens: 12}) {
		t.Fatalf("ledger %+v, then %+v", before, s.Usage())
	}
}

func TestEmbeddings(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	type list struct {
		Object string `json:"object"`
		Data   []struct {
			Object    string          `json:"object"`
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Model string `json:"model"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	embed := func(body string) (list, []byte) {
		t.Helper()
		resp, b := do(t, ts, http.MethodPost, "/v1/embeddings", body, nil)
		var l list
		if resp.StatusCode != 200 || json.Unmarshal(b, &l) != nil || l.Object != "list" {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		for i, d := range l.Data {
			if d.Object != "embedding" || d.Index != i {
				t.Fatalf("item %d: %s", i, b)
			}
		}
		return l, b
	}
	floats := func(raw json.RawMessage) []float32 {
		t.Helper()
		var v []float32
		if err := json.Unmarshal(raw, &v); err != nil {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				t.Fatalf("embedding %s", raw)
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(b)%4 != 0 {
				t.Fatalf("base64 embedding %q: %v", s, err)
			}
			for i := 0; i < len(b); i += 4 {
				v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			}
		}
		return v
	}

	l, first := embed(`{"model":"e1","input":["one two three","four"]}`)
	if len(l.Data) != 2 || l.Model != "e1" || l.Usage.PromptTokens != 4 || l.Usage.TotalTokens != 4 {
		t.Fatalf("%s", first)
	}
	a, b := floats(l.Data[0].Embedding), floats(l.Data[1].Embedding)
	if len(a) != defaultEmbeddingDimensions || slices.Equal(a, b) {
		t.Fatalf("vectors of %d dimensions, equal: %v", len(a), slices.Equal(a, b))
	}
	norm := 0.0
	for _, x := range a {
		norm += float64(x) * float64(x)
	}
	if math.Abs(norm-1) > 1e-5 {
		t.Fatalf("norm² %v, want 1", norm)
	}
	// Equal inputs embed equally, wherever they are; re-serialized, the
	// request answers the same bytes.
	l2, _ := embed(`{"model":"e1","input":"four"}`)
	if !slices.Equal(floats(l2.Data[0].Embedding), b) {
		t.Fatal("the same input embedded differently")
	}
	if _, again := embed(`{ "input": ["one two three", "four"], "model": "e1", "user": "x" }`); string(again) != string(first) {
		t.Fatalf("re-serialized request changed the body:\n%s\n%s", first, again)
	}
	// Dimensions, base64 (the same float32s) and token ids.
	l3, _ := embed(`{"model":"e1","input":"four","dimensions":8,"encoding_format":"base64"}`)
	l4, _ := embed(`{"model":"e1","input":"four","dimensions":8,"encoding_format":"float"}`)
	if v := floats(l3.Data[0].Embedding); len(v) != 8 || !slices.Equal(v, floats(l4.Data[0].Embedding)) {
		t.Fatalf("base64 %v vs float %v", v, floats(l4.Data[0].Embedding))
	}
	l5, _ := embed(`{"model":"e1","input":[[1,2,3],[4]],"dimensions":4}`)
	l6, _ := embed(`{"model":"e1","input":[1,2,3],"dimensions":4}`)
	if len(l5.Data) != 2 || l5.Usage.PromptTokens != 4 || !slices.Equal(floats(l5.Data[0].Embedding), floats(l6.Data[0].Embedding)) {
		t.Fatalf("token ids: %+v", l5)
	}
	if u := s.Usage(); u.CompletionTokens != 0 || u.PromptTokens != 4+1+4+1+1+4+3 {
		t.Fatalf("ledger %+v", u)
	}
}

// TestAPIErrors: bad input gets a 400 in the API's own error format.
func TestAPIErrors(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	openAI := []struct{ path, body, code string }{
		{"/v1/responses", `{"model":`, "invalid_json"},
		{"/v1/responses", `{"input":"hi"}`, "missing_model"},
		{"/v1/responses", `{"model":"m","input":7}`, "invalid_input"},
		{"/v1/responses", `{"model":"m","instructions":["a"]}`, "invalid_instructions"},
		{"/v1/embeddings", `nope`, "invalid_json"},
		{"/v1/embeddings", `{"model":"m"}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":""}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":[]}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":["a",""]}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":[[1],[]]}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":{"a":1}}`, "invalid_input"},
		{"/v1/embeddings", `{"model":"m","input":"a","dimensions":-1}`, "invalid_dimensions"},
		{"/v1/embeddings", `{"model":"m","input":"a","encoding_format":"int8"}`, "invalid_encoding_format"},
	}
	for _, tc := range openAI {
		resp, body := do(t, ts, http.MethodPost, tc.path, tc.body, nil)
		if resp.StatusCode != 400 {
			t.Fatalf("%s %s: status %d", tc.path, tc.body, resp.StatusCode)
		}
		assertError(t, body, "invalid_request_error", tc.code)
	}
	anthropic := []struct {
		method, path, body string
		hdr                map[string]string
		status             int
		typ                string
	}{
		{"POST", "/v1/messages", `{"model":`, nil, 400, "invalid_request_error"},
		{"POST", "/v1/messages", `{"model":"m","max_tokens":1}`, nil, 400, "invalid_request_error"},
		{"POST", "/v1/messages", `{"model":"m","messages":"hi"}`, nil, 400, "invalid_request_error"},
		{"POST", "/v1/messages", `{"model":"m","system":5,"messages":[]}`, nil, 400, "invalid_request_error"},
		{"POST", "/v1/messages/count_tokens", `{"messages":[]}`, nil, 400, "invalid_request_error"},
		{"GET", "/v1/messages", ``, nil, 405, "invalid_request_error"},
		{"POST", "/v1/messages", `{"model":"m","messages":[]}`, map[string]string{"x-mock-tokens": "0"}, 400, "invalid_request_error"},
		{"POST", "/v1/messages", `{"model":"m","messages":[]}`, map[string]string{"x-mock-status": "529"}, 529, "overloaded_error"},
		{"POST", "/v1/messages", `{"model":"m","messages":[]}`, map[string]string{"x-mock-status": "429"}, 429, "rate_limit_error"},
		{"POST", "/v1/messages", `{"model":"m","messages":[]}`, map[string]string{"x-mock-status": "500"}, 500, "api_error"},
		{"POST", "/v1/messages/count_tokens", `{"model":"m","messages":[]}`, map[string]string{"x-mock-status": "401"}, 401, "authentication_error"},
	}
	for _, tc := range anthropic {
		resp, body := do(t, ts, tc.method, tc.path, tc.body, tc.hdr)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if resp.StatusCode != tc.status || json.Unmarshal(body, &e) != nil || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" {
			t.Fatalf("%s %s %s %v: %d %s", tc.method, tc.path, tc.body, tc.hdr, resp.StatusCode, body)
		}
	}
	if got := s.Served(); got != int64(len(openAI)+len(anthropic)) {
		t.Fatalf("Served() = %d", got)
	}
}

// TestAPICadence: the same TTFT, prefill and ITL schedule for every API;
// an embedding answers when its prefill is over.
func TestAPICadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(30), TTFTPerPromptToken: ms(2), ITL: ms(10)}, nil)
		for _, tc := range []struct{ path, body, delta string }{
			{"/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`, `"content":"`},
			{"/v1/responses", `{"model":"m","stream":true,"max_output_tokens":4,"input":"a b c"}`, `"delta":"`},
			{"/v1/messages", `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`, `"text_delta"`},
		} {
			start := time.Now()
			rec, done := call(context.Background(), s, tc.path, tc.body, nil)
			<-done
			_, writes := rec.snapshot()
			var at []time.Duration
			for _, w := range writes {
				if strings.Contains(w.data, tc.delta) && !strings.Contains(w.data, `"content":""`) {
					at = append(at, w.at.Sub(start))
				}
			}
			if want := []time.Duration{ms(36), ms(46), ms(56), ms(66)}; !slices.Equal(at, want) {
				t.Errorf("%s: content at %v, want %v", tc.path, at, want)
			}
			if writes[0].at != start {
				t.Errorf("%s: stream opened at %v", tc.path, writes[0].at.Sub(start))
			}
		}
		start := time.Now()
		rec, done := call(context.Background(), s, "/v1/embeddings", `{"model":"m","input":["a b","c d e"]}`, nil)
		<-done
		if code, writes := rec.snapshot(); code != 200 || writes[0].at.Sub(start) != ms(30+2*5) {
			t.Errorf("embeddings: %d at %v, want 40ms", code, writes[0].at.Sub(start))
		}
		// x-mock-ttft-ms overrides the fixed part for embeddings too.
		start = time.Now()
		rec, done = call(context.Background(), s, "/v1/embeddings", `{"model":"m","input":"a"}`, map[string]string{"x-mock-ttft-ms": "5"})
		<-done
		if _, writes := rec.snapshot(); writes[0].at.Sub(start) != ms(7) {
			t.Errorf("embeddings with x-mock-ttft-ms 5: at %v, want 7ms", writes[0].at.Sub(start))
		}
	})
}

// TestAPIFaultsAndStamps: the mid-stream faults and emit stamps work on
// named events too.
func TestAPIFaultsAndStamps(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	for _, tc := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"m","stream":true,"max_output_tokens":5,"input":"hi"}`},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		_, plain := do(t, ts, http.MethodPost, tc.path, tc.body, nil)
		plainEvents := namedEvents(t, string(plain))
		opened := len(plainEvents) - 5 - 4 // before the deltas
		if tc.path == "/v1/messages" {
			opened = len(plainEvents) - 5 - 3
		}

		_, b := do(t, ts, http.MethodPost, tc.path, tc.body, map[string]string{"x-mock-malformed-after": "2"})
		events := strings.SplitAfter(string(b), "\n\n")
		broken := opened + 2
		data := events[broken][strings.Index(events[broken], "data: ")+len("data: "):]
		if !strings.HasPrefix(events[broken], "event: ") || json.Valid([]byte(strings.TrimSpace(data))) {
			t.Fatalf("%s: event %d is not malformed: %q", tc.path, broken, events[broken])
		}
		if rest := strings.Join(append(events[:broken:broken], events[broken+1:]...), ""); tc.path == "/v1/messages" && rest != string(plain) {
			t.Fatalf("%s: the stream around the broken event changed:\n%s", tc.path, b)
		}

		_, b = do(t, ts, http.MethodPost, tc.path, tc.body, map[string]string{"x-mock-emit-timestamps": "1"})
		var unstamped strings.Builder
		seq := 0
		for line := range strings.Lines(string(b)) {
			if m := stampLine.FindStringSubmatch(line); m != nil {
				if m[2] != strconv.Itoa(seq) {
					t.Fatalf("%s: seq %s, want %d", tc.path, m[2], seq)
				}
				seq++
				continue
			}
			unstamped.WriteString(line)
		}
		if seq != len(plainEvents) || unstamped.String() != string(plain) {
			t.Fatalf("%s: %d stamps; unstamped:\n%s", tc.path, seq, unstamped.String())
		}

		req, _ := http.NewRequest(http.MethodPost, ts.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("x-mock-reset-after", "2")
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) || strings.Count(string(got), "event: ") != opened+2 {
			t.Fatalf("%s: reset after 2 tokens: %v after\n%s", tc.path, err, got)
		}
	}
}

// TestAPIControls: /mock/control and the x-mock-* token headers apply to
// every API.
func TestAPIControls(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	msgs := `{"model":"m","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`
	_, b := do(t, ts, http.MethodPost, "/v1/messages", msgs, map[string]string{"x-mock-tokens": "5", "x-mock-tokens-per-event": "2"})
	events := namedEvents(t, string(b))
	if n := strings.Count(string(b), "event: content_block_delta"); n != 3 || !strings.Contains(events[len(events)-2].data, `"output_tokens":5`) {
		t.Fatalf("%d deltas for 5 tokens 2 per event:\n%s", n, b)
	}
	resp, _ := do(t, ts, http.MethodPost, "/mock/control", `{"error_rate":1,"error_status":503}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("control: %d", resp.StatusCode)
	}
	for path, body := range map[string]string{
		"/v1/messages":              msgs,
		"/v1/messages/count_tokens": msgs,
		"/v1/responses":             `{"model":"m","input":"hi"}`,
		"/v1/embeddings":            `{"model":"m","input":"hi"}`,
	} {
		resp, b := do(t, ts, http.MethodPost, path, body, nil)
		want := `"type":"server_error"`
		if strings.HasPrefix(path, "/v1/messages") {
			want = `"type":"api_error"`
		}
		if resp.StatusCode != 503 || !strings.Contains(string(b), want) {
			t.Errorf("%s with error_rate 1: %d %s", path, resp.StatusCode, b)
		}
	}
	if u := s.Usage(); u != (Usage{PromptTokens: 1, CompletionTokens: 5}) {
		t.Errorf("ledger %+v: failed requests billed", u)
	}
}
