package chaos

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// ledger compares what Redis charged the tenant with what the pools
// billed. Budget counters are per clock-aligned window and expire a window
// after theirs ends, so the ledger keeps the last value it saw of every
// counter (a window's counter is final once the window ends: later
// settlements are carried to the window in force).
type ledger struct {
	r *rig

	mu       sync.Mutex
	counters map[string]int64
}

// counterPattern matches the tenants' total-token counters (prompt plus
// completion, per minute): <prefix>{tenant=NAME}:total_tokens:<window>:<start>.
const counterPattern = "ig:rl:{tenant=*}:total_tokens:*"

func newLedger(t *testing.T, r *rig) *ledger {
	l := &ledger{r: r, counters: map[string]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			l.scan(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// scan reads every counter; Redis being down just skips a round.
func (l *ledger) scan(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	keys, err := l.r.rdb.Keys(ctx, counterPattern).Result()
	if err != nil || len(keys) == 0 {
		return err == nil
	}
	vals, err := l.r.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range keys {
		if s, ok := vals[i].(string); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				l.counters[k] = n
			}
		}
	}
	return true
}

// charged is the sum of every counter seen.
func (l *ledger) charged() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum int64
	for _, v := range l.counters {
		sum += v
	}
	return sum
}

// billed is what the pools did: prompt plus completion tokens.
func (l *ledger) billed() int64 {
	var sum int64
	for _, p := range l.r.pools {
		u := p.Usage()
		sum += u.PromptTokens + u.CompletionTokens
	}
	return sum
}

// balance is one reading of both sides, once settlements have landed:
// every reservation the running gate made has ended (settled, kept,
// released or failed: its own counters say so), then the charged total
// has not moved for a second. Envoy closes a meter stream up to its
// deferred-close timeout (5 s) after a client left, so quiet alone does
// not mean settled; a gate frozen mid-fault may leave reservations no
// meter will end, so the wait for them stops after 8 s.
type balance struct{ charged, billed int64 }

func (l *ledger) settle() balance {
	for ended := time.Now().Add(8 * time.Second); time.Now().Before(ended) && !l.r.settled(); {
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(15 * time.Second)
	last, since := int64(-1), time.Now()
	for time.Now().Before(deadline) {
		if !l.scan(context.Background()) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if c := l.charged(); c != last {
			last, since = c, time.Now()
		} else if time.Since(since) > time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return balance{charged: l.charged(), billed: l.billed()}
}

// settled says whether the running gate has ended every reservation it
// made (infergate_ratelimit_reservations_total reserved vs settled, and
// the settlements that failed, counted in infergate_admission_errors_total).
func (r *rig) settled() bool { return settledAt(r.gateAdmin) }
