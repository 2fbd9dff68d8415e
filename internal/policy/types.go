// Package policy evaluates infergate's Rego policies (package
// infergate.authz and infergate.ratelimit under policies/) with OPA's
// evaluator: a directory is loaded and its own tests run (load.go), one
// query is compiled (compile.go) and evaluated per decision, memoized on
// the fields it reads (engine.go, memo.go), its answer read into a Decision
// (answer.go); a Watcher reloads on change and never replaces a good
// version by a broken one (watch.go).
package policy

import (
	"github.com/infergate/infergate/internal/ratelimit"
)

// Input is the policy input, documented in docs/policy-input.schema.json.
// Field names are the JSON keys a policy reads as input.*.
type Input struct {
	Principal Principal         `json:"principal"`
	Tenant    string            `json:"tenant"`
	Labels    map[string]string `json:"labels"`
	Request   Request           `json:"request"`
	// Usage is the caller's current usage as this replica last saw it.
	Usage Usage `json:"usage"`
	// Cost is the request's price and what its reservation may cost.
	Cost Cost `json:"cost"`
}

// Cost is what a request may cost, in the prices' currency: its model's
// price and the gate's default reservation, priced at the worst.
type Cost struct {
	Currency string `json:"currency"`
	// Priced is whether the model has a price (config prices:); without
	// one, Price and Reservation.Cost are 0 and a money limit denies.
	Priced bool  `json:"priced"`
	Price  Price `json:"price"`
	// Reservation is what the gate reserves unless the policy caps
	// max_tokens or sets reserve (the gate then reserves, and prices, its
	// own figures).
	Reservation Reservation `json:"reservation"`
}

// Price is a model's price per million tokens, in micro-units of the
// currency (0.15 is 150000): the dearest, field by field, of the model's
// own price and its prices on pools, as the pool is not chosen yet.
type Price struct {
	Input           int64 `json:"input"`
	CachedInput     int64 `json:"cached_input"`
	CacheWriteInput int64 `json:"cache_write_input"`
	Output          int64 `json:"output"`
}

// Reservation is the tokens a request reserves and their worst-case cost.
type Reservation struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Cost is in pico-units of the currency (10⁻¹²), the unit of money
	// limits: every input token at the dearest input price, every output
	// token at the output price.
	Cost int64 `json:"cost"`
}

// Principal is who is calling.
type Principal struct {
	ID     string         `json:"id"`     // key id or JWT subject; never the key itself
	Type   string         `json:"type"`   // "api_key", "jwt" or "anonymous"
	Claims map[string]any `json:"claims"` // verified JWT claims (empty for API keys)
	// BudgetMonth is the API key's own monthly budget (its entry's
	// budgetMonth), in pico-units of the currency; 0 when it has none.
	BudgetMonth int64 `json:"budget_month"`
}

// Request is what is being asked for.
type Request struct {
	Method string `json:"method"`
	Path   string `json:"path"` // normalised: lower-case, no query, no duplicate slashes
	// API is the inference API of the request (openai.API: chat,
	// completions, embeddings, responses, messages, count_tokens); "" for
	// other paths.
	API                   string            `json:"api"`
	Headers               map[string]string `json:"headers"`
	Model                 string            `json:"model"`
	VirtualModel          string            `json:"virtual_model"`
	Stream                bool              `json:"stream"`
	MaxTokens             int               `json:"max_tokens"` // the largest output cap the client set under any key its API's servers read; 0 when unset
	Choices               int               `json:"choices"`    // completions asked for (n, best_of, prompts in a batch); at least 1
	EstimatedPromptTokens int               `json:"estimated_prompt_tokens"`
	// PreviousResponseID is a Responses request's previous_response_id:
	// the stored conversation it continues; "" when unset.
	PreviousResponseID string `json:"previous_response_id"`
	// Background, Conversation, PromptID and Store are a Responses
	// request's background, conversation id, prompt (template) id and
	// store (true unless set false); false, "", "" and false for other
	// APIs. With previous_response_id, the first three make a cost the
	// gate cannot bound: see Decision.AllowUnbounded.
	Background   bool   `json:"background"`
	Conversation string `json:"conversation"`
	PromptID     string `json:"prompt_id"`
	Store        bool   `json:"store"`
}

// Usage is a tenant's standing in the current minute.
type Usage struct {
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
}

// Decision is what the policies answer (see policies/README.md).
type Decision struct {
	Allow bool // infergate.authz.allow
	// Reason is infergate.authz.reason, else "denied by policy" or
	// "allowed by policy".
	Reason string
	// Status is the HTTP status for a denial: infergate.authz.status
	// (400-599), default 403; 0 when allowed.
	Status int
	// Limits are the budgets that apply (from infergate.ratelimit.limits),
	// validated: known unit, positive amount, window of at least 1s.
	Limits []ratelimit.Limit
	// MaxTokens is the cap on a completion's max_tokens
	// (infergate.authz.max_tokens, a positive integer); 0 when the policy
	// names none. The gate reserves it for, and sends it upstream with, a
	// request that sets no max_tokens or a larger one.
	MaxTokens int
	// Reserve overrides the tokens reserved at admission, when the policy
	// sets infergate.ratelimit.reserve; nil means the gate's default
	// (estimated prompt + effective max_tokens × choices). A field the
	// policy leaves out is Unset and keeps the gate's default for it;
	// Requests is 1.
	Reserve *ratelimit.Cost
	// Checks are external checks the request must pass
	// (infergate.authz.checks), sorted, without duplicates; nil if none.
	Checks []string
	// AllowUnbounded names the request fields whose unboundable cost the
	// policy accepts (infergate.authz.allow_unbounded, a set of
	// UnboundedFields), sorted, without duplicates; nil if none. The gate
	// refuses a request carrying any other (openai.Request.Unbounded).
	AllowUnbounded []string
	// FairnessID and Objective are what the gate tells an Endpoint Picker
	// (infergate.authz.fairness_id and .objective): the flow the request
	// is queued in, and the InferenceObjective (its priority) it runs
	// under. "" when the policy names none; validated
	// (request.ValidFairnessID, request.ValidObjective).
	FairnessID, Objective string
}

// UnboundedFields are the request fields that make a cost the gate cannot
// bound before the request runs (openai.Request.Unbounded): what
// infergate.authz.allow_unbounded may name.
var UnboundedFields = []string{"background", "conversation", "prompt", "previous_response_id"}

// Unset marks a field of Decision.Reserve the policy left out: the gate
// fills it in (it alone knows the configured default output).
const Unset = -1
