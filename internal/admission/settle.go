package admission

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// The accounting rule: the charge falls only on proof. The gate reserves
// the worst case; a request stays charged its whole reservation unless the
// meter read the pool's own usage (whole, parsed, in range) or counted a
// stream that ended properly (its terminal event seen). Anything else (no
// usage, a usage it could not read, a hang-up before the usage, streamed or
// not, Envoy's local replies such as a 408 or a stream idle timeout, a
// response of unknown shape) keeps the reservation. Two stated exceptions,
// never below what was proved: an error the pool itself answered, read
// whole, with no usage, is charged the request alone (the model wrote
// nothing; only when the meter knows the pool wrote it); counting tokens
// (count_tokens) runs the tokenizer, not the model, and costs the request
// alone, as reserved, as does what the gate answers itself (the model
// listing).
//
// A proven charge is then held between what the meter saw and what the
// request can have used (bound): its output never below the content
// events the meter counted in the stream (each is at least a token) and
// never above the output cap sent upstream for each choice; its input
// never above what the request's body can hold (see
// openai.Request.MaxPromptTokens). Both upper bounds are sealed at
// admission (proofBounds): a pool reporting more is out of range, charged
// the bound and logged.

// maxOverReservation bounds, in tokens, a charge whose request sealed no
// bound (a reservation sealed before bounds were, a body referring to
// input the gate cannot see, a request the gate did not parse): the
// reservation plus the largest context window a model offers today (two
// million tokens), so that no pool or peer moves a counter arbitrarily.
const maxOverReservation = 1 << 21

// maxUsage is the largest count read as a usage: past it (or below 0) the
// usage is out of range, unread, and the reservation stays.
const maxUsage = 1 << 30

// charge applies the accounting rule to what the meter saw of a response,
// given what its request reserved and the bounds its admission sealed.
// keep is true when nothing lowers the reservation (it stays charged
// whole, cost is then reserved); bounded names the bounds the charge was
// held to ("" when none).
func charge(s *request.Settlement, reserved ratelimit.Cost, b proofBounds) (cost ratelimit.Cost, keep bool, bounded string) {
	inRange := func(n int) bool { return n >= 0 && n <= maxUsage }
	switch {
	case s.API == openai.APICountTokens, s.Origin == request.OriginGate:
		// The request alone, as reserved: a count is no usage, and the
		// gate's own answer (the model listing) asks no pool.
		return ratelimit.Cost{Requests: 1}, false, ""
	case s.End == request.EndLost, s.Origin == request.OriginEnvoy:
		return reserved, true, ""
	case s.UsageRead && (!s.SSE || s.Terminal):
		// The pool's own usage: a non-streamed body's is written once
		// the answer is done (a hang-up after it changes nothing); a
		// stream's is final only at the stream's end, and never below
		// the content events the meter counted in it.
		if !inRange(s.PromptTokens) || !inRange(s.CompletionTokens) || !inRange(s.Events) {
			return reserved, true, ""
		}
		out := s.CompletionTokens
		if s.SSE && s.Events > out {
			out, bounded = s.Events, "counted"
		}
		cost = ratelimit.Cost{Requests: 1, InputTokens: int64(s.PromptTokens), OutputTokens: int64(out)}
	case s.SSE && s.Terminal && !s.UsageRead:
		if !inRange(s.PromptTokens) || !inRange(s.Events) {
			return reserved, true, ""
		}
		cost = ratelimit.Cost{Requests: 1, InputTokens: int64(s.PromptTokens), OutputTokens: int64(s.Events)}
	case !s.SSE && !s.UsageRead && s.End == request.EndComplete && s.Origin == request.OriginPool && s.Status >= 400:
		return ratelimit.Cost{Requests: 1}, false, ""
	default:
		return reserved, true, ""
	}
	cost, above := bound(cost, reserved, b)
	if above != "" {
		bounded = strings.TrimPrefix(bounded+","+above, ",")
	}
	return cost, false, bounded
}

// bound holds a charge's tokens to what the request can have used: its
// output to b.MaxOutput, its input to b.MaxInput; a bound not known
// holds them to the reservation plus maxOverReservation (each part, and
// their sum). bounded names the parts held ("input", "output").
func bound(c, reserved ratelimit.Cost, b proofBounds) (_ ratelimit.Cost, bounded string) {
	fallback := reserved.InputTokens + reserved.OutputTokens + maxOverReservation
	maxIn, maxOut := b.MaxInput, b.MaxOutput
	if maxIn < 0 {
		maxIn = fallback
	}
	if c.InputTokens > maxIn {
		c.InputTokens, bounded = maxIn, "input"
	}
	if maxOut < 0 {
		maxOut = max(0, fallback-c.InputTokens)
	}
	if c.OutputTokens > maxOut {
		c.OutputTokens = maxOut
		bounded = strings.TrimPrefix(bounded+",output", ",")
	}
	return c, bounded
}

// reservedCost is what a reservation charged, read from its counters:
// one request, and per token unit, and in money, the most any counter of
// it reserved (a total-tokens counter counts as input, past what the
// input counters say, as its split is not recorded).
func reservedCost(r ratelimit.Reservation) ratelimit.Cost {
	c := ratelimit.Cost{Requests: 1}
	var total int64
	for _, e := range r.Entries {
		switch e.Unit {
		case ratelimit.Money:
			c.Money = max(c.Money, e.Reserved)
		case ratelimit.InputTokens:
			c.InputTokens = max(c.InputTokens, e.Reserved)
		case ratelimit.OutputTokens:
			c.OutputTokens = max(c.OutputTokens, e.Reserved)
		case ratelimit.TotalTokens:
			total = max(total, e.Reserved)
		}
	}
	if total > c.InputTokens+c.OutputTokens {
		c.InputTokens = total - c.OutputTokens
	}
	return c
}

// moneyOf is the cost of the tokens charge proved, at the price of the
// model on the pool that answered, the pool's cached input at the cached
// price (read only from its usage): the same proof as the tokens, the
// same bound (the tokens are bounded, and so is a price). A model with no
// price now (prices reloaded since the reservation) proves no cost: the
// reservation stays, whole (keep).
func (c *Controller) moneyOf(s *request.Settlement, charged, reserved ratelimit.Cost) (money int64, keep bool) {
	if charged.InputTokens == 0 && charged.OutputTokens == 0 {
		return 0, false // the request alone (count_tokens, a pool's error, the gate's answer)
	}
	p, _, ok := c.Prices.Lookup(s.Model, s.Pool)
	if !ok {
		return reserved.Money, true
	}
	cached, written := 0, 0
	if s.UsageRead {
		cached, written = s.CachedTokens, s.CacheWriteTokens
	}
	return p.Cost(price.Tokens{Prompt: int(charged.InputTokens), Cached: cached, CacheWrite: written,
		Completion: int(charged.OutputTokens)}), false
}

// Settle implements request.Policy: the reservation is lowered to what the
// response proved it used (charge), or kept.
func (c *Controller) Settle(ctx context.Context, s *request.Settlement) {
	if c.Limiter == nil || s.Reservation == "" {
		return // nothing reserved, nothing verified to charge
	}
	tenant, r, err := c.openSealed(ctx, s.Reservation)
	switch {
	case errors.Is(err, errForged):
		c.Log.Error("settlement refused: its reservation was not written by infergate, or has expired", "request_id", s.RequestID, "err", err)
		c.Metrics.forged(ctx)
		return
	case errors.Is(err, errReplayed):
		c.Log.Error("settlement refused: its reservation was settled before (a replay)", "request_id", s.RequestID)
		c.Metrics.replayed(ctx)
		return
	case errors.Is(err, errClaimUncertain):
		// Verified, so its tenant is known; whether it settled before is
		// not: kept whole, under its tenant's name.
		c.Log.Error("settlement's claim not answered; the reservation stays charged whole", "request_id", s.RequestID, "err", err)
		c.Metrics.settleError(ctx)
		c.spent(ctx, tenant, s, reservedCost(r.Reservation), false)
		return
	case err != nil:
		c.Log.Error("settlement refused; the reservation stays charged until its window ends", "request_id", s.RequestID, "err", err)
		c.Metrics.settleError(ctx)
		return
	}
	if s.NeverSent && s.Origin == request.OriginEnvoy {
		// Envoy answered before any pool was asked (the meter read its
		// own details): nothing was spent, the reservation goes back
		// whole, requests included, as for a request the gate could not
		// forward.
		c.Log.Warn("Envoy refused an admitted request before any pool was asked; its reservation is released",
			"request_id", s.RequestID, "status", s.Status)
		c.release(ctx, s.RequestID, r.Reservation)
		return
	}
	reserved := reservedCost(r.Reservation)
	actual, keep, bounded := charge(s, reserved, r.proofBounds)
	if bounded != "" {
		// A pool reporting more than the request can have used, or less
		// than the meter counted: charged the bound.
		c.Log.Warn("usage out of the request's bounds; charged the bound", "request_id", s.RequestID,
			"bounded", bounded, "pool", s.Pool, "model", s.Model,
			"prompt_tokens", s.PromptTokens, "completion_tokens", s.CompletionTokens, "events", s.Events,
			"max_input", r.MaxInput, "max_output", r.MaxOutput, "charged_input", actual.InputTokens, "charged_output", actual.OutputTokens)
	}
	if s.ClaimUncertain {
		// The gate's field verified but its single use is unproved: this
		// stream's facts may be a replay's, and prove nothing.
		actual, keep = reserved, true
	}
	if !keep && reserved.Money > 0 {
		if actual.Money, keep = c.moneyOf(s, actual, reserved); keep {
			actual = reserved
		}
	}
	c.Metrics.track(tenant, 0, actual.InputTokens+actual.OutputTokens)
	if keep {
		// Nothing proved a lower charge: the reservation stays charged
		// whole and expires with its window.
		c.Log.Debug("nothing proved the response's cost; reservation kept", "request_id", s.RequestID,
			"end", s.End, "origin", s.Origin, "status", s.Status, "usage_read", s.UsageRead)
		c.Metrics.settled(ctx, actual)
		c.spent(ctx, tenant, s, actual, false)
		return
	}
	if err := c.Limiter.Settle(ctx, r.Reservation, actual); err != nil {
		c.Log.Error("settling a reservation failed; it stays charged until its window ends",
			"request_id", s.RequestID, "err", err)
		c.Metrics.settleError(ctx)
		c.spent(ctx, tenant, s, reserved, false)
		return
	}
	c.Metrics.settled(ctx, actual)
	c.spent(ctx, tenant, s, actual, true)
}

// SpendRecorder learns what each settlement charged (the spend ledger):
// the tenant its seal named, the meter's facts, the charge, and whether
// the charge is the response's proven cost (else: the reservation kept).
// Reserved is told what the budgets a request reserved against have left.
type SpendRecorder interface {
	Charged(ctx context.Context, tenant string, s *request.Settlement, charged ratelimit.Cost, proved bool)
	Reserved(tenant string, states []ratelimit.State)
}

func (c *Controller) spent(ctx context.Context, tenant string, s *request.Settlement, charged ratelimit.Cost, proved bool) {
	if c.Spend != nil {
		c.Spend.Charged(ctx, tenant, s, charged, proved)
	}
}

// Release implements request.Policy: a request the gate admitted and then
// could not forward gives its reservation back whole.
func (c *Controller) Release(ctx context.Context, requestID, reservation string) {
	if c.Limiter == nil || reservation == "" {
		return
	}
	// Opening claims the seal: a released reservation cannot be settled
	// (or released) again.
	_, r, err := c.openSealed(ctx, reservation)
	switch {
	case errors.Is(err, errForged):
		c.Log.Error("release refused: its reservation was not written by infergate, or has expired", "request_id", requestID, "err", err)
		c.Metrics.forged(ctx)
		return
	case errors.Is(err, errReplayed):
		c.Log.Error("release refused: its reservation was settled before (a replay)", "request_id", requestID)
		c.Metrics.replayed(ctx)
		return
	case err != nil:
		c.Log.Error("release refused; the reservation stays charged until its window ends", "request_id", requestID, "err", err)
		c.Metrics.releaseError(ctx)
		return
	}
	c.release(ctx, requestID, r.Reservation)
}

// releaseTimeout bounds a release, which runs on its own context.
const releaseTimeout = 2 * time.Second

// release gives a reservation back whole, requests included, for a
// request denied after it reserved. The stream's context may be gone (a
// client that hung up during a check): the refund must reach the limiter
// anyway. A released reservation counts as settled with no usage, so
// reserved and settled still match once traffic stops.
func (c *Controller) release(ctx context.Context, requestID string, r ratelimit.Reservation) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := c.Limiter.Release(ctx, r); err != nil {
		c.Log.Error("releasing a reservation failed; it stays charged until its window ends",
			"request_id", requestID, "err", err)
		c.Metrics.releaseError(ctx)
		return
	}
	c.Metrics.settled(ctx, ratelimit.Cost{})
}
