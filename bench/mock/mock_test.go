package mock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/pipenet"
)

// noDelay makes responses as fast as possible; negative durations are how a
// Config asks for zero delay, since zero means "default".
func noDelay() Config { return Config{TTFT: -1, ITL: -1} }

func newTestServer(t testing.TB, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func do(t testing.TB, ts *httptest.Server, method, path, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

type sseEvent struct {
	data string
	at   time.Duration // arrival, relative to when the request was sent
}

// streamRequest sends a request and records when each SSE event arrives.
func streamRequest(t testing.TB, ts *httptest.Server, path, body string, headers map[string]string) ([]sseEvent, time.Duration) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	var events []sseEvent
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if line == "\n" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %q not terminated by a blank line", line)
		}
		events = append(events, sseEvent{data: strings.TrimSuffix(data, "\n"), at: time.Since(start)})
	}
	return events, time.Since(start)
}

// chunk is a superset of chat and text completion chunks for decoding.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func decode(t testing.TB, data string) chunk {
	t.Helper()
	var c chunk
	dec := json.NewDecoder(strings.NewReader(data))
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("invalid JSON %q: %v", data, err)
	}
	return c
}

// text returns a content event's text for either endpoint.
func (c chunk) text() string {
	if len(c.Choices) == 0 {
		return ""
	}
	ch := c.Choices[0]
	switch {
	case ch.Delta != nil && ch.Delta.Content != nil:
		return *ch.Delta.Content
	case ch.Text != nil:
		return *ch.Text
	}
	return ""
}

// parsedStream splits a stream into its parts, failing on any structural
// violation of the expected chunk order.
type parsedStream struct {
	role     *chunk
	content  []chunk
	contentT []time.Duration
	finish   chunk
	usage    *chunk
}

func parseStream(t testing.TB, events []sseEvent, chat bool) parsedStream {
	t.Helper()
	if len(events) < 3 {
		t.Fatalf("only %d events", len(events))
	}
	if last := events[len(events)-1].data; last != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", last)
	}
	events = events[:len(events)-1]
	var p parsedStream
	if chat {
		c := decode(t, events[0].data)
		if len(c.Choices) != 1 || c.Choices[0].Delta == nil || c.Choices[0].Delta.Role == nil ||
			*c.Choices[0].Delta.Role != "assistant" || c.text() != "" || c.Choices[0].FinishReason != nil {
			t.Fatalf("first event is not a role-only chunk: %s", events[0].data)
		}
		p.role = &c
		events = events[1:]
	}
	if c := decode(t, events[len(events)-1].data); len(c.Choices) == 0 {
		if c.Usage == nil {
			t.Fatalf("choice-less chunk without usage: %s", events[len(events)-1].data)
		}
		p.usage = &c
		events = events[:len(events)-1]
	}
	p.finish = decode(t, events[len(events)-1].data)
	if len(p.finish.Choices) != 1 || p.finish.Choices[0].FinishReason == nil ||
		*p.finish.Choices[0].FinishReason != "length" || p.finish.text() != "" {
		t.Fatalf("bad finish chunk: %s", events[len(events)-1].data)
	}
	for _, e := range events[:len(events)-1] {
		c := decode(t, e.data)
		if len(c.Choices) != 1 || c.Choices[0].FinishReason != nil || c.text() == "" || c.Usage != nil {
			t.Fatalf("bad content chunk: %s", e.data)
		}
		p.content = append(p.content, c)
		p.contentT = append(p.contentT, e.at)
	}
	return p
}

func (p parsedStream) text() string {
	var b strings.Builder
	for _, c := range p.content {
		b.WriteString(c.text())
	}
	return b.String()
}

const chatBody = `{"model":"mock-model","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"hello there mock"}]}`

func TestStreamDeterministic(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	_, a := do(t, ts, http.MethodPost, "/v1/chat/completions", chatBody, nil)
	_, b := do(t, ts, http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if !bytes.Equal(a, b) {
		t.Fatalf("identical requests, different bodies:\n%s\n%s", a, b)
	}

	// The same request re-serialized with other key order, whitespace and
	// unknown fields is semantically identical.
	reordered := `{ "messages": [ {"content": "hello there mock", "role": "user"} ],
		"max_tokens": 12, "stream": true, "temperature": 0.7, "user": "x", "model": "mock-model" }`
	_, c := do(t, ts, http.MethodPost, "/v1/chat/completions", reordered, nil)
	if !bytes.Equal(a, c) {
		t.Fatalf("re-serialized request changed the body:\n%s\n%s", a, c)
	}

	// A different prompt must change id and content.
	other := strings.Replace(chatBody, "hello", "goodbye", 1)
	_, d := do(t, ts, http.MethodPost, "/v1/chat/completions", other, nil)
	if bytes.Equal(a, d) {
		t.Fatal("different prompts produced identical bodies")
	}
}

func TestStreamOptionsOnlyAddUsageChunk(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(path, func(t *testing.T) {
			_, ts := newTestServer(t, noDelay())
			body := chatBody
			if path == "/v1/completions" {
				body = `{"model":"mock-model","stream":true,"max_tokens":12,"prompt":"hello there mock"}`
			}
			withUsage := strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
			withoutUsage := strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":false}`, 1)

			_, plain := do(t, ts, http.MethodPost, path, body, nil)
			_, without := do(t, ts, http.MethodPost, path, withoutUsage, nil)
			_, with := do(t, ts, http.MethodPost, path, withUsage, nil)
			if !bytes.Equal(plain, without) {
				t.Fatalf("include_usage:false changed the body:\n%s\n%s", plain, without)
			}

			// Removing the usage event from the usage stream must give back
			// the plain stream exactly.
			events := strings.SplitAfter(string(with), "\n\n")
			usageIdx := len(events) - 3 // ..., usage, [DONE], "" (after the final separator)
			if !strings.Contains(events[usageIdx], `"usage":{`) {
				t.Fatalf("no usage event before [DONE]:\n%s", with)
			}
			stripped := strings.Join(slices.Delete(events, usageIdx, usageIdx+1), "")
			if stripped != string(plain) {
				t.Fatalf("streams differ beyond the usage chunk:\n%s\n%s", stripped, plain)
			}
		})
	}
}

func TestChatStreamFormat(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"messages":[` +
		`{"role":"system","content":"be brief"},` +
		`{"role":"user","content":[{"type":"text","text":"one two three"},{"type":"image_url","image_url":{"url":"x y z"}}]}]}`
	events, _ := streamRequest(t, ts, "/v1/chat/completions", body, nil)
	p := parseStream(t, events, true)

	if len(p.content) != 7 {
		t.Fatalf("%d content events, want 7", len(p.content))
	}
	if n := len(strings.Fields(p.text())); n != 7 {
		t.Fatalf("%d tokens in %q, want 7", n, p.text())
	}
	if p.usage == nil {
		t.Fatal("usage chunk missing")
	}
	if want := (usage{PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12}); *p.usage.Usage != want {
		t.Fatalf("usage %+v, want %+v", *p.usage.Usage, want)
	}
	all := append([]chunk{*p.role, p.finish, *p.usage}, p.content...)
	for _, c := range all {
		if c.ID != p.role.ID || c.Created != p.role.Created || c.Model != "m1" || c.Object != "chat.completion.chunk" {
			t.Fatalf("inconsistent envelope %+v vs role %+v", c, *p.role)
		}
	}
	if !strings.HasPrefix(p.role.ID, "chatcmpl-") || len(p.role.ID) != len("chatcmpl-")+24 {
		t.Fatalf("id %q", p.role.ID)
	}
	if p.role.Created < 1_700_000_000 || p.role.Created >= 1_701_000_000 {
		t.Fatalf("created %d outside the derived range", p.role.Created)
	}

	// The exact wire shape of the role and finish chunks matters to meters.
	wantRole := `{"id":"` + p.role.ID + `","object":"chat.completion.chunk","created":` + strconv.FormatInt(p.role.Created, 10) +
		`,"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	if events[0].data != wantRole {
		t.Fatalf("role chunk\n got %s\nwant %s", events[0].data, wantRole)
	}
	if got := events[len(events)-3].data; !strings.HasSuffix(got, `"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`) {
		t.Fatalf("finish chunk %s", got)
	}
	if got := events[len(events)-2].data; !strings.HasSuffix(got, `"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`) {
		t.Fatalf("usage chunk %s", got)
	}
}

func TestNonStreamMatchesStream(t *testing.T) {
	cases := []struct {
		path, body string
		chat       bool
	}{
		{"/v1/chat/completions", `{"model":"mock-model","max_completion_tokens":9,"messages":[{"role":"user","content":"a b c d"}]}`, true},
		{"/v1/completions", `{"model":"mock-model","max_tokens":9,"prompt":["a b","c d"]}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			_, ts := newTestServer(t, noDelay())
			resp, body := do(t, ts, http.MethodPost, tc.path, tc.body, nil)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			full := decode(t, string(body))
			var text string
			if tc.chat {
				if full.Object != "chat.completion" || full.Choices[0].Message == nil || full.Choices[0].Message.Role != "assistant" {
					t.Fatalf("bad chat.completion %s", body)
				}
				text = full.Choices[0].Message.Content
			} else {
				if full.Object != "text_completion" || !strings.HasPrefix(full.ID, "cmpl-") {
					t.Fatalf("bad text_completion %s", body)
				}
				text = *full.Choices[0].Text
			}
			if *full.Choices[0].FinishReason != "length" {
				t.Fatalf("finish_reason %q", *full.Choices[0].FinishReason)
			}
			if want := (usage{PromptTokens: 4, CompletionTokens: 9, TotalTokens: 13}); full.Usage == nil || *full.Usage != want {
				t.Fatalf("usage %+v, want %+v", full.Usage, want)
			}

			streamBody := strings.Replace(tc.body, `{"model"`, `{"stream":true,"model"`, 1)
			events, _ := streamRequest(t, ts, tc.path, streamBody, nil)
			p := parseStream(t, events, tc.chat)
			if p.text() != text {
				t.Fatalf("stream content %q != non-stream content %q", p.text(), text)
			}
			if p.finish.ID != full.ID || p.finish.Created != full.Created {
				t.Fatalf("stream id/created %s/%d != %s/%d", p.finish.ID, p.finish.Created, full.ID, full.Created)
			}
			if p.usage != nil {
				t.Fatal("usage chunk sent without stream_options")
			}
			if !tc.chat && (p.role != nil || p.content[0].Object != "text_completion") {
				t.Fatal("completions stream must start with content")
			}
		})
	}
}

// TestCadence runs in virtual time (an in-memory network in a synctest
// bubble): the content events arrive exactly on their deadlines, 30 ms
// then every 10 ms, absolute from the request's arrival.
func TestCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ts := newVirtualServer(t, Config{TTFT: 30 * time.Millisecond, ITL: 10 * time.Millisecond})
		events, total := streamRequest(t, ts, "/v1/chat/completions", cadenceBody, nil)
		p := parseStream(t, events, true)
		var want []time.Duration
		for k := range 10 {
			want = append(want, 30*time.Millisecond+time.Duration(k)*10*time.Millisecond)
		}
		if !slices.Equal(p.contentT, want) || total != want[9] {
			t.Fatalf("content events at %v, stream over at %v; want %v, over at %v", p.contentT, total, want, want[9])
		}
	})
}

const cadenceBody = `{"model":"mock-model","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`

// newVirtualServer is newTestServer on an in-memory network, for a test in
// a synctest bubble (ts.Client() dials it).
func newVirtualServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg, nil)
	var n pipenet.Net
	ts := &httptest.Server{Listener: n.Listen(), Config: &http.Server{Handler: s.Handler()}}
	ts.Start()
	ts.Client().Transport = &http.Transport{DialContext: n.Dial}
	t.Cleanup(ts.Close)
	return s, ts
}

func TestPrefillPerPromptToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ts := newVirtualServer(t, Config{TTFT: 5 * time.Millisecond, TTFTPerPromptToken: 10 * time.Millisecond, ITL: -1})
		body := `{"model":"mock-model","stream":true,"max_tokens":2,"prompt":"one two three four"}`
		events, _ := streamRequest(t, ts, "/v1/completions", body, nil)
		p := parseStream(t, events, false)
		if first := p.contentT[0]; first != 45*time.Millisecond {
			t.Fatalf("first content after %v, want 45ms (5ms + 4×10ms)", first)
		}
	})
}

func TestScheduleJitterDeterministic(t *testing.T) {
	t0 := time.Now()
	s := schedule{t0: t0, first: t0.Add(50 * time.Millisecond), itl: 20 * time.Millisecond, jitter: 5 * time.Millisecond, seed: 42}
	varied := false
	for k := range 100 {
		base := s.first.Add(time.Duration(k) * s.itl)
		d := s.deadline(k)
		if off := d.Sub(base); off < -s.jitter || off > s.jitter {
			t.Fatalf("event %d offset %v outside ±%v", k, off, s.jitter)
		} else if off != 0 {
			varied = true
		}
		if !d.Equal(s.deadline(k)) {
			t.Fatalf("event %d deadline not deterministic", k)
		}
	}
	if !varied {
		t.Fatal("jitter never applied")
	}
}

func TestOverrides(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	base := `{"model":"mock-model","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`

	t.Run("tokens and tokens per event", func(t *testing.T) {
		events, _ := streamRequest(t, ts, "/v1/chat/completions", base, map[string]string{
			"x-mock-tokens": "11", "x-mock-tokens-per-event": "3",
		})
		p := parseStream(t, events, true)
		var sizes []int
		for _, c := range p.content {
			sizes = append(sizes, len(strings.Fields(c.text())))
		}
		if want := []int{3, 3, 3, 2}; !slices.Equal(sizes, want) {
			t.Fatalf("tokens per event %v, want %v", sizes, want)
		}
	})

	t.Run("ttft and itl", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, ts := newVirtualServer(t, noDelay())
			events, total := streamRequest(t, ts, "/v1/chat/completions", base, map[string]string{
				"x-mock-ttft-ms": "40", "x-mock-itl-ms": "0",
			})
			p := parseStream(t, events, true)
			if len(p.contentT) != 10 || p.contentT[0] != 40*time.Millisecond || p.contentT[9] != 40*time.Millisecond || total != 40*time.Millisecond {
				t.Fatalf("content events at %v, stream over at %v; want all at 40ms", p.contentT, total)
			}
		})
	})

	t.Run("invalid values", func(t *testing.T) {
		for _, h := range []map[string]string{
			{"x-mock-ttft-ms": "-1"},
			{"x-mock-itl-ms": "fast"},
			{"x-mock-tokens-per-event": "0"},
			{"x-mock-tokens": "0"},
			{"x-mock-status": "200"},
		} {
			resp, body := do(t, ts, http.MethodPost, "/v1/chat/completions", base, h)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("%v: status %d, want 400", h, resp.StatusCode)
			}
			assertError(t, body, "invalid_request_error", "invalid_header")
		}
	})

	t.Run("status", func(t *testing.T) {
		for _, tc := range []struct {
			status    int
			typ, code string
		}{
			{500, "server_error", "mock_injected_error"},
			{503, "server_error", "mock_injected_error"},
			{429, "rate_limit_error", "rate_limit_exceeded"},
		} {
			resp, body := do(t, ts, http.MethodPost, "/v1/chat/completions", base, map[string]string{
				"x-mock-status": strconv.Itoa(tc.status),
			})
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			assertError(t, body, tc.typ, tc.code)
		}
	})

	// One bad-value request per invalid header plus the others above (the
	// ttft and itl one served in its own bubble).
	if got := s.Served(); got != 1+5+3 {
		t.Fatalf("Served() = %d, want 9", got)
	}
}

func assertError(t testing.TB, body []byte, typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message *string `json:"message"`
			Type    string  `json:"type"`
			Param   any     `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type != typ || e.Error.Code != code || e.Error.Param != nil {
		t.Fatalf("error body %s, want type %q code %q", body, typ, code)
	}
	if !bytes.Contains(body, []byte(`"param":null`)) {
		t.Fatalf("error body %s lacks param:null", body)
	}
}

func TestRequestErrors(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{http.MethodPost, "/v1/chat/completions", `{"model":`, 400, "invalid_json"},
		{http.MethodPost, "/v1/chat/completions", `{"messages":[]}`, 400, "missing_model"},
		{http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":"hi"}`, 400, "invalid_messages"},
		{http.MethodPost, "/v1/completions", `{"model":"m","prompt":{"a":1}}`, 400, "invalid_prompt"},
		{http.MethodPost, "/v1/completions", `{"model":"m","max_tokens":"ten"}`, 400, "invalid_json"},
		{http.MethodGet, "/v1/chat/completions", ``, 405, "method_not_allowed"},
		{http.MethodPut, "/v1/completions", `{}`, 405, "method_not_allowed"},
	}
	for _, tc := range cases {
		resp, body := do(t, ts, tc.method, tc.path, tc.body, nil)
		if resp.StatusCode != tc.status {
			t.Fatalf("%s %s %s: status %d, want %d", tc.method, tc.path, tc.body, resp.StatusCode, tc.status)
		}
		assertError(t, body, "invalid_request_error", tc.code)
	}
	if got := s.Served(); got != int64(len(cases)) {
		t.Fatalf("Served() = %d, want %d", got, len(cases))
	}

	resp, body := do(t, ts, http.MethodPost, "/v1/models", "", nil)
	if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" {
		t.Fatalf("POST /v1/models: status %d", resp.StatusCode)
	}
	assertError(t, body, "invalid_request_error", "method_not_allowed")
	resp, body = do(t, ts, http.MethodGet, "/v1/nope", "", nil)
	if resp.StatusCode != 404 {
		t.Fatalf("unknown route: status %d", resp.StatusCode)
	}
	assertError(t, body, "invalid_request_error", "not_found")
	if got := s.Served(); got != int64(len(cases)) {
		t.Fatalf("non-completion routes counted: Served() = %d", got)
	}
}

func TestAuxiliaryRoutes(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	resp, body := do(t, ts, http.MethodGet, "/healthz", "", nil)
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("healthz: %d %q", resp.StatusCode, body)
	}
	resp, body = do(t, ts, http.MethodGet, "/v1/models", "", nil)
	want := `{"object":"list","data":[{"id":"mock-model","object":"model","created":0,"owned_by":"infergate-mock"}]}`
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
}

// A mock pool lists the models it is set to.
func TestModelsSet(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	s.SetModels("a", "org/b")
	resp, body := do(t, ts, http.MethodGet, "/v1/models", "", nil)
	want := `{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"infergate-mock"},` +
		`{"id":"org/b","object":"model","created":0,"owned_by":"infergate-mock"}]}`
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
}

func TestMetrics(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	do(t, ts, http.MethodPost, "/v1/chat/completions", chatBody, nil)
	do(t, ts, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":3}`, nil)
	do(t, ts, http.MethodPost, "/v1/completions", `nope`, nil)

	_, body := do(t, ts, http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{
		`infergate_mock_requests_total{code="200",endpoint="chat_completions",stream="true"} 1`,
		`infergate_mock_requests_total{code="200",endpoint="completions",stream="false"} 1`,
		`infergate_mock_requests_total{code="400",endpoint="completions",stream="false"} 1`,
		`infergate_mock_emit_lateness_seconds_count 12`, // chatBody streams 12 content events
		`infergate_mock_emit_lateness_seconds_bucket{le="5e-05"}`,
		`infergate_mock_active_streams 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(body), "go_goroutines") {
		t.Error("metrics leak the global registry")
	}
}

func TestLastRequest(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	if h, b := s.LastRequest(); h != nil || b != nil {
		t.Fatal("LastRequest before any request should be empty")
	}
	do(t, ts, http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"X-Tenant": "acme"})
	do(t, ts, http.MethodGet, "/healthz", "", map[string]string{"X-Tenant": "probe"})

	h, b := s.LastRequest()
	if h.Get("X-Tenant") != "acme" || string(b) != chatBody {
		t.Fatalf("LastRequest = %v %q", h, b)
	}
	// Returned values are copies.
	h.Set("X-Tenant", "changed")
	b[0] = 'X'
	if h2, b2 := s.LastRequest(); h2.Get("X-Tenant") != "acme" || string(b2) != chatBody {
		t.Fatal("LastRequest exposed internal state")
	}
}

func TestClientDisconnectStopsStream(t *testing.T) {
	_, ts := newTestServer(t, Config{TTFT: 5 * time.Millisecond, ITL: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	body := `{"model":"mock-model","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(body))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read the role chunk and the first content chunk, then leave.
	r := bufio.NewReader(resp.Body)
	for range 4 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if active := scrapeActive(t, ts); active != "1" {
		t.Fatalf("active streams %s while streaming, want 1", active)
	}
	cancel()
	resp.Body.Close()

	// The full stream would last 50s; the handler must notice promptly.
	deadline := time.Now().Add(2 * time.Second)
	for scrapeActive(t, ts) != "0" {
		if time.Now().After(deadline) {
			t.Fatal("stream still active 2s after the client left")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func scrapeActive(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	_, body := do(t, ts, http.MethodGet, "/metrics", "", nil)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, "infergate_mock_active_streams "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no active streams gauge")
	return ""
}

func TestWithDefaults(t *testing.T) {
	got := Config{}.WithDefaults()
	want := Config{TTFT: 50 * time.Millisecond, ITL: 20 * time.Millisecond, TokensPerEvent: 1, MaxTokens: 64}
	if got != want {
		t.Fatalf("WithDefaults() = %+v, want %+v", got, want)
	}
	set := Config{TTFT: time.Second, TTFTPerPromptToken: time.Millisecond, ITL: 2 * time.Second, TokensPerEvent: 4, Jitter: time.Millisecond, MaxTokens: 8}
	if set.WithDefaults() != set {
		t.Fatalf("WithDefaults overwrote set fields: %+v", set.WithDefaults())
	}
}

func BenchmarkStreamZeroDelay(b *testing.B) {
	_, ts := newTestServer(b, Config{})
	body := []byte(`{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,` +
		`"messages":[{"role":"user","content":"benchmark the gateway overhead"}]}`)
	client := ts.Client()
	b.ReportAllocs()
	for b.Loop() {
		req, err := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("x-mock-ttft-ms", "0")
		req.Header.Set("x-mock-itl-ms", "0")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d, err %v", resp.StatusCode, err)
		}
		b.SetBytes(n)
	}
}

// The ledger bills what the pool did: whole answers in full, a stream its
// client left early only for the events that were sent.
func TestUsageLedger(t *testing.T) {
	s, ts := newTestServer(t, Config{TTFT: -1, ITL: 20 * time.Millisecond})
	body := `{"model":"m","messages":[{"role":"user","content":"one two three four"}],"max_tokens":10,"stream":STREAM,"stream_options":{"include_usage":true}}`
	var reported struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	_, b := do(t, ts, http.MethodPost, "/v1/chat/completions", strings.Replace(body, "STREAM", "false", 1), nil)
	if err := json.Unmarshal(b, &reported); err != nil {
		t.Fatal(err)
	}
	want := Usage{PromptTokens: reported.Usage.PromptTokens, CompletionTokens: 10}
	if got := s.Usage(); got != want || want.PromptTokens == 0 {
		t.Fatalf("after one answer: %+v, want %+v", got, want)
	}

	do(t, ts, http.MethodPost, "/v1/chat/completions", strings.Replace(body, "STREAM", "true", 1), nil)
	want = Usage{PromptTokens: 2 * want.PromptTokens, CompletionTokens: 20}
	if got := s.Usage(); got != want {
		t.Fatalf("after a whole stream: %+v, want %+v", got, want)
	}

	// A client that leaves after three content events, in lock step: the
	// mock writes no event the client has not asked for by acknowledging
	// the one before, so what it bills cannot run ahead of the client,
	// however slow the machine.
	gate := s.Lockstep("ledger-leaver")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(strings.Replace(body, "STREAM", "true", 1)))
	req.Header.Set("x-mock-lockstep", "ledger-leaver")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for content, events := 0, 0; content < 3; {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\n" {
			gate.Ack(events)
			events++
		}
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			content++
		}
	}
	cancel()
	resp.Body.Close()
	// Once the stream's handler has seen the hang-up and ended, nothing
	// more can be billed.
	testutil.Eventually(t, 30*time.Second, func() bool { return scrape(t, s)["vllm:num_requests_running"] == 0 },
		"the stream's handler to end after its client left")
	if got := s.Usage().CompletionTokens - 20; got < 3 || got > 4 {
		t.Fatalf("a client gone after 3 events was billed %d completion tokens", got)
	}
}
