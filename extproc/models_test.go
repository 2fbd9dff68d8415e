package extproc

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// tierPolicy is a gate.ModelPolicy in the example policies' spirit: a key's tier
// says which models and APIs it may use; no key, 401.
type tierPolicy struct {
	settled []request.Settlement
}

var tiers = map[string]struct{ models, apis []string }{
	"Bearer sk-free":    {[]string{"small"}, nil},
	"Bearer sk-premium": {[]string{"small", "large", "vm"}, nil},
	"Bearer sk-search":  {[]string{"embed"}, []string{"embeddings"}},
}

func (p *tierPolicy) Identify(_ context.Context, a *request.Admission) request.Verdict {
	if _, ok := tiers[a.Headers["authorization"]]; !ok {
		return request.Verdict{Deny: openai.NewError(401, openai.TypeAuthentication, "invalid_api_key", "", "no key"), Reason: "unauthenticated"}
	}
	return request.Verdict{}
}

func (p *tierPolicy) Decide(ctx context.Context, a *request.Admission) request.Verdict {
	if v := p.Identify(ctx, a); v.Deny != nil {
		return v
	}
	return request.Verdict{Reason: "ok", Tenant: "t", Reservation: "r-1", Metadata: map[string]any{"x-ratelimit-remaining-requests": "9"}}
}

func (p *tierPolicy) Permits(_ context.Context, a *request.Admission) bool {
	t, ok := tiers[a.Headers["authorization"]]
	return ok && a.Completion && slices.Contains(t.models, a.Request.Model) &&
		(t.apis == nil || slices.Contains(t.apis, string(a.API)))
}

func (p *tierPolicy) Settle(_ context.Context, s *request.Settlement) {
	p.settled = append(p.settled, *s)
}

func (p *tierPolicy) Release(context.Context, string, string) {}

func modelsServer(t *testing.T) (*Server, *tierPolicy, *captureSink) {
	t.Helper()
	s, sink := newTestServer(t, "")
	p := &tierPolicy{}
	s.policy = p
	s.opts.Catalog = []string{"small", "large", "embed", "vm", "org/model"}
	return s, p, sink
}

// get sends a body-less GET, as Envoy does: headers with end_of_stream.
func get(s *Server, path, key string) *extprocv3.ImmediateResponse {
	h := []string{":method", "GET", ":path", path, "x-request-id", "req-m"}
	if key != "" {
		h = append(h, "authorization", "Bearer "+key)
	}
	g := &gateRequest{started: time.Now(), eager: true}
	out := s.gateStep(context.Background(), g, headersMsg(true, h...))
	if len(out) != 1 {
		return nil
	}
	return out[0].GetImmediateResponse()
}

func listed(t *testing.T, ir *extprocv3.ImmediateResponse) []string {
	t.Helper()
	if ir == nil || ir.GetStatus().GetCode() != http.StatusOK {
		t.Fatalf("want an immediate 200, got %v", ir)
	}
	var list struct {
		Object string
		Data   []openai.Model
	}
	if err := json.Unmarshal(ir.GetBody(), &list); err != nil || list.Object != "list" || list.Data == nil {
		t.Fatalf("not an OpenAI list: %s (%v)", ir.GetBody(), err)
	}
	var ids []string
	for _, m := range list.Data {
		if m.Object != "model" || m.Created != 1735689600 || m.OwnedBy != "infergate" {
			t.Errorf("model %+v", m)
		}
		ids = append(ids, m.ID)
	}
	return ids
}

// GET /v1/models lists the catalog models the caller's tier may call, on
// any API (the search tier embeds only), in the catalog's order; the gate
// answers it, settles the listing's reservation and stamps it.
func TestModelsListedPerTier(t *testing.T) {
	s, p, sink := modelsServer(t)
	for key, want := range map[string][]string{
		"sk-free":    {"small"},
		"sk-premium": {"small", "large", "vm"},
		"sk-search":  {"embed"},
	} {
		ir := get(s, "/v1/models", key)
		if got := listed(t, ir); !slices.Equal(got, want) {
			t.Errorf("%s lists %q, want %q", key, got, want)
		}
		hdr := map[string]string{}
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			hdr[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		}
		if hdr["content-type"] != "application/json" || hdr["x-ratelimit-remaining-requests"] != "9" {
			t.Errorf("headers %v", hdr)
		}
		if _, ok := hdr[request.ErrorHeader]; !ok {
			t.Errorf("no %s: Envoy's local_reply_config would rewrite the answer", request.ErrorHeader)
		}
	}
	if len(p.settled) != 3 || p.settled[0].Origin != request.OriginGate || p.settled[0].End != request.EndComplete || p.settled[0].Reservation != "r-1" {
		t.Errorf("settlements %+v, want each listing's reservation settled", p.settled)
	}
	if len(sink.stamps) != 3 || sink.stamps[0].Status != 200 || sink.stamps[0].Decision != "allow" {
		t.Errorf("stamps %+v", sink.stamps)
	}
}

func TestModelsNeedAKey(t *testing.T) {
	s, _, _ := modelsServer(t)
	for _, path := range []string{"/v1/models", "/v1/models/small"} {
		ir := get(s, path, "")
		var e struct{ Error openai.Error }
		if ir.GetStatus().GetCode() != 401 || json.Unmarshal(ir.GetBody(), &e) != nil || e.Error.Code != "invalid_api_key" {
			t.Errorf("%s without a key: %v", path, ir)
		}
	}
}

// GET /v1/models/{id} answers the model, or OpenAI's 404 when it is not
// listed for the caller; ids may hold slashes.
func TestModelsRetrieve(t *testing.T) {
	s, _, _ := modelsServer(t)
	s.policy.(*tierPolicy).settled = nil
	tiers["Bearer sk-org"] = struct{ models, apis []string }{[]string{"org/model"}, nil}
	t.Cleanup(func() { delete(tiers, "Bearer sk-org") })
	for _, c := range []struct {
		path, key string
		status    int
	}{
		{"/v1/models/large", "sk-premium", 200},
		{"/v1/models/org/model", "sk-org", 200},
		{"/v1/models/org%2Fmodel", "sk-org", 200},
		{"/v1/models/large", "sk-free", 404},       // not on the tier
		{"/v1/models/unlisted", "sk-premium", 404}, // not in the catalog
	} {
		ir := get(s, c.path, c.key)
		if int(ir.GetStatus().GetCode()) != c.status {
			t.Errorf("%s as %s: %v, want %d", c.path, c.key, ir, c.status)
			continue
		}
		if c.status == 200 {
			var m openai.Model
			if err := json.Unmarshal(ir.GetBody(), &m); err != nil || m.Object != "model" || m.OwnedBy != "infergate" {
				t.Errorf("%s: %s", c.path, ir.GetBody())
			}
			continue
		}
		var e struct{ Error openai.Error }
		if json.Unmarshal(ir.GetBody(), &e) != nil || e.Error.Code != "model_not_found" || e.Error.Type != openai.TypeInvalidRequest {
			t.Errorf("%s: %s, want OpenAI's model_not_found", c.path, ir.GetBody())
		}
	}
}

// A model id in the path is bounded as a body's model is: a long one is
// refused 400 and never reaches the policy, nor the stamp whole.
func TestModelsRetrieveLongIDRefused(t *testing.T) {
	s, p, sink := modelsServer(t)
	p.settled = nil
	ir := get(s, "/v1/models/"+strings.Repeat("m", 60<<10), "sk-premium")
	var e struct{ Error openai.Error }
	if ir.GetStatus().GetCode() != 400 || json.Unmarshal(ir.GetBody(), &e) != nil || e.Error.Code != "invalid_value" || e.Error.Param == nil || *e.Error.Param != "model" {
		t.Fatalf("a 60 KiB id: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	if n := len(sink.stamps); n != 1 || len(sink.stamps[0].Model) > MaxModelBytes || sink.stamps[0].Status != 400 {
		t.Errorf("stamps %d, model %d bytes", n, len(sink.stamps[n-1].Model))
	}
	if len(p.settled) != 0 {
		t.Errorf("the policy saw it: %+v", p.settled)
	}
}

// Without a catalog the gate leaves /v1/models to the policy (and the
// route), as before it knew models; other methods are never answered.
func TestModelsLeftToThePolicy(t *testing.T) {
	s, _, _ := modelsServer(t)
	s.opts.Catalog = nil
	g := &gateRequest{started: time.Now(), eager: true}
	out := s.gateStep(context.Background(), g, headersMsg(true, ":method", "GET", ":path", "/v1/models", "authorization", "Bearer sk-free"))
	if len(out) != 1 || out[0].GetRequestHeaders() == nil {
		t.Errorf("no catalog: want the request admitted on, got %v", out)
	}
	s, _, _ = modelsServer(t)
	g = &gateRequest{started: time.Now(), eager: true}
	out = s.gateStep(context.Background(), g, headersMsg(true, ":method", "HEAD", ":path", "/v1/models", "authorization", "Bearer sk-free"))
	if len(out) != 1 || out[0].GetRequestHeaders() == nil {
		t.Errorf("HEAD: want it left to the policy, got %v", out)
	}
}

// Without a catalog, the gate lists what the pools serve now, filtered by
// the caller's policy as configured models are; before the pools have
// answered, an empty list. A configured catalog wins.
func TestModelsFromPools(t *testing.T) {
	s, _, _ := modelsServer(t)
	s.opts.Catalog = nil
	served := []string{}
	s.opts.PoolModels = func() []string { return served }
	if got := listed(t, get(s, "/v1/models", "sk-premium")); len(got) != 0 {
		t.Errorf("before the pools answered: %q, want an empty list", got)
	}
	served = []string{"large", "embed", "small", "unknown"}
	for key, want := range map[string][]string{
		"sk-free":    {"small"},
		"sk-premium": {"large", "small"},
		"sk-search":  {"embed"},
	} {
		if got := listed(t, get(s, "/v1/models", key)); !slices.Equal(got, want) {
			t.Errorf("%s lists %q, want %q", key, got, want)
		}
	}
	for _, c := range []struct {
		path, key string
		status    int
	}{
		{"/v1/models/large", "sk-premium", 200},
		{"/v1/models/large", "sk-free", 404}, // served, not on the tier
		{"/v1/models/vm", "sk-premium", 404}, // on the tier, served by no pool
		{"/v1/models/small", "", 401},
	} {
		if ir := get(s, c.path, c.key); int(ir.GetStatus().GetCode()) != c.status {
			t.Errorf("%s as %q: %d %s, want %d", c.path, c.key, ir.GetStatus().GetCode(), ir.GetBody(), c.status)
		}
	}
	s.opts.Catalog = []string{"vm"}
	if got := listed(t, get(s, "/v1/models", "sk-premium")); !slices.Equal(got, []string{"vm"}) {
		t.Errorf("with a catalog: %q, want the catalog's", got)
	}
}
