package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// sdkResult is what test/clients/stream_openai.{py,mjs} print.
type sdkResult struct {
	Chunks  int    `json:"chunks"`
	Content string `json:"content"`
	Usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	FinishReason string `json:"finish_reason"`
	Error        *struct {
		Status int    `json:"status"`
		Type   string `json:"type"`
		Code   string `json:"code"`
	} `json:"error"`
}

// The official OpenAI SDKs stream through the gateway and get every chunk
// and the usage, exactly as the model server sent them, chunk by chunk: in
// lock step, each acknowledging its chunks to the mock (a stream held back
// on the way would deadlock).
func TestOpenAISDKsStreamThroughGateway(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	clients := map[string][]string{
		"python": {filepath.Join(repoRoot, ".tools", "py-venv", "bin", "python"), filepath.Join(repoRoot, "test", "clients", "stream_openai.py")},
		"node":   {"node", filepath.Join(repoRoot, "test", "clients", "stream_openai.mjs")},
	}
	const maxTokens = 24
	// What the mock streams for this prompt, read directly.
	direct := stream(t, "http://"+s.PoolB.Addr+"/v1/chat/completions",
		`{"model":"pool-b","max_tokens":24,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello from the sdk"}]}`, nil)
	var want strings.Builder
	for _, e := range contentEvents(direct.Events) {
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(e.Data), &c)
		want.WriteString(c.Choices[0].Delta.Content)
	}
	wantChunks := len(direct.Events) - 1 // all but [DONE]

	for name, argv := range clients {
		t.Run(name, func(t *testing.T) {
			id := "sdk-" + name
			gate := s.PoolB.Lockstep(id)
			defer s.PoolB.Forget(id)
			args := append(argv[1:], "--base-url", s.Envoy.URL+"/v1", "--model", "pool-b",
				"--max-tokens", "24", "--prompt", "hello from the sdk", "--lockstep", id, "--ack-url", "http://"+s.PoolB.Addr)
			// A safety timeout only: the client's start, then a stream that
			// moves as fast as the acknowledgements, or never.
			ctx, cancel := context.WithTimeout(context.Background(), 3*lockstepTimeout)
			defer cancel()
			out, err := exec.CommandContext(ctx, argv[0], args...).Output()
			if err != nil {
				var stderr string
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("%s client: %v (%d of %d events emitted: a stream held back deadlocks in lock step)\n%s",
					name, err, len(gate.Emitted()), len(direct.Events), stderr)
			}
			var r sdkResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("client output %q: %v", out, err)
			}
			if r.Error != nil {
				t.Fatalf("client got an error: %+v", *r.Error)
			}
			if r.Content != want.String() {
				t.Errorf("content %q, want %q", r.Content, want.String())
			}
			if r.Chunks != wantChunks || len(gate.Emitted()) != len(direct.Events) {
				t.Errorf("%d chunks, want %d; the mock emitted %d events in lock step, want %d", r.Chunks, wantChunks, len(gate.Emitted()), len(direct.Events))
			}
			if r.Usage == nil || r.Usage.CompletionTokens != maxTokens || r.Usage.PromptTokens == 0 {
				t.Errorf("usage = %+v, want %d completion tokens", r.Usage, maxTokens)
			}
			if r.FinishReason != "length" {
				t.Errorf("finish_reason %q", r.FinishReason)
			}
		})
	}
	// And an error the gateway writes is one the SDKs understand.
	for name, argv := range clients {
		t.Run(name+"/error", func(t *testing.T) {
			args := append(argv[1:], "--base-url", s.Envoy.URL+"/v1", "--model", " ",
				"--max-tokens", "4", "--prompt", "x")
			out, err := exec.Command(argv[0], args...).Output()
			if err != nil {
				t.Fatalf("%s client: %v", name, err)
			}
			var r sdkResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("client output %q: %v", out, err)
			}
			if r.Error == nil || r.Error.Status != 400 || r.Error.Code != "missing_model" || r.Error.Type != "invalid_request_error" {
				t.Errorf("error = %+v, want 400 missing_model", r.Error)
			}
		})
	}
}

// apiResult is what test/clients/apis_{openai.py,openai.mjs,anthropic.py}
// print.
type apiResult struct {
	RequestID string `json:"request_id"`
	Events    int    `json:"events"`
	Content   string `json:"content"`
	Usage     *struct {
		Input  int `json:"input"`
		Output int `json:"output"`
	} `json:"usage"`
	Vectors     [][]float64 `json:"vectors"`
	InputTokens *int        `json:"input_tokens"` // count_tokens
	Error       *struct {
		Status  int    `json:"status"`
		Message string `json:"message"`
	} `json:"error"`
}

// The official SDKs, pinned (test/clients), drive every API through the
// gateway, streamed and not, each in its own way: the openai SDKs (Python
// and Node) chat.completions, completions, embeddings (as each SDK asks by
// default: the Python SDK base64) and responses; the anthropic SDK
// messages.create, messages.stream and messages.count_tokens, its key in
// x-api-key. Each gets what the same SDK gets from the mock directly, and
// the meter stamps each request with its API, the usage the mock reported
// and, for a stream, a first token and one content event per token.
func TestSDKsDriveEveryAPI(t *testing.T) {
	s := startStack(t)
	python := filepath.Join(repoRoot, ".tools", "py-venv", "bin", "python")
	openaiPy := []string{python, filepath.Join(repoRoot, "test", "clients", "apis_openai.py")}
	openaiNode := []string{"node", filepath.Join(repoRoot, "test", "clients", "apis_openai.mjs")}
	anthropicPy := []string{python, filepath.Join(repoRoot, "test", "clients", "apis_anthropic.py")}
	type sdkCase struct {
		name   string
		argv   []string
		api    string // the stamp's
		stream bool
		args   []string
	}
	var cases []sdkCase
	for _, sdk := range []struct {
		name string
		argv []string
	}{{"python", openaiPy}, {"node", openaiNode}} {
		for _, api := range []string{"chat", "completions", "responses"} {
			cases = append(cases,
				sdkCase{sdk.name + "/" + api, sdk.argv, api, false, []string{"--api", api}},
				sdkCase{sdk.name + "/" + api + "/stream", sdk.argv, api, true, []string{"--api", api, "--stream"}})
		}
		cases = append(cases, sdkCase{sdk.name + "/embeddings", sdk.argv, "embeddings", false, []string{"--api", "embeddings"}})
	}
	cases = append(cases,
		sdkCase{"anthropic/messages.create", anthropicPy, "messages", false, []string{"--call", "create"}},
		sdkCase{"anthropic/messages.create/stream", anthropicPy, "messages", true, []string{"--call", "create", "--stream"}},
		sdkCase{"anthropic/messages.stream", anthropicPy, "messages", true, []string{"--call", "stream"}},
		sdkCase{"anthropic/messages.count_tokens", anthropicPy, "count_tokens", false, []string{"--call", "count_tokens"}})

	run := func(t *testing.T, c sdkCase, base string) apiResult {
		t.Helper()
		if c.argv[1] != anthropicPy[1] {
			base += "/v1" // the openai SDKs take the API's root, Anthropic's the host
		}
		prompt := "hello from the " + c.name + " sdk"
		if c.api == "embeddings" {
			prompt = "the first input|and the second one"
		}
		args := append(append(c.argv[1:len(c.argv):len(c.argv)], c.args...),
			"--base-url", base, "--model", "pool-b", "--max-tokens", "12", "--prompt", prompt)
		out, err := exec.Command(c.argv[0], args...).Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("%s: %v\n%s", c.name, err, stderr)
		}
		var r apiResult
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("client output %q: %v", out, err)
		}
		if r.Error != nil {
			t.Fatalf("%s via %s: error %+v", c.name, base, *r.Error)
		}
		return r
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := run(t, c, "http://"+s.PoolB.Addr)
			before := s.PoolB.Usage()
			got := run(t, c, s.Envoy.URL)
			ledger := s.PoolB.Usage()
			if got.Content != want.Content || got.Events != want.Events || !reflect.DeepEqual(got.Usage, want.Usage) ||
				!reflect.DeepEqual(got.InputTokens, want.InputTokens) || !reflect.DeepEqual(got.Vectors, want.Vectors) {
				t.Errorf("through the gateway: %d events, content %q, usage %+v, count %v, %d vectors\n"+
					"                 direct: %d events, content %q, usage %+v, count %v, %d vectors",
					got.Events, got.Content, got.Usage, got.InputTokens, len(got.Vectors),
					want.Events, want.Content, want.Usage, want.InputTokens, len(want.Vectors))
			}
			if c.api == "embeddings" {
				if len(got.Vectors) != 2 || len(got.Vectors[0]) == 0 {
					t.Errorf("%d vectors", len(got.Vectors))
				}
				// The SDKs ask for base64 by default, and decode it.
				if _, body := s.PoolB.LastRequest(); !strings.Contains(string(body), `"encoding_format":"base64"`) {
					t.Errorf("the request the pool got: %s", body)
				}
			}
			if got.RequestID == "" {
				t.Fatal("no x-request-id in the response")
			}
			st := s.Gateway.stamp(t, got.RequestID)
			if st.API != c.api || st.Status != 200 || !st.Complete || st.Stream != c.stream {
				t.Errorf("stamp: api %q, status %d, complete %v, stream %v", st.API, st.Status, st.Complete, st.Stream)
			}
			switch {
			case c.api == "count_tokens":
				if got.InputTokens == nil || st.PromptTokens != *got.InputTokens || st.ContentEvents != 0 {
					t.Errorf("stamp: %d prompt tokens, %d content events; the count is %v", st.PromptTokens, st.ContentEvents, got.InputTokens)
				}
			case got.Usage == nil:
				t.Errorf("no usage")
			default:
				if st.PromptTokens != got.Usage.Input || st.CompletionTokens != got.Usage.Output || st.TokenSource != "usage" {
					t.Errorf("stamp tokens %d + %d (%s), the usage %+v", st.PromptTokens, st.CompletionTokens, st.TokenSource, *got.Usage)
				}
				// The mock's ledger: what it billed for this request.
				if d := ledger.PromptTokens - before.PromptTokens; int(d) != st.PromptTokens {
					t.Errorf("the mock billed %d prompt tokens, the stamp says %d", d, st.PromptTokens)
				}
				if d := ledger.CompletionTokens - before.CompletionTokens; int(d) != st.CompletionTokens {
					t.Errorf("the mock billed %d completion tokens, the stamp says %d", d, st.CompletionTokens)
				}
			}
			switch {
			case c.stream:
				// ITL may be 0: a starved Envoy can pass several events in
				// one chunk, which the meter then sees together (its timing
				// is proven by the lock-step and stamp-clock tests).
				if st.TTFTms <= 0 || st.ContentEvents != st.CompletionTokens || st.ITLP50ms < 0 {
					t.Errorf("stream stamp: TTFT %.3fms, %d content events for %d tokens, ITL p50 %.3fms, timing %s", st.TTFTms, st.ContentEvents, st.CompletionTokens, st.ITLP50ms, st.Timing)
				}
			case c.api == "embeddings" || c.api == "count_tokens":
				if st.TTFTms != 0 || st.ContentEvents != 0 || st.E2Ems <= 0 {
					t.Errorf("stamp: TTFT %.3fms, %d content events, E2E %.3fms; want no first token, a duration", st.TTFTms, st.ContentEvents, st.E2Ems)
				}
			default:
				if st.TTFTms != st.E2Ems || st.ContentEvents != 1 {
					t.Errorf("stamp: TTFT %.3fms, E2E %.3fms, %d content events", st.TTFTms, st.E2Ems, st.ContentEvents)
				}
			}
		})
	}
}
