package e2e

import (
	"fmt"
	"strings"
	"testing"
)

func chatBody(model string, maxTokens int, stream bool, extra string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"tell me a story about envoy"}]%s}`,
		model, maxTokens, stream, extra)
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
				checkBrackets(t, s.Gateway.AdminURL, r, seqs, timedInEnvoy)
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
