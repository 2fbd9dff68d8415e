package observe

import (
	"go.opentelemetry.io/otel/metric"
)

// Instruments are the metrics the gate and the meter record (GenAI
// semantic-convention names, seconds and tokens; then infergate's own).
type Instruments struct {
	TTFT           metric.Float64Histogram // gen_ai.server.time_to_first_token
	TimePerToken   metric.Float64Histogram // gen_ai.server.time_per_output_token
	TokenUsage     metric.Int64Histogram   // gen_ai.client.token.usage
	Cost           metric.Int64Counter     // infergate.cost{tenant,model,pool}: pico-units of the currency
	RequestSeconds metric.Float64Histogram // gen_ai.server.request.duration

	InterToken     metric.Float64Histogram // infergate.inter_token_latency: every gap
	GatewaySeconds metric.Float64Histogram // infergate.gateway.duration: before the upstream got the request
	ChecksSeconds  metric.Float64Histogram // infergate.checks.duration: external checks (moderation), apart
	GateSeconds    metric.Float64Histogram // infergate.gate.duration: the gate's own processing
	GateDecisions  metric.Int64Counter     // infergate.gate.decisions{decision,code}
	MeterStreams   metric.Int64UpDownCounter
	MeterErrors    metric.Int64Counter       // infergate.meter.errors{reason}
	Unsent         metric.Int64Counter       // infergate.meter.unsent{details}
	WaitingBodies  metric.Int64UpDownCounter // infergate.gate.waiting_bodies
	Panics         metric.Int64Counter       // infergate.extproc.panics{role}
}

// Bucket boundaries advised by the GenAI semantic conventions.
var (
	ttftBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	perTokenBuckets = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}
	tokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304}
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	gatewayBuckets  = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25}
)

// NewInstruments registers the Instruments on meter; currency is the
// prices' (its code names the cost's unit).
func NewInstruments(meter metric.Meter, currency string) (*Instruments, error) {
	m := &Instruments{}
	var err error
	var errs []error
	f64 := func(name, unit, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	m.TTFT = f64("gen_ai.server.time_to_first_token", "s",
		"Time from the request reaching the upstream to the first output token.", ttftBuckets)
	m.TimePerToken = f64("gen_ai.server.time_per_output_token", "s",
		"Time per output token after the first, per request.", perTokenBuckets)
	m.RequestSeconds = f64("gen_ai.server.request.duration", "s",
		"Time from the request reaching the upstream to the last byte of the response.", durationBuckets)
	m.InterToken = f64("infergate.inter_token_latency", "s",
		"Every gap between consecutive content-bearing chunks of a streamed response.", perTokenBuckets)
	m.GatewaySeconds = f64("infergate.gateway.duration", "s",
		"Time from Envoy receiving the request to it leaving the gateway for the upstream.", gatewayBuckets)
	m.ChecksSeconds = f64("infergate.checks.duration", "s",
		"External checks (moderation) per request that needed them: neither gateway nor model time.", durationBuckets)
	m.GateSeconds = f64("infergate.gate.duration", "s",
		"The gate's own processing time per request.", gatewayBuckets)
	m.TokenUsage, err = meter.Int64Histogram("gen_ai.client.token.usage", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens used per request, by gen_ai.token.type (input or output)."),
		metric.WithExplicitBucketBoundaries(tokenBuckets...))
	errs = append(errs, err)
	// The GenAI conventions name no cost metric. An integer counter keeps
	// the sum exact: one token at $0.15/M is 150000 pico-dollars.
	m.Cost, err = meter.Int64Counter("infergate.cost", metric.WithUnit("{pico"+currency+"}"),
		metric.WithDescription("What the requests cost at the configured prices, in pico-units (1e-12) of the currency, by tenant, model and pool."))
	errs = append(errs, err)
	m.GateDecisions, err = meter.Int64Counter("infergate.gate.decisions",
		metric.WithDescription("Gate decisions by decision (allow, deny, shadow_deny) and OpenAI error code."))
	errs = append(errs, err)
	m.MeterStreams, err = meter.Int64UpDownCounter("infergate.meter.active_streams",
		metric.WithDescription("Responses the meter is currently observing."))
	errs = append(errs, err)
	m.Panics, err = meter.Int64Counter("infergate.extproc.panics",
		metric.WithDescription("ext_proc streams that panicked and were recovered (gate: answered 503; meter: stream dropped), by role."))
	errs = append(errs, err)
	m.MeterErrors, err = meter.Int64Counter("infergate.meter.errors",
		metric.WithDescription("Events or streams the meter could not fully account, by reason."))
	errs = append(errs, err)
	m.WaitingBodies, err = meter.Int64UpDownCounter("infergate.gate.waiting_bodies",
		metric.WithDescription("Gate streams of identified callers waiting for their request body (bounded per key and per tenant by extproc.maxWaitingBodiesPerPrincipal)."))
	errs = append(errs, err)
	m.Unsent, err = meter.Int64Counter("infergate.meter.unsent",
		metric.WithDescription("Admitted requests Envoy answered itself before any pool was asked (their reservations released), by Envoy's response.code_details."))
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}
