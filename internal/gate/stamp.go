package gate

import (
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// The gate's stamps are built here and in PlanOf: a request the gate
// answered itself is stamped whole by Answered; an admitted one starts
// from its Plan's stamp, which the meter completes.

// Answer is a request the gate answered itself (a denial, the model
// listing), as its stamp tells it.
type Answer struct {
	RequestID, Model string
	API              openai.API
	Status           int
	Decision         string
	Started          time.Time     // the gate read the request
	Took             time.Duration // from Started to the answer
}

// Answered is the stamp of a request the gate answered itself, bounded:
// complete at the gate, its time the gateway's but the external checks'
// (moderation is neither gateway nor model time). Who called and the
// policy's reason and timings are v's.
func Answered(a Answer, v request.Verdict) request.Stamp {
	gate := a.Took - v.Timings.Checks
	st := request.Stamp{
		RequestID: a.RequestID,
		Model:     a.Model,
		API:       a.API,
		Principal: v.Principal,
		Tenant:    v.Tenant,
		Status:    a.Status,
		Decision:  a.Decision,
		Reason:    v.Reason,
		Start:     a.Started,
		Total:     a.Took,
		Gateway:   request.GatewayTime{Total: gate, Gate: gate, Timings: v.Timings},
		Complete:  true,
	}
	st.Bound() // before the span, the log and the sinks see it
	return st
}
