package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/request"
)

// decideRecorder counts the policy's decisions: a request refused before
// Decide reserved nothing.
type decideRecorder struct {
	request.AllowAll
	decided int
}

func (p *decideRecorder) Decide(ctx context.Context, a *request.Admission) request.Verdict {
	p.decided++
	return p.AllowAll.Decide(ctx, a)
}

// countingSealer counts the fields it seals: a refused request is issued none.
type countingSealer struct {
	FieldSealer
	sealed int
}

func (c *countingSealer) Seal(ctx context.Context, tenant, field string) (string, error) {
	c.sealed++
	return c.FieldSealer.Seal(ctx, tenant, field)
}

// A model the gate would copy into its routing header must be a header
// value Envoy takes: one with a control character (the issue's), or bytes
// that are not UTF-8, is refused 400 before the policy is asked, so
// nothing is reserved and no field sealed. Tabs and spaces inside a name
// are refused too (control characters); a plain name goes through.
func TestGateRefusesModelsUnfitForAHeader(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  int
	}{
		{`m\u0001x`, 400},
		{`m\nx`, 400},
		{`m\rx`, 400},
		{`m\tx`, 400},
		{`m\u007fx`, 400},
		{`m\u0085x`, 400},
		{"m\xffx", 400},
		{`meta-llama/Llama-3.1-8B-Instruct`, 0},
	} {
		s, sink := newTestServer(t, "")
		p := &decideRecorder{}
		sealer := &countingSealer{FieldSealer: s.sealer}
		s.policy, s.sealer = p, sealer
		g := &gateRequest{started: time.Now(), eager: true}
		s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
		out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"`+tc.model+`","messages":[{"role":"user","content":"hi"}]}`, true))
		got := int(out[0].GetImmediateResponse().GetStatus().GetCode())
		if got != tc.want {
			t.Errorf("model %q: answered %d, want %d", tc.model, got, tc.want)
		}
		if tc.want == 0 {
			if p.decided != 1 || sealer.sealed != 1 {
				t.Errorf("model %q: decided %d, sealed %d; want 1 and 1", tc.model, p.decided, sealer.sealed)
			}
			continue
		}
		if p.decided != 0 || sealer.sealed != 0 {
			t.Errorf("model %q: decided %d, sealed %d; want nothing asked or sealed", tc.model, p.decided, sealer.sealed)
		}
		if len(sink.stamps) != 1 || sink.stamps[0].Reason != "invalid_value" || sink.stamps[0].Decision != "deny" {
			t.Errorf("model %q: stamps %+v", tc.model, sink.stamps)
		}
	}
}
