package request

import (
	"context"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

// Stamp is the one record infergate keeps per request. Times are measured by
// infergate from message arrivals on one ext_proc stream, so transport skew
// between Envoy and infergate cancels; Gateway.Total compares Envoy's
// request.time with infergate's clock and assumes they are in sync.
type Stamp struct {
	RequestID string
	TraceID   string // OpenTelemetry trace id, when traced
	Principal string // key id or JWT subject, never a credential
	Tenant    string
	Model     string // the model the client asked for
	// API is the inference API the request spoke (see Admission.API);
	// API.Operation() is its GenAI operation name (gen_ai.operation.name).
	API           openai.API
	ResponseModel string // the model the upstream answered as
	Pool          string // the pool (Envoy cluster) that served it
	// PoolsTried are the pools the attempts went to, in order; the last
	// is Pool. More than one when a retry fell back to the next pool.
	// The tokens below, and the charge settled, are the last attempt's
	// (the one that answered, on Pool): Envoy retries only before any
	// response reached the client, and a failed attempt charges nothing
	// (see extproc's meter).
	PoolsTried []string
	Upstream   string // upstream host:port: the one that served
	// Endpoint is what an Endpoint Picker (Gateway API Inference
	// Extension) chose for the request: its x-gateway-destination-endpoint
	// (ip:port, or the list tried in order) as the request left it; ""
	// with no picker in the chain. Upstream is the one that served.
	Endpoint         string
	Status           int
	Attempts         int
	Stream           bool
	PromptTokens     int
	CompletionTokens int
	TokenSource      string // "usage" (from the model server) or "events" (counted)
	// CachedTokens and CacheWriteTokens are the parts of PromptTokens the
	// pool's usage says were read from and written to its prompt cache.
	CachedTokens, CacheWriteTokens int
	// Cost is what the request cost at its model's price; zero when the
	// model has none.
	Cost Cost
	// TTFT is from the request leaving the gateway to the first content
	// token arriving back at Envoy: upstream queueing + prefill + network.
	TTFT time.Duration
	// ITL summarises the gaps between content-bearing chunks.
	ITLP50, ITLP95, ITLMax time.Duration
	ContentEvents          int
	// UnreadEvents are stream events the meter skipped: malformed, or
	// longer than meter.maxEventBytes (the response is not affected; its
	// token counts may be).
	UnreadEvents int
	// Start is when Envoy received the request; Sent when it left the
	// gateway for the upstream (zero for requests the gate denied).
	Start, Sent time.Time
	// Total is Envoy receiving the request to the response's last byte:
	// Gateway.Total + Gateway.Checks + E2E.
	Total time.Duration
	// Model time: from the request leaving the gateway to the response's last byte.
	E2E time.Duration
	// Gaps are the inter-token gaps (up to meter.maxTrackedGaps), for the
	// request pages; sinks must not keep a reference they modify.
	Gaps     []time.Duration
	Gateway  GatewayTime
	Decision string
	Reason   string
	// Complete is false when the stream ended before the response did
	// (client gone, upstream reset).
	Complete bool
	// Unverified: the meter had no sealed gate field that verified (none,
	// unsealed, forged, expired or replayed), so nothing says who called:
	// Tenant and Principal are empty, Decision is "unverified", and the
	// stamp feeds no controller.
	Unverified bool
	// Verification is ClaimUncertain when the gate's field verified but
	// its single-use claim was not answered (the store slow or down): the
	// stamp names who called, as the field said, and its reservation
	// stays charged whole; "" otherwise.
	Verification string
	// Timing says whether the meter can vouch for the times above (see
	// Timing); empty for a request the gate answered itself.
	Timing Timing
}

// Timing is whether a stamp's times are measurements or only bounds. Its
// values are few and fixed: a metric label may carry them.
type Timing string

const (
	// TimingOK: the meter's reads agree with Envoy's and the gate's clocks
	// wherever they could be compared.
	TimingOK Timing = "ok"
	// TimingLateRead: the meter read a message later than those clocks
	// allow (infergate was starved or stopped while the request passed):
	// Sent is the gate's answer and TTFT and E2E are upper bounds, not
	// measurements. Such a stamp feeds no latency observation (its status
	// still counts).
	TimingLateRead Timing = "late_read"
	// TimingLateStream: the departure and the first token were read in
	// time, a later read was not (infergate stalled mid-stream): TTFT is a
	// measurement, the gaps and E2E are not.
	TimingLateStream Timing = "late_stream"
)

// FirstTokenTimed says whether the stamp's TTFT is a measurement.
func (t Timing) FirstTokenTimed() bool { return t != TimingLateRead }

// StreamTimed says whether the stamp's gaps and E2E are measurements.
func (t Timing) StreamTimed() bool { return t == TimingOK || t == "" }

// Cost is a request's cost, exact: Amount pico-units (10⁻¹² of
// Currency), computed from the stamp's tokens at the price named by Price.
type Cost struct {
	Amount   int64
	Currency string // ISO 4217; "" when the request was not priced
	Price    string // the price used: "model", or "pool" (the model's on its pool)
	// Counted: the tokens priced are what the meter counted (TokenSource
	// "events"), not the pool's usage.
	Counted bool
}

// GatewayTime is the time spent in the gateway before the upstream got the
// request, split by stage.
type GatewayTime struct {
	// Total is Envoy receiving the request to the request leaving for the
	// upstream, less external checks (Timings.Checks), which are neither
	// gateway nor model time.
	Total time.Duration
	Gate  time.Duration // the gate's decision: auth, policy, rate limits, mutations (not checks)
	// Picker is an Endpoint Picker's, when one sat between the gate and
	// the meter (Stamp.Endpoint set): from the gate's answer to the meter
	// reading the request's headers after the picker chose, both on
	// infergate's clock (0: no picker, or not measured). Part of Total.
	Picker time.Duration
	Timings
}

// Sink receives every stamp. Implementations must not block.
type Sink interface {
	Record(ctx context.Context, s *Stamp)
}

// ClaimUncertain is Stamp.Verification of a request whose gate field
// verified and whose claim the store did not answer.
const ClaimUncertain = "claim_uncertain"
