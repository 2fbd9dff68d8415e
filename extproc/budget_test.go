package extproc

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// capPolicy admits with a max_tokens cap (and metadata), and records
// settlements.
type capPolicy struct {
	maxTokens int
	metadata  map[string]any
	settled   []request.Settlement
	released  []string // request id and reservation of each release
}

func (p *capPolicy) Identify(context.Context, *request.Admission) request.Verdict {
	return request.Verdict{}
}

func (p *capPolicy) Decide(context.Context, *request.Admission) request.Verdict {
	return request.Verdict{MaxTokens: p.maxTokens, Reservation: "r-1", Metadata: p.metadata}
}

func (p *capPolicy) Settle(_ context.Context, s *request.Settlement) {
	p.settled = append(p.settled, *s)
}

func (p *capPolicy) Release(_ context.Context, requestID, reservation string) {
	p.released = append(p.released, requestID+" "+reservation)
}

// The body that goes upstream carries the effective max_tokens the policy's
// cap set (its reservation counted that much), with usage still injected;
// the content length follows. Without a cap the body is the client's.
func TestGateSendsEffectiveMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		cap        int
		want       int // max_tokens upstream; 0: body untouched
	}{
		{"unset, streamed", `{"model":"m","stream":true,"messages":[]}`, 64, 64},
		{"unset, not streamed", `{"model":"m","messages":[]}`, 64, 64},
		{"above the cap", `{"model":"m","max_completion_tokens":500,"messages":[]}`, 64, 64},
		{"no cap", `{"model":"m","messages":[]}`, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestServer(t, "")
			s.policy = &capPolicy{maxTokens: tc.cap}
			g := &gateRequest{started: time.Now(), eager: true}
			s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
			out := s.gateStep(context.Background(), g, bodyMsg(tc.body, true))
			if len(out) != 2 {
				t.Fatalf("answers %v", out)
			}
			body := out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody()
			md := out[0].GetDynamicMetadata().GetFields()[request.MetadataNamespace].GetStructValue().GetFields()
			if tc.want == 0 {
				if body != nil {
					t.Errorf("body rewritten without a cap: %s", body)
				}
				return
			}
			r, err := openai.ParseRequest(body)
			if err != nil || r.MaxTokens != tc.want {
				t.Fatalf("upstream body %s: max_tokens %d, %v; want %d", body, r.MaxTokens, err, tc.want)
			}
			if r.Stream && (r.IncludeUsage == nil || !*r.IncludeUsage) {
				t.Errorf("usage not asked for: %s", body)
			}
			var length string
			for _, h := range out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == "content-length" {
					length = string(h.GetHeader().GetRawValue())
				}
			}
			if length != strconv.Itoa(len(body)) {
				t.Errorf("content-length %q for a %d-byte body", length, len(body))
			}
			if got := md["max_tokens"].GetNumberValue(); got != float64(tc.want) {
				t.Errorf("metadata max_tokens %v, want %d", got, tc.want)
			}
		})
	}
}

// gate.chatOutputLimit names the key added to a chat completion without a
// cap: max_completion_tokens for pools serving OpenAI's reasoning models,
// which refuse max_tokens.
func TestGateAddsTheConfiguredChatOutputLimit(t *testing.T) {
	for _, key := range []string{"max_tokens", "max_completion_tokens"} {
		s, _ := newTestServer(t, "gate:\n  chatOutputLimit: "+key+"\n")
		s.policy = &capPolicy{maxTokens: 64}
		g := &gateRequest{started: time.Now(), eager: true}
		s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
		out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"o3","messages":[]}`, true))
		if len(out) != 2 {
			t.Fatalf("answers %v", out)
		}
		body := string(out[1].GetRequestBody().GetResponse().GetBodyMutation().GetBody())
		if want := `{"model":"o3","messages":[],"` + key + `":64}`; body != want {
			t.Errorf("chatOutputLimit %s: upstream body %s, want %s", key, body, want)
		}
	}
}

// A request Envoy retried on the next pool reaches the meter once, as the
// answering attempt's response: one settlement, with that attempt's usage,
// and a stamp that names every attempt and the pool charged (the last).
func TestMeterSettlesRetriedRequestOnce(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	m := testMeter(100, &s.orders)
	hdrs := headersMsg(false, "x-request-id", "retried", request.ModelHeader, "llama")
	withGateField(hdrs, &gateField{decision: "allow", tenant: "acme", reservation: "r-1"})
	resp := respHeaders("text/event-stream")
	attrs := resp.Attributes[attributesKey].Fields
	attrs["xds.cluster_name"] = structpb.NewStringValue("infergate-fallback/llama/pool-a")
	attrs[request.PoolOrderAttribute] = structpb.NewStringValue(`["pool-a","pool-b"]`)
	attrs["upstream.request_attempt_count"] = structpb.NewNumberValue(2)
	now := time.Now()
	for _, msg := range []*extprocv3.ProcessingRequest{hdrs, resp, respBody(roleChunk+contentChunk, false)} {
		if m.observe(msg, now) {
			t.Fatal("ended early")
		}
	}
	if !m.observe(respBody(contentChunk+usageChunk+"data: [DONE]\n\n", true), now) {
		t.Fatal("not ended")
	}
	s.finish(context.Background(), m, now, true)
	if len(p.settled) != 1 {
		t.Fatalf("%d settlements, want 1", len(p.settled))
	}
	if got := p.settled[0]; got.Reservation != "r-1" || got.PromptTokens != 7 || got.CompletionTokens != 3 || !got.UsageRead || got.End != request.EndComplete {
		t.Errorf("settlement %+v, want the answering attempt's usage (7 + 3)", got)
	}
	st := sink.stamps[0]
	if st.Attempts != 2 || !slices.Equal(st.PoolsTried, []string{"pool-a", "pool-b"}) || st.Pool != "pool-b" ||
		st.PromptTokens != 7 || st.CompletionTokens != 3 {
		t.Errorf("stamp: attempts %d, pools %v, pool %q, tokens %d + %d", st.Attempts, st.PoolsTried, st.Pool, st.PromptTokens, st.CompletionTokens)
	}
}

// A request the gate admitted but cannot forward (here: metadata protobuf
// cannot carry) gives its reservation back: released once, not settled.
func TestGateFailClosedGivesReservationBack(t *testing.T) {
	s, _ := newTestServer(t, "")
	p := &capPolicy{metadata: map[string]any{"x-note": "\xff"}}
	s.policy = p
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
	out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"m","messages":[]}`, true))
	if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 500 {
		t.Fatalf("answers %v, want one 500", out)
	}
	if len(p.settled) != 0 || !slices.Equal(p.released, []string{"req-1 r-1"}) {
		t.Errorf("settlements %+v, releases %q; want the reservation released once", p.settled, p.released)
	}
}
