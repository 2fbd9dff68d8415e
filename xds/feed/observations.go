package feed

import (
	"context"
	"time"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/xds/controller"
)

// Observations turns a stamp into what the controller judges pools by: the
// serving pool's latency and status, and a failure for each pool an
// earlier attempt failed on.
func Observations(st *request.Stamp, observe func(controller.Observation)) {
	if st.Decision == "deny" || st.Unverified || st.Pool == "" {
		return // a forged or replayed stamp moves no weight
	}
	now := time.Now()
	for _, p := range st.PoolsTried[:max(len(st.PoolsTried)-1, 0)] {
		observe(controller.Observation{At: now, VirtualModel: st.Model, Pool: p,
			PromptTokens: st.PromptTokens, Status: controller.FailedAttempt})
	}
	// Times the meter could not vouch for move no weight; the status does.
	o := controller.Observation{At: now, VirtualModel: st.Model, Pool: st.Pool,
		PromptTokens: st.PromptTokens, TTFT: st.TTFT, Status: st.Status, Untimed: !st.Timing.FirstTokenTimed()}
	if st.Timing.StreamTimed() {
		o.ITLP95 = st.ITLP95
	}
	if o.Untimed {
		o.TTFT = 0
	}
	observe(o)
}

// Sink sends every stamp's observations to the shared Redis feed,
// for the controllers of every replica.
func Sink(p *Publisher) request.Sink { return publishSink{p} }

type publishSink struct{ p *Publisher }

func (s publishSink) Record(_ context.Context, st *request.Stamp) { Observations(st, s.p.Publish) }
