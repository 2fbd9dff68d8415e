package extproc

import (
	"context"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// record hands st to every sink; the caller has bounded it (request.Stamp.Bound).
func (s *Server) record(ctx context.Context, st *request.Stamp) {
	for _, sink := range s.sinks {
		sink.Record(ctx, st)
	}
}

// meters records the per-request metrics. Its attribute-set caches belong
// to one Server: two Servers in a process (tests, benchmarks) share none.
type meters struct {
	m         *instruments
	models    *labelSet
	pools     *labelSet
	tenants   *labelSet
	costs     attrCache[costKey, metric.MeasurementOption]
	stamps    attrCache[stampKey, stampAttrs]
	decisions attrCache[decisionKey, metric.MeasurementOption]
	poolSets  attrCache[poolKey, metric.MeasurementOption]
}

// Record implements request.Sink: the GenAI histograms of admitted requests.
func (ms *meters) Record(ctx context.Context, s *request.Stamp) {
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
	sets := ms.stamps.get(stampKey{operation(s.API), ms.models.label(s.Model, s), ms.pools.label(s.Pool, s), errType}, func(k stampKey) stampAttrs {
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
		ms.m.RequestSeconds.Record(ctx, s.E2E.Seconds(), sets.all)
	}
	if s.Cost.Currency != "" {
		ms.m.Cost.Add(ctx, s.Cost.Amount, ms.costAttrs(s))
	}
	ms.m.GatewaySeconds.Record(ctx, s.Gateway.Total.Seconds(), sets.all)
	if s.Gateway.Checks > 0 {
		ms.m.ChecksSeconds.Record(ctx, s.Gateway.Checks.Seconds(), sets.all)
	}
	if s.Status >= 400 {
		return
	}
	if !generates(s.API) {
		// Embeddings: no first token, but the input the pool counted.
		// (count_tokens' count is no usage.)
		if s.API == openai.APIEmbeddings && s.TokenSource == "usage" {
			ms.m.TokenUsage.Record(ctx, int64(s.PromptTokens), sets.input)
		}
		return
	}
	if s.ContentEvents == 0 {
		return
	}
	if s.Timing.FirstTokenTimed() {
		ms.m.TTFT.Record(ctx, s.TTFT.Seconds(), sets.all)
	}
	if s.Timing.StreamTimed() && s.CompletionTokens > 1 {
		ms.m.TimePerToken.Record(ctx, (s.E2E-s.TTFT).Seconds()/float64(s.CompletionTokens-1), sets.all)
	}
	ms.m.TokenUsage.Record(ctx, int64(s.PromptTokens), sets.input)
	ms.m.TokenUsage.Record(ctx, int64(s.CompletionTokens), sets.output)
}

// The attribute sets of the per-request metrics, by the labels that vary.
type (
	stampKey    struct{ op, model, pool, errType string }
	stampAttrs  struct{ all, input, output metric.MeasurementOption }
	decisionKey struct{ decision, code string }
	poolKey     struct{ model, pool string }
	costKey     struct{ tenant, model, pool string }
)

// operation is api's gen_ai.operation.name; "chat" for a request of no
// known API, as every request was labelled before the meter knew others.
func operation(api openai.API) string {
	if op := api.Operation(); op != "" {
		return op
	}
	return "chat"
}

// poolAttrs labels a measurement by the stamp's model and pool.
func (ms *meters) poolAttrs(s *request.Stamp) metric.MeasurementOption {
	return ms.poolSets.get(poolKey{ms.models.label(s.Model, s), ms.pools.label(s.Pool, s)}, func(k poolKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(
			attribute.String("gen_ai.request.model", k.model), attribute.String("infergate.pool", k.pool)))
	})
}

// costAttrs labels a cost by the stamp's tenant, model and pool, each
// from a bounded set.
func (ms *meters) costAttrs(s *request.Stamp) metric.MeasurementOption {
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

// decisionAttrs labels a decision by its OpenAI error code: a small, fixed
// set. Reasons are free text (a policy may quote the request) and would
// explode the metric's cardinality; they go to the stamp instead.
func (ms *meters) decisionAttrs(decision, code string) metric.MeasurementOption {
	return ms.decisions.get(decisionKey{decision, code}, func(k decisionKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("decision", k.decision), attribute.String("code", k.code)))
	})
}
