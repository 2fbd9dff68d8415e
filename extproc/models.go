package extproc

import (
	"cmp"
	"context"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/infergate/infergate/internal/gate"
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
	g.policyAt = s.now()
	l := s.catalog().Answer(ctx, s.policy, adm, id, one, settleTimeout)
	if l.Refused {
		return s.deny(ctx, g, l.Model, l.V)
	}
	v, body := l.V, l.Body
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
