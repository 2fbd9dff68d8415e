package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func chatBody(model string, maxTokens int, stream bool, extra string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"tell me a story about envoy"}]%s}`,
		model, maxTokens, stream, extra)
}

// The body a client gets through Envoy + gate + meter is byte-identical to
// the mock's own answer and arrives event by event: in lock step, each event
// is written only once the client received the one before it through the
// gateway, so a buffering gateway would deadlock the stream. The stamp
// places each content token no earlier than the mock wrote it
// (checkBrackets).
func TestStreamingIsByteExactAndIncremental(t *testing.T) {
	s := startStack(t)
	const tokens = 12
	hdr := map[string]string{"x-mock-ttft-ms": "200", "x-mock-itl-ms": "30"}

	got := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", tokens, true, ""), hdr)
	if got.Status != 200 {
		t.Fatalf("status %d: %s", got.Status, got.Body)
	}
	// The gate adds stream_options.include_usage for the meter, and the
	// gateway removes the usage event before this client, which did not ask
	// for it: what it gets is the pool's answer to that upstream body (the
	// same ids), less that one event.
	direct := stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
		chatBody("pool-a", tokens, true, `,"stream_options":{"include_usage":true}`), hdr)
	want := unasked(t, direct)
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("body through the gateway differs from the direct body\n got: %q\nwant: %q", got.Body, want.Body)
	}
	if _, fwd := s.PoolA.LastRequest(); !bytes.Contains(fwd, []byte(`"include_usage":true`)) {
		t.Errorf("upstream body lacks the injected include_usage: %s", fwd)
	}
	seqs := seqsOf(got.Events, isChatContent)
	if len(seqs) != tokens {
		t.Fatalf("got %d content events, want %d", len(seqs), tokens)
	}
	checkBrackets(t, s.Gateway, got, seqs, false)

	st := s.Gateway.stamp(t, got.RequestID)
	if st.Pool != "pool-a" || st.Status != 200 || !st.Stream || !st.Complete || st.Decision != "allow" {
		t.Errorf("stamp = %+v", st)
	}
	if st.CompletionTokens != tokens || st.TokenSource != "usage" || st.PromptTokens == 0 {
		t.Errorf("stamp tokens = %d (%s), prompt %d; want %d from usage", st.CompletionTokens, st.TokenSource, st.PromptTokens, tokens)
	}

	// The same request in Prometheus, under the OpenTelemetry GenAI names.
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	labels := `gen_ai_operation_name="chat",gen_ai_request_model="pool-a",infergate_pool="pool-a"`
	// A stamp whose reads were held up is counted apart, not timed.
	first, n := timedFirst(st), timedStream(st)
	for series, want := range map[string]int{
		`gen_ai_server_time_to_first_token_seconds_count{` + labels + `}`:                                                                              first,
		`gen_ai_server_time_per_output_token_seconds_count{` + labels + `}`:                                                                            n,
		`gen_ai_server_request_duration_seconds_count{` + labels + `}`:                                                                                 n,
		`gen_ai_client_token_usage_sum{gen_ai_operation_name="chat",gen_ai_request_model="pool-a",gen_ai_token_type="output",infergate_pool="pool-a"}`: 12,
		`infergate_inter_token_latency_seconds_count{gen_ai_request_model="pool-a",infergate_pool="pool-a"}`:                                           11 * n,
		`infergate_gate_decisions_total{code="allowed",decision="allow"}`:                                                                              1,
	} {
		if !hasCount(metrics, series, want) {
			t.Errorf("/metrics lacks %s %d; have:\n%s", series, want, grep(metrics, "gen_ai_"))
		}
	}
	late := metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="late_read"`) +
		metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="late_stream"`)
	if late != float64(1-n) {
		t.Errorf("infergate_meter_errors_total{reason=late_read or late_stream} = %v; the stamp's timing is %q", late, st.Timing)
	}
}

// The meter's stamp places each content token no earlier than the mock
// wrote it, at every cadence.
func TestStampMatchesCadence(t *testing.T) { stampsMatchCadence(t, startStack(t), false) }

// stampsMatchCadence streams at nine cadences through s, in lock step, and
// brackets each stamp's timing (checkBrackets; both meters).
func stampsMatchCadence(t *testing.T, s *stack, timedInEnvoy bool) {
	for _, ttft := range []int{50, 300, 1000} {
		for _, itl := range []int{5, 20, 50} {
			t.Run(fmt.Sprintf("ttft=%dms/itl=%dms", ttft, itl), func(t *testing.T) {
				hdr := map[string]string{"x-mock-ttft-ms": fmt.Sprint(ttft), "x-mock-itl-ms": fmt.Sprint(itl)}
				r := mustLockstep(t, s.PoolB, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-b", 16, true, ""), hdr)
				if r.Status != 200 {
					t.Fatalf("status %d: %s", r.Status, r.Body)
				}
				st := s.Gateway.stamp(t, r.RequestID)
				t.Logf("stamp ttft=%.3fms itl p50=%.3fms p95=%.3fms max=%.3fms gateway=%.3fms gate=%.3fms",
					st.TTFTms, st.ITLP50ms, st.ITLP95ms, st.ITLMaxms, st.Gatewayms, st.Gatems)
				seqs := seqsOf(r.Events, isChatContent)
				if len(seqs) != 16 {
					t.Fatalf("%d content events, want 16", len(seqs))
				}
				checkBrackets(t, s.Gateway, r, seqs, timedInEnvoy)
				if st.ContentEvents != 16 || st.CompletionTokens != 16 {
					t.Errorf("stamp counted %d events / %d tokens, want 16", st.ContentEvents, st.CompletionTokens)
				}
			})
		}
	}
}

// unasked is what a client that did not ask for usage gets of r, a stream
// the pool answered with it (stream_options.include_usage, as the gate asks
// for the meter): the gateway's usage filter removes the usage-only event
// ("choices": []). It fails t if the pool sent no such event.
func unasked(t *testing.T, r streamResult) streamResult {
	t.Helper()
	var body []byte
	for _, e := range strings.SplitAfter(string(r.Body), "\n\n") {
		if !strings.Contains(e, `"choices":[]`) {
			body = append(body, e...)
		}
	}
	if len(body) == len(r.Body) {
		t.Fatalf("the pool sent no usage event:\n%s", r.Body)
	}
	r.Body = body
	return r
}
