package spend

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/ratelimit"
)

// BudgetLeft is what a budget had left when this replica last admitted a
// request under it (its reservation counted: a conservative figure, the
// settlement may give some back); once its window has ended, all of it.
type BudgetLeft struct {
	Tenant string        `json:"tenant"`
	Name   string        `json:"name"`
	Key    string        `json:"key"`
	Unit   string        `json:"unit"`
	Amount int64         `json:"amount"`
	Window time.Duration `json:"window_ns"`
	// Per is Window as a person says it ("per day", "per month").
	Per       string    `json:"per"`
	Remaining int64     `json:"remaining"`
	Resets    time.Time `json:"resets"`
	Seen      time.Time `json:"seen"`
}

// MaxBudgets bounds the budgets a Ledger remembers: past it, a budget not
// seen before is not remembered until its window ends.
const MaxBudgets = 1000

// budgets are the last states of the budgets the gate reserved against,
// in this process.
type budgets struct {
	mu sync.Mutex
	m  map[[3]string]BudgetLeft // by tenant, limit name, limit key
}

func (b *budgets) seen(tenant string, states []ratelimit.State, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[[3]string]BudgetLeft{}
	}
	for _, s := range states {
		k := [3]string{boundField(tenant), boundField(s.Limit.Name), boundField(s.Limit.Key)}
		if _, ok := b.m[k]; !ok && len(b.m) >= MaxBudgets {
			b.expire(now)
			if len(b.m) >= MaxBudgets {
				continue
			}
		}
		b.m[k] = BudgetLeft{Tenant: k[0], Name: k[1], Key: k[2], Unit: boundField(string(s.Limit.Unit)), Amount: s.Limit.Amount,
			Window: s.Limit.Window, Per: Per(s.Limit.Window), Remaining: s.Remaining, Resets: now.Add(s.Reset), Seen: now}
	}
}

// expire forgets the budgets whose window has ended.
func (b *budgets) expire(now time.Time) {
	for k, v := range b.m {
		if !now.Before(v.Resets) {
			delete(b.m, k)
		}
	}
}

// left lists the budgets, a window that ended since as full, by tenant,
// name and key.
func (b *budgets) left(now time.Time) []BudgetLeft {
	b.mu.Lock()
	out := make([]BudgetLeft, 0, len(b.m))
	for _, v := range b.m {
		if !now.Before(v.Resets) {
			v.Remaining = v.Amount
			for !now.Before(v.Resets) && v.Window > 0 {
				v.Resets = v.Resets.Add(v.Window)
			}
		}
		out = append(out, v)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, b BudgetLeft) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Key, b.Key))
	})
	return out
}
