package extproc

import (
	"context"
	"io"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/telemetry"
)

// Stamp is the one record infergate keeps per request. Times are measured by
// infergate from message arrivals on one ext_proc stream, so transport skew
// between Envoy and infergate cancels; Gateway.Total compares Envoy's
// request.time with infergate's clock and assumes they are in sync.
type Stamp struct {
	RequestID     string
	TraceID       string // OpenTelemetry trace id, when traced
	Principal     string // key id or JWT subject, never a credential
	Tenant        string
	Model         string // the model the client asked for
	ResponseModel string // the model the upstream answered as
	Pool          string // the pool (Envoy cluster) that served it
	// PoolsTried are the pools the attempts went to, in order; the last
	// is Pool. More than one when a retry fell back to the next pool.
	PoolsTried       []string
	Upstream         string // upstream host:port
	Status           int
	Attempts         int
	Stream           bool
	PromptTokens     int
	CompletionTokens int
	TokenSource      string // "usage" (from the model server) or "events" (counted)
	// TTFT is from the request leaving the gateway to the first content
	// token arriving back at Envoy: upstream queueing + prefill + network.
	TTFT time.Duration
	// ITL summarises the gaps between content-bearing chunks.
	ITLP50, ITLP95, ITLMax time.Duration
	ContentEvents          int
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
}

// GatewayTime is the time spent in the gateway before the upstream got the
// request, split by stage.
type GatewayTime struct {
	// Total is Envoy receiving the request to the request leaving for the
	// upstream, less external checks (Timings.Checks), which are neither
	// gateway nor model time.
	Total time.Duration
	Gate  time.Duration // the gate's decision: auth, policy, rate limits, mutations (not checks)
	Timings
}

// Sink receives every stamp. Implementations must not block.
type Sink interface {
	Record(ctx context.Context, s *Stamp)
}

func (s *Server) record(ctx context.Context, st *Stamp) {
	for _, sink := range s.sinks {
		sink.Record(ctx, st)
	}
}

// LogSink writes each stamp as one JSON line ("msg":"request"), exactly as
// log/slog's JSON handler would (time, level, msg, then the fields below),
// but encoded directly: slog formats floats through encoding/json, which
// made this line most of the meter's per-request work.
type LogSink struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewLogSink writes stamps to w, one line each.
func NewLogSink(w io.Writer) *LogSink { return &LogSink{w: w} }

// Record implements Sink.
func (l *LogSink) Record(_ context.Context, s *Stamp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := append(l.buf[:0], `{"time":"`...)
	b = time.Now().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request"`...)
	key := func(k string) { b = append(append(append(b, ',', '"'), k...), '"', ':') } // keys need no escaping
	str := func(k, v string) { key(k); b = appendJSONString(b, v) }
	num := func(k string, v int) { key(k); b = strconv.AppendInt(b, int64(v), 10) }
	flt := func(k string, v float64) { key(k); b = appendJSONFloat(b, v) }
	boolean := func(k string, v bool) { key(k); b = strconv.AppendBool(b, v) }
	str("request_id", s.RequestID)
	str("trace_id", s.TraceID)
	str("principal", s.Principal)
	str("tenant", s.Tenant)
	str("model", s.Model)
	str("response_model", s.ResponseModel)
	str("pool", s.Pool)
	str("upstream", s.Upstream)
	num("status", s.Status)
	num("attempts", s.Attempts)
	b = append(b, `,"pools_tried":`...)
	if s.PoolsTried == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, p := range s.PoolsTried {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, p)
		}
		b = append(b, ']')
	}
	boolean("stream", s.Stream)
	num("prompt_tokens", s.PromptTokens)
	num("completion_tokens", s.CompletionTokens)
	str("token_source", s.TokenSource)
	flt("ttft_ms", ms(s.TTFT))
	flt("itl_p50_ms", ms(s.ITLP50))
	flt("itl_p95_ms", ms(s.ITLP95))
	flt("itl_max_ms", ms(s.ITLMax))
	num("content_events", s.ContentEvents)
	flt("e2e_ms", ms(s.E2E))
	flt("total_ms", ms(s.Total))
	flt("gateway_ms", ms(s.Gateway.Total))
	flt("gate_ms", ms(s.Gateway.Gate))
	flt("auth_ms", ms(s.Gateway.Auth))
	flt("policy_ms", ms(s.Gateway.Policy))
	flt("ratelimit_ms", ms(s.Gateway.RateLimit))
	flt("checks_ms", ms(s.Gateway.Checks))
	str("decision", s.Decision)
	str("reason", s.Reason)
	boolean("complete", s.Complete)
	b = append(b, '}', '\n')
	_, _ = l.w.Write(b)
	if cap(b) <= 16<<10 { // keep a normal line's buffer, not a huge one
		l.buf = b
	}
}

// appendJSONString quotes s as slog's JSON handler does: encoding/json's
// escaping, without escaping HTML.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONFloat formats f as encoding/json does (what slog uses).
func appendJSONFloat(b []byte, f float64) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 to e-9, as encoding/json writes it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// ms renders a duration as milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// metricsSink records the GenAI histograms for admitted requests.
type metricsSink struct{ m *telemetry.Metrics }

func (ms metricsSink) Record(ctx context.Context, s *Stamp) {
	if s.Decision == "deny" {
		return // denials are counted by infergate.gate.decisions
	}
	errType := ""
	if s.Status >= 400 || !s.Complete {
		errType = strconv.Itoa(s.Status)
		if !s.Complete {
			errType = "incomplete"
		}
	}
	sets := stampSets.get(stampKey{s.Model, s.Pool, errType}, func(k stampKey) stampAttrs {
		attrs := []attribute.KeyValue{
			attribute.String("gen_ai.operation.name", "chat"),
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
	ms.m.RequestSeconds.Record(ctx, s.E2E.Seconds(), sets.all)
	ms.m.GatewaySeconds.Record(ctx, s.Gateway.Total.Seconds(), sets.all)
	if s.Gateway.Checks > 0 {
		ms.m.ChecksSeconds.Record(ctx, s.Gateway.Checks.Seconds(), sets.all)
	}
	if s.Status >= 400 || s.ContentEvents == 0 {
		return
	}
	ms.m.TTFT.Record(ctx, s.TTFT.Seconds(), sets.all)
	if s.CompletionTokens > 1 {
		ms.m.TimePerToken.Record(ctx, (s.E2E-s.TTFT).Seconds()/float64(s.CompletionTokens-1), sets.all)
	}
	ms.m.TokenUsage.Record(ctx, int64(s.PromptTokens), sets.input)
	ms.m.TokenUsage.Record(ctx, int64(s.CompletionTokens), sets.output)
}

// The attribute sets of the per-request metrics, by the labels that vary.
type (
	stampKey    struct{ model, pool, errType string }
	stampAttrs  struct{ all, input, output metric.MeasurementOption }
	decisionKey struct{ decision, code string }
	poolKey     struct{ model, pool string }
)

var (
	stampSets    attrCache[stampKey, stampAttrs]
	decisionSets attrCache[decisionKey, metric.MeasurementOption]
	poolSets     attrCache[poolKey, metric.MeasurementOption]
)

// poolAttrs labels a measurement by model and pool.
func poolAttrs(model, pool string) metric.MeasurementOption {
	return poolSets.get(poolKey{model, pool}, func(k poolKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(
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
func decisionAttrs(decision, code string) metric.MeasurementOption {
	return decisionSets.get(decisionKey{decision, code}, func(k decisionKey) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("decision", k.decision), attribute.String("code", k.code)))
	})
}
