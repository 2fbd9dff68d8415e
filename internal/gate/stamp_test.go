package gate

import (
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// A request the gate answered itself is stamped whole, its time the
// gateway's but the external checks', its fields bounded.
func TestAnswered(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	v := request.Verdict{Principal: "key-1", Tenant: "acme", Reason: strings.Repeat("r", 2*request.MaxStampReason),
		Timings: request.Timings{Policy: time.Millisecond, Checks: 4 * time.Millisecond}}
	st := Answered(Answer{RequestID: "req-1", Model: strings.Repeat("m", 2*request.MaxStampField), API: openai.APIChat,
		Status: 429, Decision: "deny", Started: t0, Took: 10 * time.Millisecond}, v)
	if st.RequestID != "req-1" || st.API != openai.APIChat || st.Status != 429 || st.Decision != "deny" || !st.Complete ||
		st.Principal != "key-1" || st.Tenant != "acme" || !st.Start.Equal(t0) || st.Total != 10*time.Millisecond {
		t.Errorf("stamp %+v", st)
	}
	if want := (request.GatewayTime{Total: 6 * time.Millisecond, Gate: 6 * time.Millisecond, Timings: v.Timings}); st.Gateway != want {
		t.Errorf("gateway %+v, want %+v", st.Gateway, want)
	}
	if len(st.Model) > request.MaxStampField || len(st.Reason) > request.MaxStampReason {
		t.Errorf("model of %d bytes, reason of %d: not bounded", len(st.Model), len(st.Reason))
	}
}
