package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
)

// namedEvent is one SSE event of an API that names its events.
type namedEvent struct {
	At         time.Duration
	Name, Data string
}

// namedEvents splits what stream recorded into event names and data.
func namedEvents(evs []event) []namedEvent {
	var out []namedEvent
	for _, e := range evs {
		ne := namedEvent{At: e.At}
		for _, line := range strings.Split(e.Data, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				ne.Name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				ne.Data = v
			}
		}
		out = append(out, ne)
	}
	return out
}

// apiStream is what one API's stream looks like to its client: the path,
// a request body, which events carry content, and where the usage is.
type apiStream struct {
	api, path string
	body      func(tokens int) string
	content   func(namedEvent) bool
	usage     func([]namedEvent) (input, output int)
}

// throughGateway streams a's request to pool-b directly, then through
// Envoy and infergate in lock step, and fails unless the two bodies are
// byte-identical. It returns the gateway's stream and pool-b's billing
// ledger around it.
func (a apiStream) throughGateway(t *testing.T, s *stack, tokens int, hdr map[string]string) (got lockstepResult, before, after mock.Usage) {
	t.Helper()
	want := stream(t, "http://"+s.PoolB.Addr+a.path, a.body(tokens), hdr)
	before = s.PoolB.Usage()
	got = mustLockstep(t, s.PoolB, s.Envoy.URL+a.path, a.body(tokens), hdr)
	after = s.PoolB.Usage()
	if got.Status != 200 {
		t.Fatalf("status %d: %s", got.Status, got.Body)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("body through the gateway differs from the direct body\n got: %q\nwant: %q", got.Body, want.Body)
	}
	return got, before, after
}

// checkStamp: one lock-step request of API a, stamped by any meter: its
// API, status and completeness, its timing bracketed (s.checkTiming, the
// pool's TTFT ttft), one content event per token, and the usage the stream
// reported equal to the stamp's and to what the mock billed between before
// and after.
func (a apiStream) checkStamp(t *testing.T, s *stack, st Stamp, r lockstepResult, tokens int, before, after mock.Usage, ttft time.Duration) {
	t.Helper()
	if st.API != a.api || st.Status != 200 || !st.Stream || !st.Complete {
		t.Errorf("stamp: api %q, status %d, stream %v, complete %v", st.API, st.Status, st.Stream, st.Complete)
	}
	evs := namedEvents(r.Events)
	seqs := seqsOf(r.Events, func(e event) bool { return a.content(namedEvents([]event{e})[0]) })
	if len(seqs) != tokens {
		t.Fatalf("%d content events, want %d", len(seqs), tokens)
	}
	s.checkTiming(t, r, seqs, st, ttft)
	in, out := a.usage(evs)
	if st.ContentEvents != tokens || st.CompletionTokens != out || out != tokens || st.PromptTokens != in || in == 0 || st.TokenSource != "usage" {
		t.Errorf("stamp: %d content events, tokens %d + %d (%s); the usage %d + %d", st.ContentEvents, st.PromptTokens, st.CompletionTokens, st.TokenSource, in, out)
	}
	if p, c := after.PromptTokens-before.PromptTokens, after.CompletionTokens-before.CompletionTokens; int(p) != st.PromptTokens || int(c) != st.CompletionTokens {
		t.Errorf("the mock billed %d + %d, the stamp says %d + %d", p, c, st.PromptTokens, st.CompletionTokens)
	}
}

var namedAPIs = []apiStream{
	{
		api: "responses", path: "/v1/responses",
		body: func(n int) string {
			return fmt.Sprintf(`{"model":"pool-b","input":"tell me a story about envoy","max_output_tokens":%d,"stream":true}`, n)
		},
		content: func(e namedEvent) bool { return e.Name == "response.output_text.delta" },
		usage: func(evs []namedEvent) (in, out int) {
			for _, e := range evs {
				if e.Name == "response.completed" {
					var c struct {
						Response struct {
							Usage struct {
								InputTokens  int `json:"input_tokens"`
								OutputTokens int `json:"output_tokens"`
							} `json:"usage"`
						} `json:"response"`
					}
					if json.Unmarshal([]byte(e.Data), &c) == nil {
						in, out = c.Response.Usage.InputTokens, c.Response.Usage.OutputTokens
					}
				}
			}
			return in, out
		},
	},
	{
		api: "messages", path: "/v1/messages",
		body: func(n int) string {
			return fmt.Sprintf(`{"model":"pool-b","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"tell me a story about envoy"}]}`, n)
		},
		content: func(e namedEvent) bool { return e.Name == "content_block_delta" },
		usage: func(evs []namedEvent) (in, out int) {
			for _, e := range evs {
				var c struct {
					Message struct {
						Usage struct {
							InputTokens int `json:"input_tokens"`
						} `json:"usage"`
					} `json:"message"`
					Usage struct {
						OutputTokens int `json:"output_tokens"`
					} `json:"usage"`
				}
				_ = json.Unmarshal([]byte(e.Data), &c)
				switch e.Name {
				case "message_start":
					in = c.Message.Usage.InputTokens
				case "message_delta":
					out = c.Usage.OutputTokens
				}
			}
			return in, out
		},
	},
}

// Each API that names its events (the Responses API, Anthropic's
// Messages), like chat (TestStampMatchesCadence): the stream a client gets
// through the gateway is byte-identical to the mock's own, arrives event by
// event (in lock step), and the meter stamps each content event no earlier
// than the mock wrote it (checkBrackets), one content event per token, and
// the usage the mock reported and billed.
func TestStampsMatchCadencePerAPI(t *testing.T) {
	s := startStack(t)
	const tokens = 16
	var sts []Stamp
	for _, a := range namedAPIs {
		for _, ttft := range []int{50, 300} {
			for _, itl := range []int{5, 20} {
				t.Run(fmt.Sprintf("%s/ttft=%dms/itl=%dms", a.api, ttft, itl), func(t *testing.T) {
					hdr := map[string]string{"x-mock-ttft-ms": fmt.Sprint(ttft), "x-mock-itl-ms": fmt.Sprint(itl)}
					got, before, ledger := a.throughGateway(t, s, tokens, hdr)
					st := s.Gateway.stamp(t, got.RequestID)
					t.Logf("stamp ttft=%.3fms itl p50=%.3fms p95=%.3fms max=%.3fms", st.TTFTms, st.ITLP50ms, st.ITLP95ms, st.ITLMaxms)
					a.checkStamp(t, s, st, got, tokens, before, ledger, time.Duration(ttft)*time.Millisecond)
					sts = append(sts, st)
				})
			}
		}
	}
	// Both are chat operations to OpenTelemetry (the GenAI conventions'
	// name for them): their first tokens are in the chat histograms.
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	if len(sts) != 8 {
		t.Fatalf("%d stamps of 8 requests", len(sts))
	}
	want := `gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="pool-b",infergate_pool="pool-b"}`
	if !hasCount(metrics, want, timedFirst(sts...)) {
		t.Errorf("/metrics lacks %s %d; have:\n%s", want, timedFirst(sts...), grep(metrics, "time_to_first_token_seconds_count"))
	}
}

// embeddingsStamped: embeddings through the gateway, float and base64,
// byte-identical to the mock's answer; stamped with no first token nor
// inter-token gaps, their duration, and the input tokens the mock reported
// and billed (labelled embeddings in the GenAI metrics, where the adapter
// serves them). TestParity runs it on both adapters.
func embeddingsStamped(t *testing.T, s *stack, ttft int) {
	hdr := with(map[string]string{"x-mock-ttft-ms": fmt.Sprint(ttft)})
	labels := `gen_ai_operation_name="embeddings",gen_ai_request_model="pool-b",infergate_pool="pool-b"`
	series := map[string][2]string{
		"dur":   {"gen_ai_server_request_duration_seconds_count", labels},
		"input": {"gen_ai_client_token_usage_sum", `gen_ai_operation_name="embeddings",gen_ai_request_model="pool-b",gen_ai_token_type="input",infergate_pool="pool-b"`},
	}
	before := s.metricsOf(t, series)
	total := 0
	var sts []Stamp
	for i, format := range []string{"float", "base64"} {
		body := fmt.Sprintf(`{"model":"pool-b","input":["the first input %d","and a second, longer one"],"encoding_format":%q}`, i, format)
		want := stream(t, "http://"+s.PoolB.Addr+"/v1/embeddings", body, hdr)
		billed := s.PoolB.Usage()
		got := stream(t, s.Envoy.URL+"/v1/embeddings", body, hdr)
		ledger := s.PoolB.Usage()
		if got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
			t.Fatalf("%s: status %d; body through the gateway differs from the direct body\n got: %.300s\nwant: %.300s", format, got.Status, got.Body, want.Body)
		}
		var answer struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(got.Body, &answer); err != nil || answer.Usage.PromptTokens == 0 {
			t.Fatalf("%s: answer %.200s: %v", format, got.Body, err)
		}
		st := s.stamp(t, got.RequestID)
		if st.API != "embeddings" || st.Status != 200 || !st.Complete || st.Stream {
			t.Errorf("%s: stamp api %q, status %d, complete %v, stream %v", format, st.API, st.Status, st.Complete, st.Stream)
		}
		// Bracketed, not timed: Envoy's whole time holds the pool's delay;
		// the model's share is the rest after the departure, which the
		// meter dates by its read of the request, up to maxHandoff (10 ms)
		// after the request really left.
		if st.TTFTms != 0 || st.ITLP50ms != 0 || st.ContentEvents != 0 || st.Totalms < float64(ttft) ||
			st.E2Ems > st.Totalms || st.E2Ems < float64(ttft)-10 {
			t.Errorf("%s: stamp TTFT %.3fms, ITL p50 %.3fms, %d content events, E2E %.3fms of %.3fms (configured %dms)", format, st.TTFTms, st.ITLP50ms, st.ContentEvents, st.E2Ems, st.Totalms, ttft)
		}
		if st.PromptTokens != answer.Usage.PromptTokens || st.CompletionTokens != 0 || st.TokenSource != "usage" ||
			int(ledger.PromptTokens-billed.PromptTokens) != st.PromptTokens {
			t.Errorf("%s: stamp tokens %d + %d (%s); the usage %d, the mock billed %d", format, st.PromptTokens, st.CompletionTokens, st.TokenSource,
				answer.Usage.PromptTokens, ledger.PromptTokens-billed.PromptTokens)
		}
		total += st.PromptTokens
		sts = append(sts, st)
	}
	if after := s.metricsOf(t, series); after != nil {
		for k, want := range map[string]float64{"dur": float64(timedStream(sts...)), "input": float64(total)} {
			if d := after[k] - before[k]; d != want {
				t.Errorf("/metrics: %s{%s} moved by %v, want %v", series[k][0], series[k][1], d, want)
			}
		}
		if metrics := get(t, s.AdminURL+"/metrics"); strings.Contains(metrics, `gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="embeddings"`) {
			t.Errorf("embeddings have a first token in /metrics:\n%s", grep(metrics, "time_to_first_token"))
		}
	}
}

// A budget is charged for embeddings' input tokens: each request's
// settled charge is the usage the mock reported (and billed), not the
// gate's estimate, and nothing for output.
func TestBudgetChargesEmbeddings(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), loadPolicies(t, 1_000_000), ""), 1)
	hdr := map[string]string{"authorization": "Bearer sk-load-0001", "x-mock-ttft-ms": "20"}
	settledTokens := func() float64 {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_tokens_total", `state="settled"`)
	}
	settledCount := func() float64 {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`)
	}
	for i, input := range []string{`"one short input"`, `["a batch","of three inputs","each one counted by the pool"]`, `[[101, 2023, 2003, 1037, 19204, 102]]`} {
		charged, n := settledTokens(), settledCount()
		before := s.PoolA.Usage()
		r := stream(t, s.Envoy.URL+"/v1/embeddings", `{"model":"pool-a","input":`+input+`}`, hdr)
		if r.Status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
		billed := int(s.PoolA.Usage().PromptTokens - before.PromptTokens)
		st := s.Gateway.stamp(t, r.RequestID)
		testutil.Eventually(t, 5*time.Second, func() bool { return settledCount() == n+1 }, "the settlement")
		if got := settledTokens() - charged; int(got) != billed || st.PromptTokens != billed || st.Tenant != "loadtest" {
			t.Errorf("request %d: charged %v tokens, the stamp %d (tenant %q); the mock billed %d", i, got, st.PromptTokens, st.Tenant, billed)
		}
	}
}
