package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
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
// and the usage, exactly as the model server sent them.
func TestOpenAISDKsStreamThroughGateway(t *testing.T) {
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
			args := append(argv[1:], "--base-url", s.Envoy.URL+"/v1", "--model", "pool-b",
				"--max-tokens", "24", "--prompt", "hello from the sdk")
			out, err := exec.Command(argv[0], args...).Output()
			if err != nil {
				var stderr string
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("%s client: %v\n%s", name, err, stderr)
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
			if r.Chunks != wantChunks {
				t.Errorf("%d chunks, want %d", r.Chunks, wantChunks)
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
