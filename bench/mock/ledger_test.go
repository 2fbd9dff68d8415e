package mock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitLedger polls until account has no open request and returns it.
func waitLedger(t *testing.T, s *Server, account string) LedgerAccount {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if a, ok := s.Ledger()[account]; ok && a.Open == 0 {
			return a
		}
	}
	t.Fatalf("account %q still has open requests: %+v", account, s.Ledger()[account])
	return LedgerAccount{}
}

// The ledger books, per account, the prompt and the output of every
// request: whole when it ran to its end, streamed or not.
func TestLedgerBooksWhatWasGenerated(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	hdr := map[string]string{ledgerHeader: "a"}
	for _, body := range []string{
		`{"model":"m","max_tokens":7,"stream":true,"messages":[{"role":"user","content":"one two three"}]}`,
		`{"model":"m","max_tokens":5,"prompt":"one two three"}`,
		`{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"one two three"}]}`,
		`{"model":"m","input":"one two three"}`,
	} {
		path := "/v1/chat/completions"
		switch {
		case strings.Contains(body, `"prompt"`):
			path = "/v1/completions"
		case strings.Contains(body, `"input"`):
			path = "/v1/embeddings"
		}
		if resp, b := do(t, ts, http.MethodPost, path, body, hdr); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":3,"messages":[]}`, nil) // no account
	want := LedgerAccount{Requests: 4, PromptTokens: 12, OutputTokens: 7 + 5 + 4}
	if got := waitLedger(t, s, "a"); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
	if len(s.Ledger()) != 1 {
		t.Errorf("accounts %v, want only a", s.Ledger())
	}
	resp, b := do(t, ts, http.MethodGet, "/mock/ledger", "", nil)
	var got map[string]LedgerAccount
	if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got["a"] != want {
		t.Errorf("GET /mock/ledger: %d %s", resp.StatusCode, b)
	}
}

// A non-streamed request whose client leaves mid-generation is booked the
// tokens decoded until then, although no byte of it was sent.
func TestLedgerBooksACancelledGeneration(t *testing.T) {
	s, ts := newTestServer(t, Config{TTFT: -1, ITL: time.Millisecond})
	const tokens = 1_000_000 // over a quarter of an hour: the client leaves long before
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","max_tokens":1000000,"messages":[{"role":"user","content":"one two"}]}`))
	req.Header.Set(ledgerHeader, "gone")
	done := make(chan error, 1)
	go func() {
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// Leave once the prompt is in (prefilled): the first token is due then.
	for s.engine.kvTokens.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("request ended with %v, want it cancelled", err)
	}
	got := waitLedger(t, s, "gone")
	if got.Requests != 1 || got.PromptTokens != 2 || got.OutputTokens < 1 || got.OutputTokens >= tokens {
		t.Errorf("ledger %+v, want the prompt (2) and the tokens decoded before the hang-up", got)
	}
}

// Background responses answer queued, with no usage, and the ledger books
// the whole generation that follows.
func TestLedgerBooksBackgroundResponses(t *testing.T) {
	s, ts := newTestServer(t, Config{TTFT: -1, ITL: time.Millisecond})
	resp, b := do(t, ts, http.MethodPost, "/v1/responses",
		`{"model":"m","background":true,"max_output_tokens":50,"input":"one two three"}`, map[string]string{ledgerHeader: "bg"})
	var r struct {
		Status string          `json:"status"`
		Usage  json.RawMessage `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &r) != nil || r.Status != "queued" || string(r.Usage) != "null" {
		t.Fatalf("answer %d %s, want queued without usage", resp.StatusCode, b)
	}
	if got, want := waitLedger(t, s, "bg"), (LedgerAccount{Requests: 1, PromptTokens: 3, OutputTokens: 50}); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
}

// prompt_logprobs come after usage, as vLLM writes them, and
// x-mock-output-cap: largest makes the largest cap the output.
func TestPromptLogprobsAndLargestCap(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	prompt := strings.Repeat("word ", 200)
	resp, b := do(t, ts, http.MethodPost, "/v1/completions",
		`{"model":"m","max_tokens":9,"max_completion_tokens":2,"prompt_logprobs":20,"prompt":"`+prompt+`"}`,
		map[string]string{ledgerHeader: "lp", "x-mock-output-cap": "largest"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	u, lp := bytes.Index(b, []byte(`"usage"`)), bytes.Index(b, []byte(`"prompt_logprobs"`))
	if u < 0 || lp < u || len(b)-lp < 64<<10 {
		t.Errorf("usage at %d, prompt_logprobs at %d of %d bytes: want more than 64 KiB after usage", u, lp, len(b))
	}
	if got := waitLedger(t, s, "lp"); got.OutputTokens != 9 {
		t.Errorf("output %d, want the largest cap 9", got.OutputTokens)
	}
	if resp, _ := do(t, ts, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"x"}`,
		map[string]string{"x-mock-output-cap": "smallest"}); resp.StatusCode != 400 {
		t.Errorf("x-mock-output-cap: smallest answered %d, want 400", resp.StatusCode)
	}
}

// n choices write every token n times, each choice's events apart, and
// usage and the ledger count them all.
func TestChoicesAreGeneratedAndBooked(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	hdr := map[string]string{ledgerHeader: "n"}
	resp, b := do(t, ts, http.MethodPost, "/v1/chat/completions",
		`{"model":"m","n":3,"max_tokens":4,"messages":[{"role":"user","content":"one two"}]}`, hdr)
	var full struct {
		Choices []struct {
			Index int `json:"index"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &full) != nil || len(full.Choices) != 3 || full.Choices[2].Index != 2 ||
		full.Usage.CompletionTokens != 12 {
		t.Fatalf("n=3: %d %s, want 3 choices and 12 completion tokens", resp.StatusCode, b)
	}
	events, _ := streamRequest(t, ts, "/v1/completions",
		`{"model":"m","n":2,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"prompt":"one two"}`, hdr)
	perChoice := map[int]int{}
	for _, e := range events {
		var c struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(e.data), &c) == nil && len(c.Choices) == 1 && c.Choices[0].Text != "" {
			perChoice[c.Choices[0].Index]++
		}
	}
	if perChoice[0] != 5 || perChoice[1] != 5 {
		t.Errorf("content events per choice %v, want 5 each", perChoice)
	}
	if got := waitLedger(t, s, "n"); got.OutputTokens != 12+10 {
		t.Errorf("ledger output %d, want 22", got.OutputTokens)
	}
}
