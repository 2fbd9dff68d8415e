package extproc

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// ModelsPath is OpenAI's model listing; ModelsPath/{id} retrieves one.
// With Options.Catalog or Options.PoolModels set the gate answers both
// itself (GET only): no pool sees them.
const ModelsPath = "/v1/models"

// modelsCreated is every listed model's "created": the gateway does not
// know when a model was made, and a fixed value keeps answers stable.
const modelsCreated = 1735689600 // 2025-01-01T00:00:00Z

// ModelPolicy is a request.Policy that can also tell, without reserving
// budgets or running checks, whether it would admit a request. The gate
// asks it, per model, which models a caller of GET /v1/models may call. A
// Policy without it admits every well-formed inference request, so it is
// listed every model.
type ModelPolicy interface {
	request.Policy
	Permits(ctx context.Context, a *request.Admission) bool
}

// modelsRequest reports whether the gate answers this request itself: a
// GET of the listing, or of one model (id, path-unescaped: ids may hold
// slashes, e.g. meta-llama/Llama-3.1-8B).
func (s *Server) modelsRequest(method, path string) (id string, one, ok bool) {
	if method != http.MethodGet || len(s.opts.Catalog) == 0 && s.opts.PoolModels == nil {
		return "", false, false
	}
	if path == ModelsPath {
		return "", false, true
	}
	rest, found := strings.CutPrefix(path, ModelsPath+"/")
	if !found || rest == "" {
		return "", false, false
	}
	if id, err := url.PathUnescape(rest); err == nil {
		rest = id
	}
	return rest, true, true
}

// catalog is what the gate lists: the configured models or, without them,
// what the pools serve now.
func (s *Server) catalog() []string {
	if len(s.opts.Catalog) > 0 || s.opts.PoolModels == nil {
		return s.opts.Catalog
	}
	return s.opts.PoolModels()
}

// models answers GET /v1/models (and /v1/models/{id}): the catalog models
// the caller's policy lets it call. The request itself is decided as any
// other (authentication, the policy's say on the listing, its budgets);
// retrieving one model is decided as the listing, which is what it reveals.
func (s *Server) models(ctx context.Context, g *gateRequest, adm *request.Admission, id string, one bool) []*extprocv3.ProcessingResponse {
	// The id is the client's (a path may be tens of KiB): refused past the
	// bound a body's model has, before the policy, the stamp or the log.
	if len(id) > MaxModelBytes {
		e := openai.BadRequest("invalid_value", "model",
			"model is "+strconv.Itoa(len(id))+" bytes long; the limit is "+strconv.Itoa(MaxModelBytes))
		return s.deny(ctx, g, request.Truncate(id, MaxModelBytes), request.Verdict{Deny: e, Reason: e.Code})
	}
	adm.Path = ModelsPath
	g.policyAt = s.now()
	v := s.policy.Decide(ctx, adm)
	if v.Deny != nil && v.Decision != "shadow_deny" {
		return s.deny(ctx, g, id, v)
	}
	// Answered here: nothing more will be spent (the request stays counted).
	if v.Reservation != "" {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		s.policy.Settle(sctx, &request.Settlement{RequestID: adm.RequestID, Tenant: v.Tenant, Reservation: v.Reservation,
			Status: http.StatusOK, Origin: request.OriginGate, End: request.EndComplete})
		cancel()
	}

	var body []byte
	catalog := s.catalog()
	if one {
		if !slices.Contains(catalog, id) || !s.mayCall(ctx, adm, id) {
			e := openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
				"The model '"+request.Truncate(id, MaxModelBytes)+"' does not exist or you do not have access to it.")
			return s.deny(ctx, g, id, request.Verdict{Deny: e, Reason: e.Code, Principal: v.Principal, Tenant: v.Tenant, Timings: v.Timings})
		}
		body, _ = json.Marshal(modelObject(id))
	} else {
		list := openai.ModelList{Object: "list", Data: []openai.Model{}}
		for _, m := range catalog {
			if s.mayCall(ctx, adm, m) {
				list.Data = append(list.Data, modelObject(m))
			}
		}
		body, _ = json.Marshal(list)
	}

	gateTime := time.Since(g.started) - v.Timings.Checks
	decision := cmp.Or(v.Decision, "allow")
	s.metrics.GateDecisions.Add(ctx, 1, s.meters.decisionAttrs(decision, "allowed"))
	s.metrics.GateSeconds.Record(ctx, gateTime.Seconds())
	st := &request.Stamp{
		RequestID: g.headers["x-request-id"],
		Model:     id,
		Principal: v.Principal,
		Tenant:    v.Tenant,
		Status:    http.StatusOK,
		Decision:  decision,
		Reason:    v.Reason,
		Start:     g.started,
		Total:     time.Since(g.started),
		Gateway:   request.GatewayTime{Total: gateTime, Gate: gateTime, Timings: v.Timings},
		Complete:  true,
	}
	st.Bound()
	if sc := s.traceGate(ctx, g, g.policyAt, s.now(), st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	s.record(ctx, st)
	return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK},
			Headers: &extprocv3.HeaderMutation{SetHeaders: append(rateLimitHeaders(v.Metadata),
				setHeader("content-type", "application/json"),
				// The gate's own answer: Envoy's local_reply_config (see
				// envoy/snippet.yaml) leaves responses with it alone.
				setHeader(request.ErrorHeader, ""))},
			Body:    body,
			Details: "infergate_models",
		},
	}}}
}

// mayCall reports whether the caller of adm may call model on any of the
// gate's inference APIs (a tier may allow embeddings only): each is asked
// of the policy as a request to that model, which its memo makes cheap
// after the first listing. The caller checks the model is in the catalog.
func (s *Server) mayCall(ctx context.Context, adm *request.Admission, model string) bool {
	mp, ok := s.policy.(ModelPolicy)
	if !ok {
		return true
	}
	probe := *adm
	probe.Method, probe.Completion, probe.Body = http.MethodPost, true, nil
	probe.Request = openai.Request{Model: model}
	for _, p := range s.opts.CompletionPaths {
		probe.Path, probe.API = p, cmp.Or(openai.APIOf(p), openai.APIChat)
		if mp.Permits(ctx, &probe) {
			return true
		}
	}
	return false
}

// rateLimitHeaders are the policy's x-ratelimit-* values, which Envoy adds
// to admitted responses from the gate's metadata but not to its own answers.
func rateLimitHeaders(md map[string]any) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for k, v := range md {
		if s, ok := v.(string); ok && strings.HasPrefix(k, "x-ratelimit-") {
			out = append(out, setHeader(k, s))
		}
	}
	return out
}

func modelObject(id string) openai.Model {
	return openai.Model{ID: id, Object: "model", Created: modelsCreated, OwnedBy: "infergate"}
}
