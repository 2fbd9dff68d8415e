package gate

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

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// ModelsPath is OpenAI's model listing; ModelsPath/{id} retrieves one.
// With a Catalog the gate answers both itself (GET only): no pool sees
// them.
const ModelsPath = "/v1/models"

// modelsCreated is every listed model's "created": the gateway does not
// know when a model was made, and a fixed value keeps answers stable.
const modelsCreated = 1735689600 // 2025-01-01T00:00:00Z

// ModelPolicy is a request.Admitter that can also tell, without reserving
// budgets or running checks, whether it would admit a request. The gate
// asks it, per model, which models a caller of GET /v1/models may call. A
// policy without it admits every well-formed inference request, so it is
// listed every model.
type ModelPolicy interface {
	request.Admitter
	Permits(ctx context.Context, a *request.Admission) bool
}

// Catalog is what the gate lists on GET /v1/models: the configured models
// or, without them, what the pools serve now; each to the callers the
// policy lets call it on one of the gate's inference APIs.
type Catalog struct {
	Models          []string
	PoolModels      func() []string // called per listing; the slice is not modified
	CompletionPaths []string        // the inference paths a model is asked about
}

// Request reports whether the gate answers this request itself: a GET of
// the listing, or of one model (id, path-unescaped: ids may hold slashes,
// e.g. meta-llama/Llama-3.1-8B). Without models to list, none.
func (c Catalog) Request(method, path string) (id string, one, ok bool) {
	if method != http.MethodGet || len(c.Models) == 0 && c.PoolModels == nil {
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

// models is what the gate lists now.
func (c Catalog) models() []string {
	if len(c.Models) > 0 || c.PoolModels == nil {
		return c.Models
	}
	return c.PoolModels()
}

// List is the body of the listing: the models the caller of adm may call.
func (c Catalog) List(ctx context.Context, p request.Admitter, adm *request.Admission) []byte {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, m := range c.models() {
		if c.mayCall(ctx, p, adm, m) {
			list.Data = append(list.Data, modelObject(m))
		}
	}
	body, _ := json.Marshal(list)
	return body
}

// One is the body of one model's retrieval, or false when the caller of
// adm is not listed it (or it is not in the catalog): answered 404.
func (c Catalog) One(ctx context.Context, p request.Admitter, adm *request.Admission, id string) ([]byte, bool) {
	if !slices.Contains(c.models(), id) || !c.mayCall(ctx, p, adm, id) {
		return nil, false
	}
	body, _ := json.Marshal(modelObject(id))
	return body, true
}

// mayCall reports whether the caller of adm may call model on any of the
// gate's inference APIs (a tier may allow embeddings only): each is asked
// of the policy as a request to that model, which its memo makes cheap
// after the first listing. The caller checks the model is in the catalog.
func (c Catalog) mayCall(ctx context.Context, p request.Admitter, adm *request.Admission, model string) bool {
	mp, ok := p.(ModelPolicy)
	if !ok {
		return true
	}
	probe := *adm
	probe.Method, probe.Completion, probe.Body = http.MethodPost, true, nil
	probe.Request = openai.Request{Model: model}
	for _, path := range c.CompletionPaths {
		probe.Path, probe.API = path, cmp.Or(openai.APIOf(path), openai.APIChat)
		if mp.Permits(ctx, &probe) {
			return true
		}
	}
	return false
}

func modelObject(id string) openai.Model {
	return openai.Model{ID: id, Object: "model", Created: modelsCreated, OwnedBy: "infergate"}
}

// Listed is the gate's answer to a request Catalog.Request said is its own.
type Listed struct {
	Model string          // the id asked for (bounded), "" for the listing
	V     request.Verdict // the policy's; Refused: V.Deny is the answer
	// Refused: the request is denied (by the policy, or the id is too
	// long or not listed to the caller); else Body is the 200's.
	Refused bool
	Body    []byte
}

// Answer decides a listing request of adm (id and one from Request): the
// id bounded before anything reads it, the policy asked as for any
// request (authentication, its say on the listing, its budgets, on
// ModelsPath: retrieving one model is decided as the listing, which is
// what it reveals), a reservation settled at once (nothing more will be
// spent), and the body listed.
func (c Catalog) Answer(ctx context.Context, p request.Policy, adm *request.Admission, id string, one bool, settleTimeout time.Duration) Listed {
	// The id is the client's (a path may be tens of KiB): refused past the
	// bound a body's model has, before the policy, the stamp or the log.
	if len(id) > MaxModelBytes {
		e := openai.BadRequest("invalid_value", "model",
			"model is "+strconv.Itoa(len(id))+" bytes long; the limit is "+strconv.Itoa(MaxModelBytes))
		return Listed{Model: request.Truncate(id, MaxModelBytes), V: request.Verdict{Deny: e, Reason: e.Code}, Refused: true}
	}
	adm.Path = ModelsPath
	v := p.Decide(ctx, adm)
	if v.Deny != nil && v.Decision != "shadow_deny" {
		return Listed{Model: id, V: v, Refused: true}
	}
	if v.Reservation != "" {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		p.Settle(sctx, &request.Settlement{RequestID: adm.RequestID, Tenant: v.Tenant, Reservation: v.Reservation,
			Status: http.StatusOK, Origin: request.OriginGate, End: request.EndComplete})
		cancel()
	}
	if !one {
		return Listed{V: v, Body: c.List(ctx, p, adm)}
	}
	body, listed := c.One(ctx, p, adm, id)
	if !listed {
		e := openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
			"The model '"+request.Truncate(id, MaxModelBytes)+"' does not exist or you do not have access to it.")
		return Listed{Model: id, V: request.Verdict{Deny: e, Reason: e.Code, Principal: v.Principal, Tenant: v.Tenant, Timings: v.Timings}, Refused: true}
	}
	return Listed{Model: id, V: v, Body: body}
}
