package extproc

import (
	"context"

	"github.com/infergate/infergate/internal/openai"
)

// Admission is what the gate knows about a request when it decides.
type Admission struct {
	RequestID    string
	Method       string
	Path         string
	Headers      map[string]string // lower-case keys; client x-infergate-* already removed
	Request      openai.Request
	PromptTokens int // estimated from the prompt text
}

// Verdict is a policy's answer. A nil Deny admits the request.
type Verdict struct {
	Deny *openai.Error
	// Headers are added to a denial (e.g. retry-after, x-ratelimit-*).
	Headers map[string]string
	// Reason explains the decision in the stamp and the decision metric.
	Reason string
}

// Policy decides whether an admitted-so-far request may reach an upstream.
// It is the seam for authentication, Rego authorization and rate limits.
// Implementations must be safe for concurrent use and fail closed.
type Policy interface {
	Decide(ctx context.Context, a *Admission) Verdict
}

// AllowAll admits every well-formed request.
type AllowAll struct{}

// Decide implements Policy.
func (AllowAll) Decide(context.Context, *Admission) Verdict { return Verdict{Reason: "allow_all"} }
