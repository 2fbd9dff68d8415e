package admission

import (
	"context"
	"errors"
	"time"

	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// Settle implements request.Policy: the reservation is replaced by what the
// response really used.
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
	case err != nil:
		c.Log.Error("settlement refused; the reservation stays charged until its window ends", "request_id", s.RequestID, "err", err)
		c.Metrics.settleError(ctx)
		return
	}
	c.Metrics.track(tenant, 0, int64(s.PromptTokens+s.CompletionTokens))
	actual := ratelimit.Cost{Requests: 1, InputTokens: int64(s.PromptTokens), OutputTokens: int64(s.CompletionTokens)}
	if !s.Complete && !s.UsageReported && !s.Cut {
		// The meter lost the stream before its end: what it counted is a
		// lower bound. Keep the reservation charged rather than refund
		// tokens that may have been used; it expires with its window. (A
		// stream cut short that the meter saw end is charged what passed:
		// a pool stops generating for a client that left.)
		c.Log.Warn("stream lost before its usage was seen; reservation kept", "request_id", s.RequestID)
		c.Metrics.settled(ctx, actual)
		return
	}
	if err := c.Limiter.Settle(ctx, r, actual); err != nil {
		c.Log.Error("settling a reservation failed; it stays charged until its window ends",
			"request_id", s.RequestID, "err", err)
		c.Metrics.settleError(ctx)
		return
	}
	c.Metrics.settled(ctx, actual)
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
