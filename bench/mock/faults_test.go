package mock

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// goldenCases pin the default output byte for byte: the digests were taken
// before the capacity model, faults and timestamps were added, and must not
// move, since end-to-end tests compare gateway bodies against these bytes.
var goldenCases = []struct {
	name, path, body string
	hdr              map[string]string
	sha256           string
}{
	{"chat stream with usage", "/v1/chat/completions",
		`{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"user","content":"hello there mock"}]}`,
		nil, "52ac6fb32358733b405e4011720e3e2065fe679c92fa22431238056d17730722"},
	{"chat stream, 3 tokens per event", "/v1/chat/completions",
		`{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"x y"}]}`,
		map[string]string{"x-mock-tokens-per-event": "3"}, "aa979b55726313a629a2c371132ff01fa7a6ae602b067306d7d42d0252d83780"},
	{"text stream", "/v1/completions", `{"model":"mock-model","stream":true,"max_tokens":7,"prompt":"one two three"}`,
		nil, "81052188760a2b2970a7ed5eaf3e1e27ffa759fe386c52320fb0664f7ccf587a"},
	{"chat completion", "/v1/chat/completions", `{"model":"mock-model","max_tokens":9,"messages":[{"role":"user","content":"a b c d"}]}`,
		nil, "5373682a8bc82a4732e10af7c1a8cc59eceb7c14a1029d91c22dbcaa269d4584"},
	{"text completion", "/v1/completions", `{"model":"mock-model","prompt":["a b","c d"]}`,
		nil, "8384546fd69c64f8b1e294bd5ecb6b0b252314c85a49c9f80802451343b0cb7c"},
	{"injected 429", "/v1/chat/completions", `{"model":"mock-model","messages":[]}`,
		map[string]string{"x-mock-status": "429"}, "8ed3cadb26375e0f66a0b1b7074628139560dc4ee12249f99b8af3f804af3523"},
	// The other APIs, pinned when they were added.
	{"responses stream", "/v1/responses",
		`{"model":"mock-model","stream":true,"instructions":"be brief","max_output_tokens":6,"input":[{"role":"user","content":"hello there mock"}]}`,
		nil, "9df31663535c1fe8fc4c8063a13eba41c5bfdf441866e9f2af9c4ed698a61ca5"},
	{"response", "/v1/responses", `{"model":"mock-model","max_output_tokens":6,"input":"hello there mock"}`,
		nil, "4931f275854187cd935bc546709c4a88001d4a8fe206c30ab664bb5957ca5f39"},
	{"messages stream", "/v1/messages",
		`{"model":"mock-model","stream":true,"max_tokens":6,"system":"be brief","messages":[{"role":"user","content":"hello there mock"}]}`,
		nil, "6a2291a2924a52414ac43b6daeb6e1f7e13d8eab8040e7bebed7927498a69989"},
	{"message", "/v1/messages", `{"model":"mock-model","max_tokens":6,"messages":[{"role":"user","content":[{"type":"text","text":"hello there mock"}]}]}`,
		nil, "52659f545cdcf052901b3fa701895be9852c54574d1113d35c17deadab9366d2"},
	{"count tokens", "/v1/messages/count_tokens", `{"model":"mock-model","messages":[{"role":"user","content":"hello there mock"}]}`,
		nil, "95c2678666295e06d8daf59ad3dc0e0ab9e4675fc217bc3df67545f1eb6933a1"},
	{"embeddings", "/v1/embeddings", `{"model":"mock-model","input":["hello there","mock"],"dimensions":8}`,
		nil, "ebc40a828b3f70a144315249430d01d9169bfb2caf8b1f7dd44c5d5ab8211041"},
	{"embeddings base64", "/v1/embeddings", `{"model":"mock-model","input":[[1,2],[3]],"dimensions":8,"encoding_format":"base64"}`,
		nil, "a138898b3569a00cda89fc016fbca03006b98773df0f562ea8ef26d67122b542"},
	{"messages injected 529", "/v1/messages", `{"model":"mock-model","messages":[]}`,
		map[string]string{"x-mock-status": "529"}, "18a036faa2f116429ba8786571d628b637231c226588d1e2fc409426b90b2321"},
}

func TestGoldenBytes(t *testing.T) {
	// The capacity model on, without limits that bite, changes no byte either.
	for _, cfg := range []Config{noDelay(), {TTFT: -1, ITL: -1, MaxBatch: 64, ITLPerBatch: time.Nanosecond, PrefixCacheTokens: 4096}} {
		_, ts := newTestServer(t, cfg)
		for _, tc := range goldenCases {
			_, body := do(t, ts, http.MethodPost, tc.path, tc.body, tc.hdr)
			if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != tc.sha256 {
				t.Errorf("%s (%+v): body changed:\n%s", tc.name, cfg, body)
			}
		}
	}
}

var stampLine = regexp.MustCompile(`^: t=(\d+) seq=(\d+)\n$`)

func TestEmitTimestamps(t *testing.T) {
	s, ts := newTestServer(t, Config{TTFT: -1, ITL: time.Millisecond})
	body := `{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	_, plain := do(t, ts, http.MethodPost, "/v1/chat/completions", body, nil)

	check := func(t *testing.T, hdr map[string]string) {
		t.Helper()
		before := time.Now().UnixNano()
		_, stamped := do(t, ts, http.MethodPost, "/v1/chat/completions", body, hdr)
		after := time.Now().UnixNano()
		var rest strings.Builder
		last, seq := before, 0
		r := bufio.NewReader(strings.NewReader(string(stamped)))
		for {
			line, err := r.ReadString('\n')
			if err == io.EOF {
				break
			}
			if line == "\n" {
				rest.WriteString(line)
				continue
			}
			m := stampLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("event without a stamp first: %q", line)
			}
			at, _ := strconv.ParseInt(m[1], 10, 64)
			if at < last || at > after {
				t.Fatalf("stamp %d outside [%d, %d]", at, last, after)
			}
			if m[2] != strconv.Itoa(seq) {
				t.Fatalf("seq %s, want %d", m[2], seq)
			}
			last, seq = at, seq+1
			data, _ := r.ReadString('\n')
			if !strings.HasPrefix(data, "data: ") {
				t.Fatalf("stamp not followed by data: %q", data)
			}
			rest.WriteString(data)
		}
		if seq != 1+5+1+1+1 { // role, content, finish, usage, [DONE]
			t.Fatalf("%d stamped events, want 9", seq)
		}
		if rest.String() != string(plain) {
			t.Fatalf("without stamps the stream differs:\n%s\n%s", rest.String(), plain)
		}
	}
	t.Run("header", func(t *testing.T) { check(t, map[string]string{"x-mock-emit-timestamps": "1"}) })

	cfg := s.Config()
	cfg.EmitTimestamps = true
	s.SetConfig(cfg)
	t.Run("config", func(t *testing.T) { check(t, nil) })
	if _, b := do(t, ts, http.MethodPost, "/v1/chat/completions", body, map[string]string{"x-mock-emit-timestamps": "0"}); string(b) != string(plain) {
		t.Fatal("x-mock-emit-timestamps: 0 did not turn stamps off")
	}
}

func TestRetryAfter(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	body := `{"model":"mock-model","max_tokens":1,"messages":[]}`
	for _, tc := range []struct {
		hdr  map[string]string
		want string
	}{
		{map[string]string{"x-mock-status": "429"}, "1"},
		{map[string]string{"x-mock-status": "429", "x-mock-retry-after-ms": "2500"}, "3"},
		{map[string]string{"x-mock-status": "503"}, ""},
		{map[string]string{"x-mock-status": "503", "x-mock-retry-after-ms": "1000"}, "1"},
	} {
		resp, _ := do(t, ts, http.MethodPost, "/v1/chat/completions", body, tc.hdr)
		if got := resp.Header.Get("Retry-After"); got != tc.want {
			t.Errorf("%v: Retry-After %q, want %q", tc.hdr, got, tc.want)
		}
	}
	s.SetFaults(Faults{ErrorRate: 1, ErrorStatus: 503, RetryAfter: 4 * time.Second})
	if resp, _ := do(t, ts, http.MethodPost, "/v1/chat/completions", body, nil); resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "4" {
		t.Errorf("Faults.RetryAfter: status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestStall(t *testing.T) {
	body := streamBody(6, "hi")
	cases := []struct {
		name   string
		faults Faults
		hdr    map[string]string
	}{
		{"header", Faults{}, map[string]string{"x-mock-stall-after": "3", "x-mock-stall-ms": "100"}},
		{"faults", Faults{StallAfter: 3, Stall: ms(100)}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := New(Config{TTFT: ms(10), ITL: ms(10)}, nil)
				s.SetFaults(tc.faults)
				start := time.Now()
				rec, done := call(t.Context(), s, "/v1/chat/completions", body, tc.hdr)
				<-done
				// The tokens after the third shift by the stall.
				got := contentTimes(t, rec, start)
				want := []time.Duration{ms(10), ms(20), ms(30), ms(140), ms(150), ms(160)}
				if len(got) != len(want) {
					t.Fatalf("content at %v, want %v", got, want)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("content at %v, want %v", got, want)
					}
				}
			})
		})
	}
	t.Run("after the last token", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := New(Config{TTFT: ms(10), ITL: ms(10)}, nil)
			start := time.Now()
			rec, done := call(t.Context(), s, "/v1/chat/completions", streamBody(3, "hi"),
				map[string]string{"x-mock-stall-after": "3", "x-mock-stall-ms": "100"})
			<-done
			_, writes := rec.snapshot()
			if last := writes[len(writes)-1]; last.data != "data: [DONE]\n\n" || last.at.Sub(start) != ms(130) {
				t.Fatalf("[DONE] at %v (%q), want 130ms", last.at.Sub(start), last.data)
			}
		})
	})
	t.Run("non-streaming", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := New(Config{TTFT: ms(10), ITL: ms(10)}, nil)
			start := time.Now()
			rec, done := call(t.Context(), s, "/v1/chat/completions",
				`{"model":"mock-model","max_tokens":6,"messages":[]}`, map[string]string{"x-mock-stall-after": "2", "x-mock-stall-ms": "100"})
			<-done
			if _, writes := rec.snapshot(); writes[0].at.Sub(start) != ms(160) {
				t.Fatalf("response at %v, want 160ms", writes[0].at.Sub(start))
			}
		})
	})
}

func TestResetTruncatesResponse(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	read := func(t *testing.T, body string, hdr map[string]string) (string, error) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	check := func(t *testing.T, hdr map[string]string) {
		t.Helper()
		got, err := read(t, streamBody(10, "hi"), hdr)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("read error %v, want unexpected EOF", err)
		}
		// The role chunk and three content events, then nothing.
		if n := strings.Count(got, "data: "); n != 4 || strings.Contains(got, "[DONE]") || !strings.HasSuffix(got, "\n\n") {
			t.Fatalf("%d events before the reset, want 4:\n%s", n, got)
		}
	}
	t.Run("header", func(t *testing.T) { check(t, map[string]string{"x-mock-reset-after": "3"}) })
	t.Run("faults", func(t *testing.T) {
		s.SetFaults(Faults{ResetAfter: 3})
		defer s.SetFaults(Faults{})
		check(t, nil)
		// A request can opt out of a server-wide fault.
		if _, err := read(t, streamBody(10, "hi"), map[string]string{"x-mock-reset-after": "0"}); err != nil {
			t.Fatalf("opted out, still: %v", err)
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		_, err := read(t, `{"model":"mock-model","max_tokens":5,"messages":[]}`, map[string]string{"x-mock-reset-after": "2"})
		if err == nil {
			t.Fatal("non-streaming reset returned a response")
		}
	})
	t.Run("past the end", func(t *testing.T) {
		if _, err := read(t, streamBody(3, "hi"), map[string]string{"x-mock-reset-after": "4"}); err != nil {
			t.Fatalf("reset after the last token fired: %v", err)
		}
	})
	// The aborted streams ended their bookkeeping before the connection went.
	if got := scrape(t, s)["infergate_mock_active_streams"]; got != 0 {
		t.Errorf("active streams %v after resets", got)
	}
}

func TestMalformedEvent(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	_, plain := do(t, ts, http.MethodPost, "/v1/chat/completions", streamBody(5, "hi"), nil)
	check := func(t *testing.T, hdr map[string]string) {
		t.Helper()
		_, b := do(t, ts, http.MethodPost, "/v1/chat/completions", streamBody(5, "hi"), hdr)
		events := strings.SplitAfter(string(b), "\n\n")
		broken := 1 + 2 // after the role chunk and two content events
		if !strings.HasPrefix(events[broken], "data: {") || json.Valid([]byte(strings.TrimPrefix(strings.TrimSpace(events[broken]), "data: "))) {
			t.Fatalf("event %d is not malformed: %q", broken, events[broken])
		}
		// Everything else is the normal stream.
		if rest := strings.Join(append(events[:broken:broken], events[broken+1:]...), ""); rest != string(plain) {
			t.Fatalf("the stream around the broken event changed:\n%s", b)
		}
	}
	t.Run("header", func(t *testing.T) { check(t, map[string]string{"x-mock-malformed-after": "2"}) })
	t.Run("faults", func(t *testing.T) {
		s.SetFaults(Faults{MalformedAfter: 2})
		defer s.SetFaults(Faults{})
		check(t, nil)
	})
	t.Run("non-streaming", func(t *testing.T) {
		resp, b := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"mock-model","max_tokens":5,"messages":[]}`,
			map[string]string{"x-mock-malformed-after": "5"})
		if resp.StatusCode != 200 || len(b) == 0 || json.Valid(b) {
			t.Fatalf("status %d, body %q: want a truncated JSON body", resp.StatusCode, b)
		}
	})
}

func TestFaultHeadersValidated(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	for _, h := range []map[string]string{
		{"x-mock-stall-after": "-1"},
		{"x-mock-stall-ms": "soon"},
		{"x-mock-reset-after": "x"},
		{"x-mock-malformed-after": "1.5"},
		{"x-mock-retry-after-ms": "-5"},
		{"x-mock-emit-timestamps": "maybe"},
	} {
		resp, body := do(t, ts, http.MethodPost, "/v1/chat/completions", streamBody(2, "hi"), h)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%v: status %d, want 400", h, resp.StatusCode)
		}
		assertError(t, body, "invalid_request_error", "invalid_header")
	}
}

func TestControlCapacityAndFaults(t *testing.T) {
	m, ts := newTestServer(t, Config{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond})
	resp, body := do(t, ts, http.MethodPost, "/mock/control", `{"max_batch": 4, "max_queue": -1, "itl_per_batch_ms": 2.5,
		"kv_cache_tokens": 1000, "prefix_cache_tokens": 320, "emit_timestamps": true,
		"retry_after_ms": 2000, "stall_after": 3, "stall_ms": 50, "reset_after": 7, "malformed_after": 5}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	c, f := m.Config(), m.Faults()
	if c.MaxBatch != 4 || c.MaxQueue != -1 || c.ITLPerBatch != 2500*time.Microsecond || c.KVCacheTokens != 1000 ||
		c.PrefixCacheTokens != 320 || !c.EmitTimestamps || c.TTFT != 30*time.Millisecond {
		t.Errorf("config after control: %+v", c)
	}
	if f.RetryAfter != 2*time.Second || f.StallAfter != 3 || f.Stall != 50*time.Millisecond || f.ResetAfter != 7 ||
		f.MalformedAfter != 5 || f.ErrorStatus != 503 {
		t.Errorf("faults after control: %+v", f)
	}
	if m.engine.cache.Load() == nil || m.engine.cache.Load().capacity != 20 {
		t.Error("prefix cache not sized to 20 blocks")
	}

	// GET reports everything; zero turns a fault back off.
	do(t, ts, http.MethodPost, "/mock/control", `{"reset_after": 0, "max_batch": 0}`, nil)
	_, body = do(t, ts, http.MethodGet, "/mock/control", "", nil)
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"reset_after": 0.0, "max_batch": 0.0, "stall_after": 3.0, "itl_per_batch_ms": 2.5,
		"emit_timestamps": true, "retry_after_ms": 2000.0, "ttft_ms": 30.0} {
		if got[k] != v {
			t.Errorf("GET %s = %v, want %v", k, got[k], v)
		}
	}
}
