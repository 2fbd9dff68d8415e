package extproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/request"
)

// What an Endpoint Picker behind the gate is told, with the real admission
// controller and the example policies: the caller's tier's objective and
// its tenant as the fairness id, whatever the client sent under those
// names; the client's other Inference Extension headers are removed.
func TestGateTellsThePickerWhoIsCalling(t *testing.T) {
	s, _ := newTestServer(t, "log: {requests: false}")
	var keys string
	for _, k := range []struct{ key, id, tenant string }{{"sk-free", "free-key", "initech"}, {"sk-premium", "premium-key", "acme"}} {
		sum := sha256.Sum256([]byte(k.key))
		keys += "- id: " + k.id + "\n  sha256: " + hex.EncodeToString(sum[:]) + "\n  tenant: " + k.tenant + "\n"
	}
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte("keys:\n"+keys), 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	set := &identity.KeySet{}
	set.Store(loaded)
	m, err := admission.NewMetrics(sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.Load(context.Background(), "../policies")
	if err != nil {
		t.Fatal(err)
	}
	s.policy = &admission.Controller{Keys: set, Policy: engine, Log: slog.New(slog.DiscardHandler), Metrics: m}

	forged := []string{request.FairnessIDHeader, "acme", request.ObjectiveHeader, "critical",
		request.EndpointHeader, "10.0.0.9:8000", request.EndpointSubsetKey, "10.0.0.9:8000",
		request.ModelRewriteHeader, "llama-3.1-405b-instruct"}
	for _, c := range []struct{ key, fairness, objective string }{
		{"sk-free", "initech", "sheddable"},
		{"sk-premium", "acme", "critical"},
	} {
		hdrs := append(slices.Clone(chatHeaders), append([]string{"authorization", "Bearer " + c.key}, forged...)...)
		g := &gateRequest{started: time.Now(), eager: true}
		if out := s.gateStep(context.Background(), g, headersMsg(false, hdrs...)); out != nil {
			t.Fatalf("%s: answered before the body: %v", c.key, out)
		}
		out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"llama-3.1-8b-instruct","messages":[{"role":"user","content":"hi"}]}`, true))
		mut := out[0].GetRequestHeaders().GetResponse().GetHeaderMutation()
		if mut == nil {
			t.Fatalf("%s: not admitted: %v", c.key, out)
		}
		got := setHeaders(out)
		if got[request.FairnessIDHeader] != c.fairness || got[request.ObjectiveHeader] != c.objective {
			t.Errorf("%s: the picker is told fairness %q, objective %q; want %q, %q",
				c.key, got[request.FairnessIDHeader], got[request.ObjectiveHeader], c.fairness, c.objective)
		}
		for _, h := range []string{request.EndpointHeader, request.EndpointSubsetKey, request.EndpointServedKey, request.ModelRewriteHeader} {
			if !slices.Contains(mut.GetRemoveHeaders(), h) {
				t.Errorf("%s: the client's %s is not removed: %v", c.key, h, mut.GetRemoveHeaders())
			}
		}
	}
}
