// Package admission is the gate's policy: who is calling (API key or
// verified JWT claims), what the Rego policies say, which budgets the
// request reserves, and which external checks it must pass. It implements
// request.Policy; every failure denies (fail closed) unless configured
// otherwise.
package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// Decider evaluates the Rego policies (a *policy.Watcher).
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) (policy.Decision, error)
}

// DefaultOutputReservation is the effective max_tokens of a completion
// that sets none when the policy names no cap and Controller.DefaultMaxTokens
// is not set (config: ratelimit.defaultMaxTokens): the meter settles the
// real count when the stream ends.
const DefaultOutputReservation = 1024

// JWT says where the claims Envoy's jwt_authn filter verified are found
// (payload_in_metadata) and which of them name the tenant and labels.
type JWT struct {
	Enabled     bool
	Namespace   string
	PayloadKey  string
	TenantClaim string
	LabelClaims []string
}

// Controller implements request.Policy.
type Controller struct {
	Keys    *identity.KeySet // nil: no API keys
	JWT     JWT
	Policy  Decider // nil: admit every authenticated completion request
	Limiter ratelimit.Limiter
	Checks  map[string]*Check
	Shadow  bool
	Headers []string // request headers passed to the policy
	Log     *slog.Logger
	Metrics *Metrics
	Now     func() time.Time
	// Seals seals the reservations the gate hands to the meter (every
	// replica that may settle another's must share its keys); nil: a
	// keyring of this process.
	Seals *seal.Keyring
	// Settled lets each reservation settle once (its seal issued, then
	// claimed by a settlement or a release), each tenant within its share
	// (a full share refuses that tenant's request: 429
	// too_many_requests_in_flight); nil: this process's, in memory,
	// bounded (DefaultMaxSettled, seal.DefaultTenantShare per tenant).
	Settled seal.Once
	// LongestStream is how long after its window's end a reservation may
	// still be settled (after: refused, it stays charged); 0:
	// DefaultLongestStream.
	LongestStream time.Duration
	// DefaultMaxTokens is the effective max_tokens of a completion that
	// sets none when the policy names no cap; 0: DefaultOutputReservation.
	DefaultMaxTokens int
	// Spend records what each settlement charged; nil: nothing does.
	Spend SpendRecorder
	// Prices are the models' prices: money limits reserve a request's
	// worst-case cost at them and settle its real cost. nil prices
	// nothing (a money limit then denies).
	Prices *price.Table

	sealsInit, settledInit sync.Once
}

// Identify implements request.Policy: a caller without a valid API key or
// verified JWT claims (when authentication is on) is refused from the
// headers and Envoy's metadata alone, before the gate reads the body.
func (c *Controller) Identify(_ context.Context, a *request.Admission) request.Verdict {
	v, _, _ := c.authenticate(a)
	return v
}

// authenticate is Decide's first step and all of Identify: who is calling,
// the Verdict so far (denied when unauthenticated), and when it finished.
func (c *Controller) authenticate(a *request.Admission) (request.Verdict, identity.Principal, time.Time) {
	var v request.Verdict
	start := c.now()
	p, authErr := c.identify(a)
	v.Principal, v.Tenant = p.ID, p.Tenant
	mark := c.now()
	v.Timings.Auth = mark.Sub(start)
	if authErr != nil {
		v.Deny = openai.NewError(http.StatusUnauthorized, openai.TypeAuthentication, "invalid_api_key", "", authErr.Error())
		v.Reason = "unauthenticated"
	}
	return v, p, mark
}

// Decide implements request.Policy: the steps in order (who is calling,
// the policy, a cost the gate cannot bound, the output cap, the budgets,
// the external checks), the first that denies ending them; then conclude
// applies shadow mode and gives back a denied request's reservation, once.
func (c *Controller) Decide(ctx context.Context, a *request.Admission) request.Verdict {
	// Who is calling: asked again whatever Identify said (the keys may
	// have been reloaded since, and a Decide must never be weaker alone).
	v, p, mark := c.authenticate(a)
	if v.Deny != nil {
		return v // not even shadow mode admits a caller it cannot name
	}
	var reserved *ratelimit.Reservation
	defer func() {
		// Whatever fails once a reservation is held, a panic included,
		// the request never reaches a pool: its reservation goes back whole.
		if r := recover(); r != nil {
			if reserved != nil {
				c.release(ctx, a.RequestID, *reserved)
				c.consume(ctx, v.Reservation)
			}
			panic(r)
		}
	}()
	c.decide(ctx, a, &p, mark, &v, &reserved)
	return c.conclude(ctx, a, p, v, reserved)
}

// decide runs Decide's steps after authentication, recording each one's
// time in v; a step that denies sets v.Deny and ends them. A reservation
// is in *reserved as soon as it is held.
func (c *Controller) decide(ctx context.Context, a *request.Admission, p *identity.Principal, mark time.Time,
	v *request.Verdict, reserved **ratelimit.Reservation) {
	d := c.policyDecision(ctx, a, p)
	now := c.now()
	v.Timings.Policy, mark = now.Sub(mark), now
	v.Reason = d.Reason
	v.FairnessID, v.Objective = d.FairnessID, d.Objective // for an Endpoint Picker
	if !d.Allow {
		v.Deny = policyError(d, a)
		return
	}

	// A cost the gate cannot bound only with the policy's consent: decided
	// here rather than in Rego, so a policy that forgets fails closed.
	if e, field := refuseUnbounded(&a.Request, d.AllowUnbounded); e != nil {
		v.Deny, v.Reason = e, "unbounded_cost:"+field
		return
	}

	// What the request may write per choice: reserved below, and where a
	// cap changed it, sent upstream (the gate rewrites the body). A
	// request under a budget that names no cap goes with the default it
	// reserved: a server's own default (vLLM's: the rest of the context)
	// could write past the reservation, unseen if no usage comes back.
	maxTokens := c.effectiveMaxTokens(a, d.MaxTokens)
	budgeted := len(d.Limits) > 0 && c.Limiter != nil
	if (d.MaxTokens > 0 || budgeted) && maxTokens > 0 && maxTokens != a.Request.MaxTokens {
		v.MaxTokens = maxTokens
	}

	// Budgets: reserve now, settle when the response ends. A refusal
	// holds nothing.
	if budgeted {
		var deny bool
		*reserved, deny = c.reserve(ctx, a, &d, maxTokens, v)
		now = c.now()
		v.Timings.RateLimit, mark = now.Sub(mark), now
		if deny {
			return
		}
	}

	// External checks (moderation): their own time, their own failures.
	if len(d.Checks) > 0 {
		c.runChecks(ctx, a, d.Checks, v)
		v.Timings.Checks = c.now().Sub(mark)
	}
}

// policyDecision is what the policy says of a, a failure to evaluate it
// a denial. With no policy: inference, and the model listing (the gate
// answers it when it knows the models, configured or the pools', each
// listed as Permits says; else it goes on to the route like a completion).
func (c *Controller) policyDecision(ctx context.Context, a *request.Admission, p *identity.Principal) policy.Decision {
	if c.Policy == nil {
		listing := a.Method == http.MethodGet && a.Path == "/v1/models"
		d := policy.Decision{Allow: a.Completion || listing, Reason: "no_policy"}
		if !d.Allow {
			d.Status, d.Reason = http.StatusNotFound, "unknown_url"
		}
		return d
	}
	d, err := c.Policy.Decide(ctx, c.input(a, p))
	if err != nil {
		c.Log.Error("policy evaluation failed; denying", "request_id", a.RequestID, "err", err)
		c.Metrics.policyError(ctx)
		return policy.Decision{Allow: false, Status: http.StatusInternalServerError, Reason: "policy_error"}
	}
	return d
}

// runChecks runs the external checks the policy named, in order, until
// one denies (or is not configured: denied, failing closed).
func (c *Controller) runChecks(ctx context.Context, a *request.Admission, names []string, v *request.Verdict) {
	for _, name := range names {
		ch, ok := c.Checks[name]
		if !ok {
			c.Log.Error("policy requires an unconfigured check; denying", "check", name)
			v.Deny = openai.NewError(http.StatusInternalServerError, openai.TypeServer, "check_unconfigured", "",
				"the gateway's policy requires a check that is not configured")
			v.Reason = "check_unconfigured:" + name
			return
		}
		if e := ch.Run(ctx, a.Body); e != nil {
			v.Deny, v.Reason = e, "check:"+name
			return
		}
	}
}

// conclude is Decide's one exit after authentication: an admitted request
// is counted; a denied one is, in shadow mode, recorded and let through
// with its reservation (the meter settles it like any other), else
// refused with its reservation given back whole (a release, not a
// settlement, which would keep the request counted).
func (c *Controller) conclude(ctx context.Context, a *request.Admission, p identity.Principal, v request.Verdict,
	reserved *ratelimit.Reservation) request.Verdict {
	switch {
	case v.Deny == nil:
		c.Metrics.track(p.Tenant, 1, 0)
		return v
	case c.Shadow:
		return c.shadow(v)
	}
	if reserved != nil {
		c.release(ctx, a.RequestID, *reserved)
		c.consume(ctx, v.Reservation)
		v.Reservation = ""
	}
	return v
}

// shadow records a denial without enforcing it.
func (c *Controller) shadow(v request.Verdict) request.Verdict {
	v.Decision = "shadow_deny"
	v.Reason = cmp.Or(v.Reason, v.Deny.Code)
	v.Headers = nil
	return v
}

// identify finds the principal: verified JWT claims first, then an API key.
func (c *Controller) identify(a *request.Admission) (identity.Principal, error) {
	if c.JWT.Enabled {
		if claims, ok := a.Metadata[c.JWT.Namespace][c.JWT.PayloadKey].(map[string]any); ok {
			return identity.FromClaims(identity.JWTConfig{TenantClaim: c.JWT.TenantClaim, LabelClaims: c.JWT.LabelClaims}, claims), nil
		}
	}
	var keys *identity.Keys
	if c.Keys != nil {
		keys = c.Keys.Load()
	}
	key := identity.KeyFromHeaders(a.Headers["authorization"], a.Headers["x-api-key"])
	switch {
	case keys != nil && key != "":
		p, err := keys.Authenticate(key, c.now())
		if err != nil {
			return identity.Anonymous, err
		}
		return *p, nil
	case keys != nil || c.JWT.Enabled:
		return identity.Anonymous, identity.ErrMissing
	}
	return identity.Anonymous, nil // authentication is off
}

// input builds the documented policy input.
func (c *Controller) input(a *request.Admission, p *identity.Principal) *policy.Input {
	hdrs := make(map[string]string, len(c.Headers))
	for _, h := range c.Headers {
		if v, ok := a.Headers[h]; ok {
			hdrs[h] = v
		}
	}
	labels := p.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	claims := p.Claims
	if claims == nil {
		claims = map[string]any{}
	}
	return &policy.Input{
		Principal: policy.Principal{ID: p.ID, Type: p.Type, Claims: claims, BudgetMonth: p.BudgetMonth},
		Tenant:    p.Tenant,
		Labels:    labels,
		Request: policy.Request{
			Method:                a.Method,
			Path:                  a.Path,
			API:                   string(a.API),
			Headers:               hdrs,
			Model:                 a.Request.Model,
			VirtualModel:          a.Request.Model,
			Stream:                a.Request.Stream,
			MaxTokens:             a.Request.MaxTokens,
			Choices:               choices(a),
			EstimatedPromptTokens: a.PromptTokens,
			PreviousResponseID:    a.Request.PreviousResponseID,
			Background:            a.Request.Background,
			Conversation:          a.Request.Conversation,
			PromptID:              a.Request.PromptID,
			Store:                 a.Request.Store,
		},
		Usage: c.Metrics.usage(p.Tenant),
		Cost:  c.inputCost(a),
	}
}

// inputCost is the request's price and its default reservation, priced
// at the worst, for the policy.
func (c *Controller) inputCost(a *request.Admission) policy.Cost {
	r := reservationCost(reservedPrompt(a), c.effectiveMaxTokens(a, 0), choices(a), nil)
	out := policy.Cost{Reservation: policy.Reservation{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens}}
	if c.Prices != nil {
		out.Currency = c.Prices.Currency
	}
	if p, ok := c.Prices.Worst(a.Request.Model); ok {
		out.Priced = true
		out.Price = policy.Price{Input: p.Input, CachedInput: p.CachedInput, CacheWriteInput: p.CacheWrite, Output: p.Output}
		out.Reservation.Cost = p.Worst(r.InputTokens, r.OutputTokens)
	}
	return out
}

// reservedPrompt is the prompt a request reserves: its estimate, or none
// for count_tokens (counting runs the tokenizer, not the model: the
// request is the cost).
func reservedPrompt(a *request.Admission) int {
	if a.API == openai.APICountTokens {
		return 0
	}
	return a.PromptTokens
}

// unboundedWhy says, for each of openai.Request.Unbounded's fields, why
// the gate cannot bound the cost of a request carrying it.
var unboundedWhy = map[string]string{
	"background":           "a background response is answered before it is generated, without usage",
	"conversation":         "a conversation's stored items are input the gateway cannot see",
	"prompt":               "a stored prompt template is input the gateway cannot see",
	"previous_response_id": "a stored response's earlier turns are input the gateway cannot see",
}

// refuseUnbounded is the refusal of a request carrying a field whose cost
// the gate cannot bound and that the policy's allowed does not name, and
// that field; nil and "" when there is none.
func refuseUnbounded(r *openai.Request, allowed []string) (*openai.Error, string) {
	for field := range r.Unbounded() {
		if !slices.Contains(allowed, field) {
			return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, "unsupported_parameter", field,
				fmt.Sprintf("%s is not accepted by this gateway: %s, so the cost of the request cannot be bounded before it runs",
					field, unboundedWhy[field])), field
		}
	}
	return nil, ""
}

// policyError renders a policy denial in OpenAI's error shape.
func policyError(d policy.Decision, a *request.Admission) *openai.Error {
	status := cmp.Or(d.Status, http.StatusForbidden)
	msg := cmp.Or(d.Reason, "denied by policy")
	switch status {
	case http.StatusUnauthorized:
		return openai.NewError(status, openai.TypeAuthentication, "unauthorized", "", msg)
	case http.StatusNotFound:
		if d.Reason == "unknown_url" {
			return openai.UnknownURL(a.Method, a.Path)
		}
		return openai.NewError(status, openai.TypeInvalidRequest, "not_found", "", msg)
	case http.StatusTooManyRequests:
		return openai.NewError(status, openai.TypeRateLimit, "rate_limit_exceeded", "", msg)
	case http.StatusBadRequest:
		return openai.NewError(status, openai.TypeInvalidRequest, "invalid_request", "", msg)
	}
	if status >= 500 {
		return openai.NewError(status, openai.TypeServer, "policy_error", "", "the gateway could not evaluate its policy")
	}
	return openai.NewError(status, openai.TypePermission, "permission_denied", "", msg)
}

// effectiveMaxTokens is what a request may write per choice: the client's
// max_tokens (the largest of every output cap key it sets, see
// openai.Request.MaxTokens), held to the policy's cap when it names one;
// unset, the cap, else the configured default. Only APIs that generate write tokens:
// other requests (embeddings, count_tokens, the model listing) reserve no
// output. An Admission that names no API is a chat or text completion.
func (c *Controller) effectiveMaxTokens(a *request.Admission, limit int) int {
	asked := a.Request.MaxTokens
	switch {
	case !a.Completion || a.API != "" && !a.API.Generates():
		return 0
	case limit > 0 && (asked <= 0 || asked > limit):
		return limit
	case asked > 0:
		return asked
	case c.DefaultMaxTokens > 0:
		return c.DefaultMaxTokens
	}
	return DefaultOutputReservation
}

// reservationCost is what a request reserves: one request, its estimated
// prompt, and its effective max_tokens for each of the choices completions
// it asks for (n, best_of: each may write up to max_tokens; fewer than 1
// counts as 1). The product saturates at math.MaxInt64, a cost no limit
// admits (ratelimit.ErrTooLarge), rather than wrapping or being clamped
// below the true worst case. A policy's reserve replaces each token figure
// it states, as it states it; one it leaves out (policy.Unset) keeps this
// default.
func reservationCost(promptTokens, maxTokens, choices int, spec *ratelimit.Cost) ratelimit.Cost {
	out := int64(max(maxTokens, 0))
	if n := int64(max(choices, 1)); out > math.MaxInt64/n {
		out = math.MaxInt64
	} else {
		out *= n
	}
	cost := ratelimit.Cost{Requests: 1, InputTokens: int64(max(promptTokens, 0)), OutputTokens: out}
	if spec != nil {
		if spec.InputTokens >= 0 {
			cost.InputTokens = spec.InputTokens
		}
		if spec.OutputTokens >= 0 {
			cost.OutputTokens = spec.OutputTokens
		}
	}
	return cost
}

// choices is how many completions the request asks for (n, best_of, a
// batch of prompts): its output reservation is that many times its
// effective max_tokens.
func choices(a *request.Admission) int { return max(a.Request.Choices, 1) }

// reserve charges the request's budgets. It returns what was reserved
// (nil if nothing) and whether the request is denied (v.Deny set).
func (c *Controller) reserve(ctx context.Context, a *request.Admission, d *policy.Decision, maxTokens int, v *request.Verdict) (*ratelimit.Reservation, bool) {
	cost := reservationCost(reservedPrompt(a), maxTokens, choices(a), d.Reserve)
	if hasMoney(d.Limits) {
		p, ok := c.Prices.Worst(a.Request.Model)
		if !ok {
			// A budget in money cannot bound what an unpriced model
			// costs: refused, not admitted for free.
			c.Log.Error("a money limit applies to a model without a price; denying", "request_id", a.RequestID, "model", a.Request.Model)
			v.Deny = openai.NewError(http.StatusForbidden, openai.TypePermission, "model_not_priced", "model",
				"this gateway budgets in money and the model has no price")
			v.Reason = "model_not_priced"
			return nil, true
		}
		if p.InputOnly && (cost.OutputTokens > 0 || a.API.Generates()) {
			// Priced for input only (an embeddings model): what output
			// would cost is unknown, so no budget in money can bound it.
			c.Log.Error("a money limit applies to a model priced for input only, on an API that generates output; denying",
				"request_id", a.RequestID, "model", a.Request.Model, "api", a.API)
			v.Deny = openai.NewError(http.StatusForbidden, openai.TypePermission, "model_output_not_priced", "model",
				"this gateway budgets in money and the model has no output price: it serves input-only APIs (embeddings) here")
			v.Reason = "model_output_not_priced"
			return nil, true
		}
		if a.API != openai.APICountTokens {
			cost.Money = p.Worst(cost.InputTokens, cost.OutputTokens)
		}
	}
	res, err := c.Limiter.Reserve(ctx, d.Limits, cost)
	if tl := (*ratelimit.TooLargeError)(nil); errors.As(err, &tl) {
		// No window of this budget could ever hold the request's worst
		// case: a 429 would invite retries that cannot succeed.
		c.Metrics.limited(ctx, tl.Limit.Name)
		v.Deny = openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, "request_exceeds_budget", "",
			fmt.Sprintf("This request may cost %s, more than the budget %s allows in any window (%s per %s). "+
				"Lower max_tokens, n or the number of prompts or inputs.",
				c.quantity(tl), tl.Limit.Name, c.amount(&tl.Limit), windowWords(tl.Limit.Window)))
		v.Reason = "request_exceeds_budget:" + tl.Limit.Name
		return nil, true
	}
	if err != nil {
		c.Log.Error("rate limit backend unavailable; denying", "request_id", a.RequestID, "err", err)
		c.Metrics.limiterError(ctx)
		v.Deny = openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "rate_limit_unavailable", "",
			"the gateway cannot check rate limits right now; retry shortly")
		v.Headers = map[string]string{"retry-after": "1"}
		v.Reason = "ratelimit_unavailable"
		return nil, true
	}
	if c.Spend != nil {
		c.Spend.Reserved(v.Tenant, res.States)
	}
	headers := rateLimitHeaders(res.States)
	if !res.Allowed {
		c.Metrics.limited(ctx, res.Exceeded.Name)
		retry := int64(math.Ceil(res.RetryAfter.Seconds()))
		headers["retry-after"] = strconv.FormatInt(max(retry, 1), 10)
		v.Deny = c.exceeded(res.Exceeded, res.RetryAfter)
		v.Headers = headers
		v.Reason = "rate_limited:" + res.Exceeded.Name
		return nil, true
	}
	if v.Reservation, err = c.sealReservation(ctx, v.Tenant, sealedReservation{res.Reservation, boundsOf(a, maxTokens)}); err != nil {
		// The tenant's seals outstanding fill its share (seals leaked, or
		// this many requests in flight): its request is refused, whole,
		// and no other tenant's is touched.
		c.release(ctx, a.RequestID, res.Reservation)
		v.Deny, v.Headers = inFlightError(err), map[string]string{"retry-after": "1"}
		v.Reason = "too_many_requests_in_flight"
		return nil, true
	}
	c.Metrics.reserved(ctx, cost)
	v.Metadata = make(map[string]any, len(headers))
	for k, val := range headers {
		v.Metadata[k] = val
	}
	return &res.Reservation, false
}

// exceeded is the 429 of a budget that is spent for now: a money budget
// answers as OpenAI does when the quota is gone (insufficient_quota), the
// others as its rate limits (rate_limit_exceeded); both say when the
// window resets in words a person reads.
func (c *Controller) exceeded(l *ratelimit.Limit, retry time.Duration) *openai.Error {
	when := "Please try again in " + waitWords(retry) + "."
	if retry > 48*time.Hour {
		when = "It resets " + c.now().Add(retry).UTC().Format("2006-01-02 15:04 MST") + " (in " + waitWords(retry) + ")."
	}
	if l.Unit == ratelimit.Money {
		return openai.NewError(http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota", "",
			fmt.Sprintf("You exceeded your budget %s (%s per %s). %s", l.Name, c.amount(l), windowWords(l.Window), when))
	}
	return openai.NewError(http.StatusTooManyRequests, openai.TypeRateLimit, "rate_limit_exceeded", "",
		fmt.Sprintf("Rate limit reached for %s (%s per %s). %s", l.Name, c.amount(l), windowWords(l.Window), when))
}

// waitWords is how long until a window resets, as a person says it: 850ms,
// 12.5s, 4m10s, 5h56m, 27d5h.
func waitWords(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return shortDuration(d.Round(time.Second))
	case d < 48*time.Hour:
		return shortDuration(d.Round(time.Minute))
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// windowWords names a budget's window: minute, hour, day, week, month, or
// its length (30m, 6h, 1h30m).
func windowWords(w time.Duration) string {
	switch w {
	case ratelimit.Month:
		return "month"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	case 24 * time.Hour:
		return "day"
	case 7 * 24 * time.Hour:
		return "week"
	}
	return shortDuration(w)
}

// shortDuration is d's String without its trailing zero units: 6h, 30m,
// 1h30m, 10s (not 6h0m0s).
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// boundsOf is what a request's admission proves of its charge: its
// output at most the cap sent upstream (maxTokens, which the gate writes
// into the body of every request it reserves for) for each choice, its
// input at most what its body can hold. A request the gate did not parse
// is bounded by neither, and one on a path that names no API (parsed as a
// chat) has no output cap written for it (only known APIs' bodies are
// rewritten: extproc's planGate).
func boundsOf(a *request.Admission, maxTokens int) proofBounds {
	if !a.Completion {
		return unknownBounds
	}
	b := proofBounds{MaxOutput: reservationCost(0, maxTokens, choices(a), nil).OutputTokens, MaxInput: -1}
	if a.API == "" {
		b.MaxOutput = -1
	}
	if n := a.Request.MaxPromptTokens; n > 0 {
		b.MaxInput = int64(n)
	}
	return b
}

// amount is a limit's amount as a client reads it: money as a decimal of
// the currency, the rest as a count of its unit.
func (c *Controller) amount(l *ratelimit.Limit) string {
	if l.Unit == ratelimit.Money {
		cur := ""
		if c.Prices != nil {
			cur = " " + c.Prices.Currency
		}
		return price.FormatCost(l.Amount) + cur
	}
	return strconv.FormatInt(l.Amount, 10) + " " + string(l.Unit)
}

// quantity is a too-large request's worst case as a client reads it, in
// the limit's unit: "at least" it when the arithmetic saturated.
func (c *Controller) quantity(tl *ratelimit.TooLargeError) string {
	q := c.amount(&ratelimit.Limit{Unit: tl.Limit.Unit, Amount: tl.Cost})
	if tl.Saturated() {
		return "at least " + q
	}
	return q
}

// hasMoney reports whether a limit counts money.
func hasMoney(limits []ratelimit.Limit) bool {
	return slices.ContainsFunc(limits, func(l ratelimit.Limit) bool { return l.Unit == ratelimit.Money })
}

// rateLimitHeaders renders OpenAI's x-ratelimit-* headers from the most
// constrained request limit and token limit, and the same for money
// (x-ratelimit-*-money, decimals of the prices' currency).
func rateLimitHeaders(states []ratelimit.State) map[string]string {
	h := map[string]string{}
	var req, tok, money *ratelimit.State
	for i := range states {
		s := &states[i]
		switch s.Limit.Unit {
		case ratelimit.Requests:
			if req == nil || s.Remaining < req.Remaining {
				req = s
			}
		case ratelimit.Money:
			if money == nil || s.Remaining < money.Remaining {
				money = s
			}
		default:
			if tok == nil || s.Remaining < tok.Remaining {
				tok = s
			}
		}
	}
	for suffix, s := range map[string]*ratelimit.State{"requests": req, "tokens": tok, "money": money} {
		if s == nil {
			continue
		}
		format := func(n int64) string { return strconv.FormatInt(n, 10) }
		if s.Limit.Unit == ratelimit.Money {
			format = price.FormatCost
		}
		h["x-ratelimit-limit-"+suffix] = format(s.Limit.Amount)
		h["x-ratelimit-remaining-"+suffix] = format(s.Remaining)
		h["x-ratelimit-reset-"+suffix] = s.Reset.Round(time.Millisecond).String()
	}
	return h
}

// DefaultMaxSettled bounds the seals a Controller without Settled keeps
// outstanding in memory, all tenants' (each holds at most
// seal.DefaultTenantShare of them): past it, new requests are refused
// until some settle or expire.
const DefaultMaxSettled = seal.DefaultMaxOutstanding

// inFlightError is the refusal of a request whose tenant holds as many
// seals outstanding as its share allows (seal.ErrTenantFull: 429), or
// when the whole table is (seal.ErrFull, the last-resort bound: 503).
func inFlightError(err error) *openai.Error {
	if errors.Is(err, seal.ErrTenantFull) {
		return openai.NewError(http.StatusTooManyRequests, openai.TypeRateLimit, "too_many_requests_in_flight", "",
			"too many of this tenant's requests are in flight or were lost on the way; retry once some have finished")
	}
	return openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "too_many_requests_in_flight", "",
		"the gateway holds too many requests in flight; retry shortly")
}

// keyring is Seals, or a keyring of this Controller.
func (c *Controller) keyring() *seal.Keyring {
	c.sealsInit.Do(func() {
		if c.Seals == nil {
			c.Seals = seal.NewKeyring(&seal.MemoryStore{}, seal.Options{Now: c.now})
			_ = c.Seals.Refresh(context.Background()) // a MemoryStore does not fail
		}
	})
	return c.Seals
}

// settled is Settled, or a bounded record of this Controller.
func (c *Controller) settled() seal.Once {
	c.settledInit.Do(func() {
		if c.Settled == nil {
			c.Settled = &seal.MemoryOnce{Max: DefaultMaxSettled, Now: c.now}
		}
	})
	return c.Settled
}

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}
