package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestAPIOf(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions":             APIChat,
		"/v1/completions":                  APICompletions,
		"/v1/embeddings":                   APIEmbeddings,
		"/v1/responses":                    APIResponses,
		"/v1/messages":                     APIMessages,
		"/v1/messages/count_tokens":        APICountTokens,
		"/openai/v1/chat/completions":      APIChat,
		"/anthropic/v1/messages":           APIMessages,
		"/v1/models":                       "",
		"/v1/responses/resp_1":             "",
		"/v1/messages/batches":             "",
		"/v1/threads/t1/messages":          "",
		"/v1/audio/speech":                 "",
		"/":                                "",
		"":                                 "",
		"/v1/chat/completions/extra":       "",
		"/v1/messages/count_tokens/extras": "",
	} {
		if got := APIOf(path); got != want {
			t.Errorf("APIOf(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestAPIOperation(t *testing.T) {
	for api, want := range map[API]string{
		APIChat: "chat", APICompletions: "text_completion", APIEmbeddings: "embeddings",
		APIResponses: "chat", APIMessages: "chat", APICountTokens: "count_tokens", "": "",
	} {
		if got := api.Operation(); got != want {
			t.Errorf("%q.Operation() = %q, want %q", api, got, want)
		}
	}
}

// parserInvariants are what every body parser promises, whatever it is
// fed: a refusal for depth exactly when the body nests too deep, errors of
// the documented kinds with a zero Request, and for an accepted body a JSON
// object with a model, counts that are not negative, and the same Request
// however the client formats it.
func parserInvariants(t *testing.T, parse func([]byte) (Request, error), body []byte) (Request, bool) {
	t.Helper()
	r, err := parse(body)
	if errors.Is(err, ErrTooDeep) != (nesting(body) > MaxDepth) {
		t.Fatalf("parse(%q) = %v, but it nests %d levels", body, err, nesting(body))
	}
	if err != nil {
		if !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrMissingModel) && !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrTooDeep) {
			t.Fatalf("parse(%q): unexpected error kind %T %v", body, err, err)
		}
		if !reflect.DeepEqual(r, Request{}) {
			t.Fatalf("parse(%q) returned %+v with error %v", body, r, err)
		}
		return r, false
	}
	if !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
		t.Fatalf("parse accepted %q, which is not a JSON object", body)
	}
	if strings.TrimSpace(r.Model) == "" {
		t.Fatalf("parse(%q): empty model accepted", body)
	}
	if r.MaxTokens < 0 || r.PromptChars < 0 || r.PromptTokens < EstimateTokens(r.PromptChars) || r.Choices != 1 || r.Dimensions < 0 {
		t.Fatalf("parse(%q) = %+v", body, r)
	}
	var compact bytes.Buffer
	if json.Compact(&compact, body) == nil {
		c, err := parse(compact.Bytes())
		sameBound(&c, &r, len(body)-compact.Len())
		if err != nil || !reflect.DeepEqual(c, r) {
			t.Fatalf("parse(%q) = %+v\ncompacted: %+v, %v", body, r, c, err)
		}
	}
	return r, true
}

// wantParseError checks a refusal names the field a client must fix.
func wantParseError(t *testing.T, body string, err error, param string) {
	t.Helper()
	var fe *FieldError
	switch {
	case param == "" && err == nil:
		t.Errorf("%s: accepted", body)
	case param == "":
	case !errors.As(err, &fe):
		t.Errorf("%s: error %v, want one about %s", body, err, param)
	case fe.Param != param:
		t.Errorf("%s: error about %s (%v), want %s", body, fe.Param, err, param)
	}
}

// Every API reads as its output cap the largest of the keys its servers
// may read, and refuses a cap key of another API (see ParseResponses,
// ParseMessages): nothing a pool may read as a cap escapes the
// reservation.
func TestOutputCaps(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		api     API
		body    string
		want    int
		refused string // the Param of the refusal
	}{
		{APIChat, `{"model":"m","max_completion_tokens":1,"max_tokens":50000,` + msgs + `}`, 50000, ""},
		{APIChat, `{"model":"m","max_tokens":1,"max_completion_tokens":50000,` + msgs + `}`, 50000, ""},
		{APIChat, `{"model":"m","max_tokens":null,"max_completion_tokens":9,` + msgs + `}`, 9, ""},
		{APICompletions, `{"model":"m","prompt":"hi","max_completion_tokens":1,"max_tokens":50000}`, 50000, ""},
		{APICompletions, `{"model":"m","prompt":"hi","max_tokens":1,"max_completion_tokens":50000}`, 50000, ""},
		{APIResponses, `{"model":"m","input":"hi","max_output_tokens":1}`, 1, ""},
		{APIResponses, `{"model":"m","input":"hi","max_output_tokens":1,"max_tokens":50000}`, 0, "max_tokens"},
		{APIResponses, `{"model":"m","input":"hi","max_output_tokens":1,"max_completion_tokens":50000}`, 0, "max_completion_tokens"},
		{APIMessages, `{"model":"m","max_tokens":1,` + msgs + `}`, 1, ""},
		{APIMessages, `{"model":"m","max_tokens":1,"max_completion_tokens":50000,` + msgs + `}`, 0, "max_completion_tokens"},
		{APIMessages, `{"model":"m","max_tokens":1,"max_output_tokens":50000,` + msgs + `}`, 0, "max_output_tokens"},
	} {
		r, err := Parse(tc.api, []byte(tc.body))
		if tc.refused != "" {
			wantParseError(t, tc.body, err, tc.refused)
			continue
		}
		if err != nil || r.MaxTokens != tc.want {
			t.Errorf("%s %s: MaxTokens %d, %v; want %d", tc.api, tc.body, r.MaxTokens, err, tc.want)
		}
	}
}

// A parser allocates only the strings it keeps (the model, a response's
// previous_response_id): the estimate's error paths stay off the heap.
func TestParsersAllocate(t *testing.T) {
	for _, tc := range []struct {
		api  API
		body string
		want float64
	}{
		{APIChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"u"}}]}]}`, 1},
		{APIEmbeddings, `{"model":"m","input":["a","b"]}`, 1},
		{APIResponses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"previous_response_id":"r"}`, 2},
		{APIMessages, `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"x"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"a"}]}]}]}`, 1},
		{APICountTokens, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 1},
	} {
		body := []byte(tc.body)
		if _, err := Parse(tc.api, body); err != nil {
			t.Fatalf("%s: %v", tc.api, err)
		}
		if n := testing.AllocsPerRun(100, func() { Parse(tc.api, body) }); n > tc.want {
			t.Errorf("%s: %.0f allocations, want %.0f", tc.api, n, tc.want)
		}
	}
}

// sameBound checks that a body's bound on its input (MaxPromptTokens) is
// never below its estimate and that the bound of its compacted form, of
// removed bytes fewer, differs by at most those bytes; then it sets c's
// to r's, so the requests compare equal otherwise.
func sameBound(c, r *Request, removed int) {
	if r.MaxPromptTokens != 0 && r.MaxPromptTokens < r.PromptTokens ||
		(c.MaxPromptTokens == 0) != (r.MaxPromptTokens == 0) ||
		r.MaxPromptTokens < c.MaxPromptTokens || r.MaxPromptTokens > c.MaxPromptTokens+removed {
		return // left unequal: the caller reports both
	}
	c.MaxPromptTokens = r.MaxPromptTokens
}
