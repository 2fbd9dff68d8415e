package admission

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
)

// Metrics counts admission outcomes. Reserved and settled counts let an
// operator see drift: once traffic stops, every reservation is settled.
type Metrics struct {
	reservations metric.Int64Counter // {state=reserved|settled}
	tokens       metric.Int64Counter // {state=reserved|settled}
	limitedC     metric.Int64Counter // {limit}
	errors       metric.Int64Counter // {op=policy|limiter|settle|release|forged_reservation|replayed_reservation}

	mu     sync.Mutex
	window time.Time
	byTen  map[string]*policy.Usage
}

// NewMetrics registers the instruments on meter.
func NewMetrics(meter metric.Meter) (*Metrics, error) {
	m := &Metrics{byTen: map[string]*policy.Usage{}}
	var err error
	if m.reservations, err = meter.Int64Counter("infergate.ratelimit.reservations",
		metric.WithDescription("Rate-limit reservations made at admission and settled when the response ended, by state.")); err != nil {
		return nil, err
	}
	if m.tokens, err = meter.Int64Counter("infergate.ratelimit.tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens reserved at admission and actually used at settlement, by state.")); err != nil {
		return nil, err
	}
	if m.limitedC, err = meter.Int64Counter("infergate.ratelimit.limited",
		metric.WithDescription("Requests denied by a rate limit, by limit name.")); err != nil {
		return nil, err
	}
	if m.errors, err = meter.Int64Counter("infergate.admission.errors",
		metric.WithDescription("Policy, limiter and settlement failures (each denied or left to expire), by op.")); err != nil {
		return nil, err
	}
	return m, nil
}

var (
	stateReserved = metric.WithAttributes(attribute.String("state", "reserved"))
	stateSettled  = metric.WithAttributes(attribute.String("state", "settled"))
)

func (m *Metrics) reserved(ctx context.Context, c ratelimit.Cost) {
	if m == nil {
		return
	}
	m.reservations.Add(ctx, 1, stateReserved)
	m.tokens.Add(ctx, c.Of(ratelimit.TotalTokens), stateReserved)
}

func (m *Metrics) settled(ctx context.Context, c ratelimit.Cost) {
	if m == nil {
		return
	}
	m.reservations.Add(ctx, 1, stateSettled)
	m.tokens.Add(ctx, c.Of(ratelimit.TotalTokens), stateSettled)
}

func (m *Metrics) limited(ctx context.Context, name string) {
	if m != nil {
		m.limitedC.Add(ctx, 1, metric.WithAttributes(attribute.String("limit", name)))
	}
}

func (m *Metrics) errorOp(ctx context.Context, op string) {
	if m != nil {
		m.errors.Add(ctx, 1, metric.WithAttributes(attribute.String("op", op)))
	}
}

func (m *Metrics) policyError(ctx context.Context)  { m.errorOp(ctx, "policy") }
func (m *Metrics) limiterError(ctx context.Context) { m.errorOp(ctx, "limiter") }
func (m *Metrics) settleError(ctx context.Context)  { m.errorOp(ctx, "settle") }
func (m *Metrics) releaseError(ctx context.Context) { m.errorOp(ctx, "release") }
func (m *Metrics) forged(ctx context.Context)       { m.errorOp(ctx, "forged_reservation") }
func (m *Metrics) replayed(ctx context.Context)     { m.errorOp(ctx, "replayed_reservation") }

// usage is a tenant's requests and tokens in the current minute, as this
// replica saw them: an approximation for policies, not the enforced count.
func (m *Metrics) usage(tenant string) policy.Usage {
	if m == nil || tenant == "" {
		return policy.Usage{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if u := m.byTen[tenant]; u != nil && m.current() {
		return *u
	}
	return policy.Usage{}
}

// track adds a request's use to its tenant's minute.
func (m *Metrics) track(tenant string, requests, tokens int64) {
	if m == nil || tenant == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.current() {
		m.window = time.Now().Truncate(time.Minute)
		clear(m.byTen)
	}
	u := m.byTen[tenant]
	if u == nil {
		u = &policy.Usage{}
		m.byTen[tenant] = u
	}
	u.Requests += requests
	u.Tokens += tokens
}

func (m *Metrics) current() bool { return time.Now().Truncate(time.Minute).Equal(m.window) }
