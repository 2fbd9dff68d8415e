package e2e

import (
	"path/filepath"
	"testing"

	"github.com/infergate/infergate/internal/request"
)

// An Endpoint Picker behind the gate is told who is calling by the gate
// alone: through the real Envoy, with the shipped policies, a client's
// forged Inference Extension headers never reach the upstream, and the
// gate's (the caller's tier's objective, its tenant as the fairness id) do.
func TestPickerHeadersAreTheGates(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), filepath.Join(repoRoot, "policies"), ""), 1)
	forged := map[string]string{
		request.FairnessIDHeader:   "acme",
		request.ObjectiveHeader:    "critical",
		request.EndpointHeader:     "10.0.0.9:8000",
		request.EndpointSubsetKey:  "10.0.0.9:8000",
		request.EndpointServedKey:  "10.0.0.9:8000",
		request.ModelRewriteHeader: "llama-3.1-405b-instruct",
	}
	for _, c := range []struct{ name, key, fairness, objective string }{
		{"free tier, claiming premium", "sk-initech-0001", "initech", "sheddable"},
		{"premium tier", "sk-acme-0001", "acme", "critical"},
		{"a premium tenant's key held to the free tier", "sk-acme-batch", "acme", "sheddable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := chatCall(c.key, "llama-3.1-8b-instruct", 8)
			cl.hdr = forged
			servedB := s.PoolB.Served()
			if resp, e := cl.do(t, s.Envoy.URL); resp.StatusCode != 200 {
				t.Fatalf("status %d: %+v", resp.StatusCode, e.Error)
			}
			served := s.PoolA // the route splits the model between the pools
			if s.PoolB.Served() != servedB {
				served = s.PoolB
			}
			h, _ := served.LastRequest()
			if h == nil {
				t.Fatal("no pool recorded the request")
			}
			if got := h.Values(request.FairnessIDHeader); len(got) != 1 || got[0] != c.fairness {
				t.Errorf("upstream saw fairness id %q, want the gate's %q", got, c.fairness)
			}
			if got := h.Values(request.ObjectiveHeader); len(got) != 1 || got[0] != c.objective {
				t.Errorf("upstream saw objective %q, want the gate's %q", got, c.objective)
			}
			for _, k := range []string{request.EndpointHeader, request.EndpointSubsetKey, request.EndpointServedKey, request.ModelRewriteHeader} {
				if got := h.Values(k); len(got) != 0 {
					t.Errorf("the client's %s reached the upstream: %q", k, got)
				}
			}
		})
	}
}
