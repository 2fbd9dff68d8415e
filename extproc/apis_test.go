package extproc

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/request"
)

// recordingPolicy admits every request with policy's verdict, and keeps
// the admissions it was asked about.
type recordingPolicy struct {
	verdict request.Verdict
	asked   []*request.Admission
}

func (p *recordingPolicy) Identify(context.Context, *request.Admission) request.Verdict {
	return request.Verdict{}
}

func (p *recordingPolicy) Decide(_ context.Context, a *request.Admission) request.Verdict {
	p.asked = append(p.asked, a)
	return p.verdict
}

func (p *recordingPolicy) Settle(context.Context, *request.Settlement) {}

func (p *recordingPolicy) Release(context.Context, string, string) {}

func apiHeaders(path string, extra ...string) []string {
	return append([]string{":method", "POST", ":path", path, "content-type", "application/json", "x-request-id", "req-1"}, extra...)
}

// through sends one request through the gate in one-round-trip mode.
func through(s *Server, hdrs []string, body string) []*extprocv3.ProcessingResponse {
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, hdrs...))
	return s.gateStep(context.Background(), g, bodyMsg(body, true))
}

func setHeaders(out []*extprocv3.ProcessingResponse) map[string]string {
	set := map[string]string{}
	for _, h := range out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return set
}

// Each API the gate parses is admitted with its routing header, its API on
// the admission and in the metadata, and what its reservation reads: the
// estimated input, the output cap its body names, whether it streams. Only
// chat and text completion streams are asked for usage: the others report
// it unasked.
func TestGateAdmitsEachAPI(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		api        openai.API
		maxTokens  int
		stream     bool
		usageAsked bool
	}{
		{"/v1/chat/completions", `{"model":"m1","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, openai.APIChat, 50, true, true},
		{"/v1/completions", `{"model":"m1","stream":true,"prompt":"hi"}`, openai.APICompletions, 0, true, true},
		{"/v1/embeddings", `{"model":"m1","input":["a","b"],"dimensions":64}`, openai.APIEmbeddings, 0, false, false},
		{"/v1/responses", `{"model":"m1","stream":true,"max_output_tokens":70,"input":"hi","previous_response_id":"resp_1"}`, openai.APIResponses, 70, true, false},
		{"/v1/messages", `{"model":"m1","stream":true,"max_tokens":90,"messages":[{"role":"user","content":"hi"}]}`, openai.APIMessages, 90, true, false},
		{"/v1/messages/count_tokens", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, openai.APICountTokens, 0, false, false},
	} {
		t.Run(string(tc.api), func(t *testing.T) {
			s, _ := newTestServer(t, "")
			p := &recordingPolicy{verdict: request.Verdict{Reservation: "r-1"}}
			s.policy = p
			out := through(s, apiHeaders(tc.path), tc.body)
			if len(out) != 2 || out[0].GetRequestHeaders() == nil {
				t.Fatalf("answers %v, want headers and the body chunk", out)
			}
			if got := setHeaders(out)[request.ModelHeader]; got != "m1" {
				t.Errorf("%s = %q, want m1", request.ModelHeader, got)
			}
			a := p.asked[0]
			want, _ := openai.Parse(tc.api, []byte(tc.body))
			if !a.Completion || a.API != tc.api || a.Request != want || a.PromptTokens != want.PromptTokens || a.PromptTokens == 0 {
				t.Errorf("admission: API %q, request %+v, prompt tokens %d; want %q, %+v", a.API, a.Request, a.PromptTokens, tc.api, want)
			}
			if a.Request.MaxTokens != tc.maxTokens || a.Request.Stream != tc.stream {
				t.Errorf("max tokens %d, stream %v; want %d, %v", a.Request.MaxTokens, a.Request.Stream, tc.maxTokens, tc.stream)
			}
			body := out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody()
			if asked := strings.Contains(string(body), "include_usage"); asked != tc.usageAsked {
				t.Errorf("usage asked for: %v, want %v (body %s)", asked, tc.usageAsked, body)
			}
			md := out[0].GetDynamicMetadata().GetFields()[request.MetadataNamespace].GetStructValue().GetFields()
			if md["api"].GetStringValue() != string(tc.api) || md["reservation"].GetStringValue() != "r-1" {
				t.Errorf("metadata %v", md)
			}
		})
	}
}

// The policy's cap goes upstream in the key each API reads; an embedding
// or a token count writes nothing, so its body is never given one.
func TestGateCapsEachAPIsOutput(t *testing.T) {
	for _, tc := range []struct {
		path, body, want string
	}{
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":5000}`, `{"model":"m","input":"hi","max_output_tokens":64}`},
		{"/v1/responses", `{"model":"m","input":"hi"}`, `{"model":"m","input":"hi","max_output_tokens":64}`},
		{"/v1/messages", `{"model":"m","max_tokens":5000,"messages":[]}`, `{"model":"m","max_tokens":64,"messages":[]}`},
		{"/v1/embeddings", `{"model":"m","input":"hi"}`, ""},
		{"/v1/messages/count_tokens", `{"model":"m","messages":[]}`, ""},
	} {
		s, _ := newTestServer(t, "")
		s.policy = &capPolicy{maxTokens: 64}
		out := through(s, apiHeaders(tc.path), tc.body)
		if len(out) != 2 {
			t.Fatalf("%s: answers %v", tc.path, out)
		}
		if got := string(out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody()); got != tc.want {
			t.Errorf("%s %s: upstream body %q, want %q", tc.path, tc.body, got, tc.want)
		}
	}
}

// capDecider caps every request's output at max.
type capDecider struct{ max int }

func (d capDecider) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{Allow: true, MaxTokens: d.max}, nil
}

// However a client spells its output cap, and however many spellings it
// sends, the body that goes upstream carries none above the policy's cap
// (the admission reads the largest, the gate holds every key present to
// the cap); a spelling another API defines is refused on Responses and
// Messages.
func TestGateCapsEveryOutputCapKey(t *testing.T) {
	m, err := admission.NewMetrics(sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, body, want string
	}{
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":1,"max_tokens":50000,"messages":[]}`,
			`{"model":"m","max_completion_tokens":1,"max_tokens":4096,"messages":[]}`},
		{"/v1/chat/completions", `{"model":"m","max_tokens":1,"max_completion_tokens":50000,"messages":[]}`,
			`{"model":"m","max_tokens":1,"max_completion_tokens":4096,"messages":[]}`},
		{"/v1/chat/completions", `{"model":"m","max_tokens":9000,"max_completion_tokens":50000,"messages":[]}`,
			`{"model":"m","max_tokens":4096,"max_completion_tokens":4096,"messages":[]}`},
		{"/v1/completions", `{"model":"m","prompt":"hi","max_completion_tokens":1,"max_tokens":50000}`,
			`{"model":"m","prompt":"hi","max_completion_tokens":1,"max_tokens":4096}`},
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1,"max_tokens":50000}`, "400"},
		{"/v1/messages", `{"model":"m","max_tokens":1,"max_completion_tokens":50000,"messages":[]}`, "400"},
	} {
		s, _ := newTestServer(t, "")
		s.policy = &admission.Controller{Policy: capDecider{4096}, Log: slog.New(slog.DiscardHandler), Metrics: m}
		out := through(s, apiHeaders(tc.path), tc.body)
		if tc.want == "400" {
			if ir := out[0].GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 400 {
				t.Errorf("%s %s: answers %v, want a 400", tc.path, tc.body, out)
			}
			continue
		}
		if len(out) != 2 {
			t.Fatalf("%s: answers %v", tc.path, out)
		}
		if got := string(out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody()); got != tc.want {
			t.Errorf("%s %s: upstream body %q, want %q", tc.path, tc.body, got, tc.want)
		}
	}
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// Errors come in the style the API's clients read: Anthropic's on its
// paths (a bad body, a policy's denial, an unknown path under them),
// OpenAI's everywhere else.
func TestGateErrorStylePerAPI(t *testing.T) {
	s, sink := newTestServer(t, "")
	for _, tc := range []struct {
		name, path, body string
		status           int
		anthropicType    string // "": OpenAI's shape, with code
		code             string
	}{
		{"messages without max_tokens", "/v1/messages", `{"model":"m","messages":[]}`, 400, "invalid_request_error", ""},
		{"messages, bad JSON", "/v1/messages", `{"model":`, 400, "invalid_request_error", ""},
		{"count_tokens without model", "/v1/messages/count_tokens", `{"messages":[]}`, 400, "invalid_request_error", ""},
		{"responses, bad input", "/v1/responses", `{"model":"m","input":7}`, 400, "", "invalid_value"},
		{"embeddings without input", "/v1/embeddings", `{"model":"m"}`, 400, "", "invalid_value"},
		{"embeddings, repeated model", "/v1/embeddings", `{"model":"m","model":"n","input":"x"}`, 400, "", "invalid_value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := through(s, apiHeaders(tc.path), tc.body)
			ir := out[0].GetImmediateResponse()
			if ir == nil || int(ir.GetStatus().GetCode()) != tc.status {
				t.Fatalf("answers %v, want an immediate %d", out, tc.status)
			}
			if tc.anthropicType == "" {
				if !strings.Contains(string(ir.GetBody()), `"code":"`+tc.code+`"`) {
					t.Errorf("body %s, want OpenAI's error with code %s", ir.GetBody(), tc.code)
				}
				return
			}
			var e anthropicError
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Type != "error" || e.Error.Type != tc.anthropicType || e.Error.Message == "" {
				t.Errorf("body %s, want Anthropic's %s", ir.GetBody(), tc.anthropicType)
			}
			if st := sink.stamps[len(sink.stamps)-1]; st.Decision != "deny" || st.Status != tc.status {
				t.Errorf("stamp %+v", st)
			}
		})
	}
	// Where the gate is not configured to read Anthropic's API, the
	// default policy's 404 is still in Anthropic's shape.
	narrow, _ := newTestServer(t, "gate: {paths: [/v1/chat/completions]}")
	var e anthropicError
	out := through(narrow, apiHeaders("/v1/messages"), `{"model":"m","max_tokens":8,"messages":[]}`)
	if err := json.Unmarshal(out[0].GetImmediateResponse().GetBody(), &e); err != nil || e.Error.Type != "not_found_error" {
		t.Errorf("unserved path: %s", out[0].GetImmediateResponse().GetBody())
	}
	// A policy's denial on /v1/messages too.
	s.policy = &recordingPolicy{verdict: request.Verdict{Deny: openai.NewError(429, openai.TypeRateLimit, "rate_limit_exceeded", "", "slow down"),
		Headers: map[string]string{"retry-after": "3"}}}
	out = through(s, apiHeaders("/v1/messages"), `{"model":"m","max_tokens":8,"messages":[]}`)
	if err := json.Unmarshal(out[0].GetImmediateResponse().GetBody(), &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Message != "slow down" {
		t.Errorf("policy denial %s", out[0].GetImmediateResponse().GetBody())
	}
	if st := sink.stamps[len(sink.stamps)-1]; st.API != openai.APIMessages {
		t.Errorf("stamp API %q", st.API)
	}
}

// Anthropic clients send their key in x-api-key: the gate reads it (the
// policy's admission carries it) and it never reaches the pool, nor does
// an Authorization header.
func TestGateStripsAnthropicKey(t *testing.T) {
	s, _ := newTestServer(t, "")
	p := &recordingPolicy{}
	s.policy = p
	out := through(s, apiHeaders("/v1/messages", "x-api-key", "sk-gateway", "anthropic-version", "2023-06-01"),
		`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	if got := p.asked[0].Headers["x-api-key"]; got != "sk-gateway" {
		t.Errorf("the policy saw x-api-key %q", got)
	}
	removed := out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	if !slices.Contains(removed, "x-api-key") || slices.Contains(removed, "anthropic-version") {
		t.Errorf("removed %v: want x-api-key gone, anthropic-version kept", removed)
	}
}

// A configured path is read as the API its last segments name, under any
// prefix; one that names none is read as a chat or text completion, as
// every configured path was before.
func TestGateReadsConfiguredPathsByTheirAPI(t *testing.T) {
	s, _ := newTestServer(t, "gate: {paths: [/azure/v1/embeddings, /custom]}")
	p := &recordingPolicy{}
	s.policy = p
	through(s, apiHeaders("/azure/v1/embeddings"), `{"model":"m","input":[1,2,3]}`)
	through(s, apiHeaders("/custom"), `{"model":"m","prompt":[1,2,3]}`)
	if len(p.asked) != 2 || p.asked[0].API != openai.APIEmbeddings || p.asked[0].PromptTokens != 3 ||
		p.asked[1].API != openai.APIChat || p.asked[1].PromptTokens != 3 {
		t.Errorf("admissions %+v", p.asked)
	}
}
