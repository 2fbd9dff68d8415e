package extproc

import (
	"cmp"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// catalog is what the gate lists on GET /v1/models (internal/gate).
func (s *Server) catalog() gate.Catalog {
	return gate.Catalog{Models: s.opts.Catalog, PoolModels: s.opts.PoolModels, CompletionPaths: s.opts.CompletionPaths}
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
	adm.Path = gate.ModelsPath
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
	if one {
		var listed bool
		if body, listed = s.catalog().One(ctx, s.policy, adm, id); !listed {
			e := openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
				"The model '"+request.Truncate(id, MaxModelBytes)+"' does not exist or you do not have access to it.")
			return s.deny(ctx, g, id, request.Verdict{Deny: e, Reason: e.Code, Principal: v.Principal, Tenant: v.Tenant, Timings: v.Timings})
		}
	} else {
		body = s.catalog().List(ctx, s.policy, adm)
	}

	decision := cmp.Or(v.Decision, "allow")
	st := gate.Answered(gate.Answer{RequestID: g.headers["x-request-id"], Model: id, Status: http.StatusOK,
		Decision: decision, Started: g.started, Took: time.Since(g.started)}, v)
	s.meters.Decided(ctx, decision, "allowed", st.Gateway.Gate)
	if sc := s.traceGate(ctx, g, g.policyAt, s.now(), &st); sc.IsValid() {
		st.TraceID = sc.TraceID().String()
	}
	s.record(ctx, &st)
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
