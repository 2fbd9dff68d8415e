package observe

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/tally"
)

// NewMeters records on inst; models, pools and tenants are the names used
// as label values (others are "other"; without any, the first 64 seen).
func NewMeters(inst *Instruments, models, pools, tenants []string) *Meters {
	return &Meters{Instruments: inst, models: newLabelSet(models), pools: newLabelSet(pools), tenants: newLabelSet(tenants)}
}

// Meters records the per-request metrics of both adapters (extproc and the
// dynamic module). Its attribute-set caches belong to one Meters: two in a
// process (tests, benchmarks) share none.
type Meters struct {
	*Instruments
	models    *labelSet
	pools     *labelSet
	tenants   *labelSet
	costs     attrCache[costKey, metric.MeasurementOption]
	stamps    attrCache[stampKey, stampAttrs]
	decisions attrCache[decisionKey, metric.MeasurementOption]
	poolSets  attrCache[poolKey, metric.MeasurementOption]
}

// Record implements request.Sink: the GenAI histograms of admitted requests.
func (ms *Meters) Record(ctx context.Context, s *request.Stamp) {
	if s.Decision == "deny" || s.Unverified {
		// Denials are counted by infergate.gate.decisions; a stamp whose
		// gate field did not verify by infergate.meter.errors: whoever
		// sent it may not write the pools' latencies and usage.
		return
	}
	errType := ""
	if s.Status >= 400 || !s.Complete {
		errType = strconv.Itoa(s.Status)
		if !s.Complete {
			errType = "incomplete"
		}
	}
	sets := ms.stamps.get(stampKey{Operation(s.API), ms.models.label(s.Model, s), ms.pools.label(s.Pool, s), errType}, func(k stampKey) stampAttrs {
		attrs := []attribute.KeyValue{
			attribute.String("gen_ai.operation.name", k.op),
			attribute.String("gen_ai.request.model", k.model),
			attribute.String("infergate.pool", k.pool),
		}
		if k.errType != "" {
			attrs = append(attrs, attribute.String("error.type", k.errType))
		}
		return stampAttrs{
			all:    metric.WithAttributeSet(attribute.NewSet(attrs...)),
			input:  metric.WithAttributeSet(attribute.NewSet(append(attrs, attribute.String("gen_ai.token.type", "input"))...)),
			output: metric.WithAttributeSet(attribute.NewSet(append(attrs, attribute.String("gen_ai.token.type", "output"))...)),
		}
	})
	// A late read's model times are bounds, not measurements (counted as
	// infergate.meter.errors{reason="late_read" or "late_stream"} instead).
	if s.Timing.StreamTimed() {
		ms.RequestSeconds.Record(ctx, s.E2E.Seconds(), sets.all)
	}
	if s.Cost.Currency != "" {
		ms.Cost.Add(ctx, s.Cost.Amount, ms.costAttrs(s))
	}
	ms.GatewaySeconds.Record(ctx, s.Gateway.Total.Seconds(), sets.all)
	if s.Gateway.Checks > 0 {
		ms.ChecksSeconds.Record(ctx, s.Gateway.Checks.Seconds(), sets.all)
	}
	if s.Status >= 400 {
		return
	}
	if !Generates(s.API) {
		// Embeddings: no first token, but the input the pool counted.
		// (count_tokens' count is no usage.)
		if s.API == openai.APIEmbeddings && s.TokenSource == "usage" {
			ms.TokenUsage.Record(ctx, int64(s.PromptTokens), sets.input)
		}
		return
	}
	if s.ContentEvents == 0 {
		return
	}
	if s.Timing.FirstTokenTimed() {
		ms.TTFT.Record(ctx, s.TTFT.Seconds(), sets.all)
	}
	if s.Timing.StreamTimed() && s.CompletionTokens > 1 {
		ms.TimePerToken.Record(ctx, (s.E2E-s.TTFT).Seconds()/float64(s.CompletionTokens-1), sets.all)
	}
	ms.TokenUsage.Record(ctx, int64(s.PromptTokens), sets.input)
	ms.TokenUsage.Record(ctx, int64(s.CompletionTokens), sets.output)
}

// The attribute sets of the per-request metrics, by the labels that vary.
type (
	stampKey    struct{ op, model, pool, errType string }
	stampAttrs  struct{ all, input, output metric.MeasurementOption }
	decisionKey struct{ decision, code string }
	poolKey     struct{ model, pool string }
	costKey     struct{ tenant, model, pool string }
)

// Operation is api's gen_ai.operation.name; "chat" for a request of no
// known API, as every request was labelled before the meter knew others.
func Operation(api openai.API) string {
	if op := api.Operation(); op != "" {
		return op
	}
	return "chat"
}

// PoolAttrs labels a measurement by the stamp's model and pool.
func (ms *Meters) PoolAttrs(s *request.Stamp) metric.MeasurementOption {
	return ms.poolSets.get(poolKey{ms.models.label(s.Model, s), ms.pools.label(s.Pool, s)}, func(k poolKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(
			attribute.String("gen_ai.request.model", k.model), attribute.String("infergate.pool", k.pool)))
	})
}

// costAttrs labels a cost by the stamp's tenant, model and pool, each
// from a bounded set.
func (ms *Meters) costAttrs(s *request.Stamp) metric.MeasurementOption {
	k := costKey{ms.tenants.label(s.Tenant, s), ms.models.label(s.Model, s), ms.pools.label(s.Pool, s)}
	return ms.costs.get(k, func(k costKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("infergate.tenant", k.tenant),
			attribute.String("gen_ai.request.model", k.model), attribute.String("infergate.pool", k.pool)))
	})
}

// maxAttrSets bounds an attrCache: models are named by clients, so their
// number is not; past the bound a set is built for each use, as without
// the cache.
const maxAttrSets = 1024

// attrCache keeps built attribute sets: building one sorts and hashes its
// attributes, which every request would otherwise do for every metric.
type attrCache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

func (c *attrCache[K, V]) get(k K, build func(K) V) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = build(k)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]V{}
	}
	if len(c.m) < maxAttrSets {
		c.m[k] = v
	}
	c.mu.Unlock()
	return v
}

// DecisionAttrs labels a decision by its OpenAI error code: a small, fixed
// set. Reasons are free text (a policy may quote the request) and would
// explode the metric's cardinality; they go to the stamp instead.
func (ms *Meters) DecisionAttrs(decision, code string) metric.MeasurementOption {
	return ms.decisions.get(decisionKey{decision, code}, func(k decisionKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("decision", k.decision), attribute.String("code", k.code)))
	})
}

// Decided counts a gate decision (by its OpenAI error code, or "allowed")
// and times the gate's own processing.
func (ms *Meters) Decided(ctx context.Context, decision, code string, gate time.Duration) {
	ms.GateDecisions.Add(ctx, 1, ms.DecisionAttrs(decision, code))
	ms.GateSeconds.Record(ctx, gate.Seconds())
}

// Generates reports whether api writes output (an unknown API is read as
// a chat's, as before the meter knew others).
func Generates(api openai.API) bool { return api == "" || api.Generates() }

// Stamped records the meter's metrics of a stamped request: what it
// could not time or read, and the inter-token gaps it timed.
func (ms *Meters) Stamped(ctx context.Context, t *tally.Response, st *request.Stamp) {
	switch st.Timing {
	case request.TimingLateRead:
		ms.MeterErrors.Add(ctx, 1, lateReadAttr)
	case request.TimingLateStream:
		ms.MeterErrors.Add(ctx, 1, lateStreamAttr)
	}
	if len(st.Gaps) > 0 && st.Timing.StreamTimed() { // gaps read from a backlog are not the stream's
		set := ms.PoolAttrs(st)
		for _, g := range st.Gaps {
			ms.InterToken.Record(ctx, g.Seconds(), set)
		}
	}
	if t.BadEvents > 0 {
		ms.MeterErrors.Add(ctx, int64(t.BadEvents), metric.WithAttributes(attribute.String("reason", "bad_event")))
	}
	if t.Parser.Dropped > 0 {
		ms.MeterErrors.Add(ctx, int64(t.Parser.Dropped), metric.WithAttributes(attribute.String("reason", "line_too_long")))
	}
	if t.Parser.Overflowed > 0 {
		ms.MeterErrors.Add(ctx, int64(t.Parser.Overflowed), metric.WithAttributes(attribute.String("reason", "event_too_long")))
	}
	if !st.Complete {
		ms.MeterErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "incomplete")))
	}
}

// CountUnsent counts an admitted request Envoy answered itself before any pool
// was asked, by Envoy's response.code_details.
func (ms *Meters) CountUnsent(ctx context.Context, details string) {
	ms.Instruments.Unsent.Add(ctx, 1, metric.WithAttributes(attribute.String("details", details)))
}

var (
	lateReadAttr   = metric.WithAttributes(attribute.String("reason", string(request.TimingLateRead)))
	lateStreamAttr = metric.WithAttributes(attribute.String("reason", string(request.TimingLateStream)))
)
