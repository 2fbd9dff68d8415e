package spend

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// Ledger records what each settlement charged (admission's SpendRecorder)
// and reports it.
type Ledger struct {
	Store  Store
	Prices *price.Table // nil: every cost is 0
	// Team is a key id's team ("" when none); nil: no teams.
	Team func(keyID string) string
	// KeyInfo is a key id's name and owner (both "" when none); nil:
	// none. A report grouped by key shows them beside the id.
	KeyInfo func(keyID string) (name, owner string)
	Now     func() time.Time // nil: time.Now
	Log     *slog.Logger

	budgets         budgets
	misses, lastLog atomic.Int64
}

// Reserved notes what the budgets a request of tenant's reserved against
// have left (admission's SpendRecorder): the page's "budget left".
func (l *Ledger) Reserved(tenant string, states []ratelimit.State) {
	l.budgets.seen(tenant, states, l.now())
}

// Charged records a settlement of tenant's: s is what the meter saw,
// charged what the limiter was charged, proved whether that is the
// response's proven usage (else: the reservation kept, whose input is
// priced as uncached, as nothing proved a cache read).
func (l *Ledger) Charged(ctx context.Context, tenant string, s *request.Settlement, charged ratelimit.Cost, proved bool) {
	k := Key{Tenant: tenant, KeyID: s.Principal, Model: s.Model}
	if l.Team != nil && s.Principal != "" {
		k.Team = l.Team(s.Principal)
	}
	a := amountOf(s, charged, proved, l.Prices)
	if err := l.Store.Add(ctx, Hour(l.now()), k, a); err != nil {
		l.missed(s.RequestID, err)
	}
}

// missed logs a settlement the store did not take: at most every 10 s,
// with how many were missed since (a Redis outage must not flood the log).
func (l *Ledger) missed(requestID string, err error) {
	n := l.misses.Add(1)
	now := l.now().Unix()
	if last := l.lastLog.Load(); now-last < 10 || !l.lastLog.CompareAndSwap(last, now) || l.Log == nil {
		return
	}
	l.misses.Add(-n)
	l.Log.Warn("spend ledger: settlements not recorded (the budgets were charged; the spend page misses them)",
		"missed", n, "request_id", requestID, "err", err)
}

// amountOf is what a charge adds to the ledger: its requests and tokens,
// and their cost: what a money budget charged, else the tokens at the
// model's price on the pool that served it.
func amountOf(s *request.Settlement, c ratelimit.Cost, proved bool, prices *price.Table) Amount {
	t := price.Tokens{Prompt: tokens(c.InputTokens), Completion: tokens(c.OutputTokens)}
	if proved {
		t.Cached, t.CacheWrite = s.CachedTokens, s.CacheWriteTokens
	}
	a := Amount{Requests: c.Requests, InputTokens: int64(t.Prompt), OutputTokens: int64(t.Completion)}
	if t.Prompt > 0 {
		a.CachedTokens = int64(min(max(t.Cached, 0), t.Prompt))
	}
	switch p, _, ok := prices.Lookup(s.Model, s.Pool); {
	case c.Money > 0:
		// A money budget charged it: its own amount (a kept reservation
		// is the worst-case cost reserved, not a guess from its tokens).
		a.Cost = c.Money
	case ok:
		a.Cost = p.Cost(t)
	}
	return a
}

// tokens is a charged count as price.Tokens holds it: never negative, and
// never clamped (price.Price.Cost saturates).
func tokens(n int64) int { return int(max(n, 0)) }

// Report answers q from the store.
func (l *Ledger) Report(ctx context.Context, q Query) (Report, error) {
	hours, err := l.Store.Hours(ctx, FirstHour(q), LastHour(q))
	if err != nil {
		return Report{}, err
	}
	r := Build(q, hours)
	if l.KeyInfo != nil && slices.Contains(q.By, ByKey) {
		for i := range r.Rows {
			if id := r.Rows[i].KeyID; id != "" && id != Other {
				r.Rows[i].KeyName, r.Rows[i].KeyOwner = l.KeyInfo(id)
			}
		}
	}
	r.Budgets = l.budgets.left(q.now())
	if l.Prices != nil {
		r.Currency = l.Prices.Currency
	}
	return r, nil
}

func (l *Ledger) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}
