package request

import (
	"context"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

// Admission is what the gate knows about a request when it decides.
type Admission struct {
	RequestID string
	Method    string
	Path      string
	// Headers have lower-case keys; client x-infergate-* headers (ReservedHeaderPrefix) are removed.
	Headers map[string]string
	// Completion is true for the inference endpoints (gate.paths): the body
	// was parsed into Request, as API reads it. Other requests carry no
	// parsed body.
	Completion bool
	// API is the inference API of a Completion request (chat, completions,
	// embeddings, responses, messages, count_tokens), by its path; ""
	// otherwise. API.Operation() is its OpenTelemetry GenAI operation name.
	API          openai.API
	Request      openai.Request
	Body         []byte
	PromptTokens int // estimated from the prompt text
	// Metadata is the dynamic metadata Envoy forwarded (e.g. the verified
	// JWT payload from jwt_authn), by namespace.
	Metadata map[string]map[string]any
}

// Verdict is a policy's answer. A nil Deny admits the request.
type Verdict struct {
	Deny *openai.Error
	// Headers go on a denial (retry-after, x-ratelimit-*).
	Headers map[string]string
	// Decision is "allow", "deny" or "shadow_deny" (a denial recorded but
	// not enforced); empty means allow or deny by Deny.
	Decision string
	// Reason explains the decision in the stamp and the decision metric.
	Reason    string
	Principal string
	Tenant    string
	// Metadata is added to the gate's dynamic metadata (namespace
	// infergate): read by the meter and by response-header formatters such
	// as %DYNAMIC_METADATA(infergate:x-ratelimit-remaining-tokens)%.
	Metadata map[string]any
	// Reservation is settled by the meter when the response ends.
	Reservation string
	// MaxTokens, when positive, is the max_tokens the request must go
	// upstream with: the policy's cap, for a completion that set none or a
	// larger one. Its reservation counted this much output per choice, so
	// the body carries it and the pool cannot write more. 0 leaves the
	// body's max_tokens as the client sent it.
	MaxTokens int
	// FairnessID and Objective are the policy's fairness_id and objective
	// for an Endpoint Picker ("" when it names none), validated
	// (ValidFairnessID, ValidObjective). With either, the gate sends both
	// to the picker, the fairness id defaulting to the tenant's.
	FairnessID, Objective string
	Timings               Timings
}

// Timings split the gate's time by stage. Checks (e.g. moderation) are
// external calls, kept apart from the gateway's own work.
type Timings struct {
	Auth, Policy, RateLimit, Checks time.Duration
}

// Settlement is what the meter saw of an admitted response when it ended,
// once per request (the answering attempt's, when Envoy retried): facts,
// not a charge. The policy decides what they prove (admission's accounting
// rule: the charge falls only on proof); a zero Settlement proves nothing.
type Settlement struct {
	RequestID   string
	Tenant      string
	Reservation string
	// ClaimUncertain: the gate's field verified, but its single-use claim
	// was not answered (the store slow or down): who called is known,
	// that this stream is the request's only one is not, so nothing it
	// saw proves a charge (the reservation stays whole).
	ClaimUncertain bool
	// API is the request's, as the gate named it ("" when unknown: read as
	// a chat's).
	API openai.API
	// Status is the response's HTTP status (0: none seen).
	Status int
	// Origin is who wrote the response: the pool, Envoy (a local reply:
	// a timeout, no upstream), or unknown when the config does not tell.
	Origin Origin
	SSE    bool // a text/event-stream response
	End    End
	// Terminal: the stream's terminal event was seen ([DONE],
	// response.completed/.incomplete/.failed, message_stop).
	Terminal bool
	// UsageRead: the meter read the pool's usage whole and parsed it
	// (a non-streamed body's top-level usage, a stream's usage events);
	// PromptTokens and CompletionTokens are then its counts, as reported
	// (range-checked by the policy). Without it PromptTokens is the
	// gate's estimate (or an input the pool reported ahead, InputReported)
	// and CompletionTokens is 0.
	UsageRead        bool
	PromptTokens     int
	CompletionTokens int
	// InputReported: PromptTokens is the pool's count, not the gate's
	// estimate (an output-only usage leaves the estimate).
	InputReported bool
	// Events is the content events the meter counted in a stream.
	Events int
	// Who and what, as the stamp names them (range-checked): the key id or
	// JWT subject, for the spend ledger; the model the client asked for and
	// the pool that answered, whose price the cost is settled at.
	Principal, Model, Pool string
	// NeverSent: Envoy answered the request itself before any pool was
	// asked (with Origin OriginEnvoy): its response.code_details is one
	// that proves it (no route, no cluster, no host), with no upstream
	// attempt and no upstream address beside it. Nothing was spent: the
	// reservation is released whole.
	NeverSent bool
	// CachedTokens and CacheWriteTokens are the parts of the pool's
	// PromptTokens read from and written to its prompt cache (0 without
	// UsageRead), priced as such.
	CachedTokens, CacheWriteTokens int
}

// Origin is who wrote a response.
type Origin uint8

const (
	OriginUnknown Origin = iota // the config does not tell
	OriginPool                  // the pool's own answer (Envoy: response.code_details "via_upstream")
	OriginEnvoy                 // Envoy's own local reply
	// OriginGate: infergate's gate answered the request itself (the model
	// listing): no pool was asked, the request alone is spent. Only the
	// gate reports it; the meter never does.
	OriginGate
)

// End is how a response ended, as the meter saw it.
type End uint8

const (
	// EndLost: the meter's stream broke (or nothing said how the response
	// ended); the response may have carried on unseen.
	EndLost End = iota
	// EndCut: Envoy ended the response early, the client or the pool reset
	// it, and closed the meter's stream.
	EndCut
	// EndComplete: the response reached its end.
	EndComplete
)

// Policy decides whether a request may reach an upstream (Admitter), and
// settles what it reserved (Ledger). It is the seam for authentication,
// Rego and rate limits. Implementations must be safe for concurrent use
// and fail closed.
type Policy interface {
	Admitter
	Ledger
}

// Admitter is the gate's half of a Policy.
//
// The gate asks Identify first, as soon as it has the request headers and
// Envoy's metadata, before it waits for the body or parses it: a carries no
// body (Request, Body and PromptTokens are zero). A Verdict with Deny set
// refuses the request there (its Principal, Tenant, Reason and
// Timings.Auth go in the stamp); any other Verdict is not an admission:
// the gate goes on to Decide, which identifies the caller again, so an
// Admitter that cannot tell before the body returns the zero Verdict.
// Authentication thus comes before every check of the request itself: a
// caller without a valid credential learns nothing about its body.
type Admitter interface {
	Identify(ctx context.Context, a *Admission) Verdict
	Decide(ctx context.Context, a *Admission) Verdict
}

// Ledger is the meter's half of a Policy: what a reservation becomes once
// the response is over.
type Ledger interface {
	// Settle charges what a response proved it used (see Settlement).
	Settle(ctx context.Context, s *Settlement)
	// Release gives back whole the reservation of a request the gate
	// admitted and then could not forward: it never reached a pool.
	Release(ctx context.Context, requestID, reservation string)
}

// AllowAll admits every well-formed inference request (gate.paths) and
// answers 404 for other paths.
type AllowAll struct{}

// Identify implements Policy: every caller goes on to Decide.
func (AllowAll) Identify(context.Context, *Admission) Verdict { return Verdict{} }

// Decide implements Policy.
func (AllowAll) Decide(_ context.Context, a *Admission) Verdict {
	if !a.Completion {
		return Verdict{Deny: openai.UnknownURL(a.Method, a.Path), Reason: "unknown_url"}
	}
	return Verdict{Reason: "allow_all"}
}

// Settle implements Policy.
func (AllowAll) Settle(context.Context, *Settlement) {}

// Release implements Policy.
func (AllowAll) Release(context.Context, string, string) {}
