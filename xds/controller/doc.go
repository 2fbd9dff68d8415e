// Package controller decides the route weights of virtual models from
// their SLA. A virtual model is backed by several inference pools (Envoy
// clusters) ordered by priority; the meter reports one Observation per
// request, and every Interval the caller runs Tick, which moves at most
// Step weight points per virtual model: away from a pool that breaches its
// SLA, and back to a preferred pool once it is healthy again. Weights always
// sum to 100. The package is pure logic: no I/O, an injected clock,
// deterministic output for a given sequence of calls. Another package turns
// the weights into Envoy xDS.
//
// # Length-normalised TTFT
//
// Time to first token is dominated by prefill, and prefill grows with the
// prompt: a 10x longer prompt legitimately takes several times longer to
// its first token. A raw TTFT p95 therefore "breaches" whenever a few
// percent of requests carry long prompts, and a controller judging raw TTFT
// would flap on every burst of long documents. Instead each request's TTFT
// is split into the part its prompt explains and the excess:
//
//	excess_i = TTFT_i - slope * PromptTokens_i
//
// and the TTFT SLA applies to the p95 of excess over the Window. The slope
// is learned per pool by ordinary least squares of TTFT on PromptTokens over
// the longer BaselineWindow (clamped at >= 0), but only when the prompt
// lengths have enough spread to identify it (coefficient of variation of
// prompt tokens > 0.2 and at least 2*MinSamples samples); otherwise the
// configured PrefillPerToken prior is used.
//
// Why this separates the two cases: the fitted line is intercept + slope*x.
// A uniform slowdown (queueing, a throttled GPU, a noisy neighbour) adds the
// same delay to every request whatever its length; it raises the intercept
// and leaves the slope alone, so every request's excess rises and the pool
// breaches. A few long prompts, on the other hand, lie on the line: their
// large raw TTFT is explained by slope*PromptTokens, their excess is as
// small as everyone else's, and nothing happens. If only short prompts slow
// down the fitted slope flattens, which makes their excess larger still, so
// that degradation is caught as well.
//
// # The step
//
// Each Tick judges every pool with at least MinSamples observations in the
// Window; other pools are unknown (neither breached nor healthy). A pool is
// breached when any enabled metric exceeds its threshold and healthy only
// when every enabled metric is below (1-Hysteresis) times its threshold;
// between the two it is held where it is. Per virtual model, one of:
//
//   - shift away: the highest-priority breached pool above the probe floor
//     gives up to Step points to the next pool by priority that is not
//     breached and not in cooldown (lower-priority pools first, then
//     higher-priority ones). It keeps at least ProbeWeight so its recovery
//     can be observed. If no pool can take the traffic, nothing moves.
//   - shift back: otherwise, the highest-priority pool below its initial
//     weight that is healthy, and whose last shift away is at least Cooldown
//     ago, takes up to Step points from the lowest-priority pool above its
//     initial weight.
//
// A Decision is recorded only when weights change.
//
// With ProbeWeight 0 (written NoProbe, since a zero field takes the
// default) a drained pool receives no traffic and can never be judged
// healthy, so once its Cooldown has elapsed it is re-admitted blind with
// Step points and judged again. With a non-zero ProbeWeight the probe
// traffic must be enough to collect MinSamples per Window, or the pool
// stays unknown and is held at the floor.
package controller
