// Package poolmodels keeps the models the pools serve, as each pool lists
// them on its own GET /v1/models: fetched in the background, bounded before
// anything is kept (a pool is a peer), merged, and dropped when a pool has
// stopped answering for too long. With no models configured, the gate
// answers GET /v1/models with them.
package poolmodels

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is one pool whose models are listed.
type Pool struct {
	// Name is the pool's name in logs and in List.Pools (its Envoy cluster).
	Name string
	// URL is the pool's model list, e.g. http://vllm:8000/v1/models.
	URL string
	// APIKeyFile, if set, holds the bearer token the pool requires; read
	// on every fetch, so a rotated Secret is picked up.
	APIKeyFile string
}

// Options configure a Lister; zero durations take the defaults.
type Options struct {
	Pools    []Pool
	Interval time.Duration // between refreshes (default 30s)
	KeepFor  time.Duration // a failing pool's last list is kept this long (default 5m)
	Timeout  time.Duration // one fetch (default 5s)
	// Fetch reads one pool's model ids; default: GET over HTTP (Fetcher).
	// Whatever it returns is bounded again before it is kept.
	Fetch  func(ctx context.Context, p Pool) ([]string, error)
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultInterval = 30 * time.Second
	DefaultKeepFor  = 5 * time.Minute
	DefaultTimeout  = 5 * time.Second
)

// List is one merged listing; immutable.
type List struct {
	// IDs are the pools' models, each once: the first pool's in its order,
	// then each next pool's new ones.
	IDs   []string
	pools map[string][]string
}

// Pools names the pools that list id, in the configured order.
func (l *List) Pools(id string) []string { return l.pools[id] }

// merge builds the listing of each pool's ids (nil: the pool has none
// to offer), in the order of pools, of at most MaxModels ids: a listing
// asks the policy about each, so the pools together get no more than one
// pool may.
func merge(pools []Pool, ids [][]string) *List {
	l := &List{IDs: []string{}, pools: map[string][]string{}}
	for i, p := range pools {
		for _, id := range ids[i] {
			if _, seen := l.pools[id]; !seen {
				if len(l.IDs) == MaxModels {
					continue
				}
				l.IDs = append(l.IDs, id)
			}
			l.pools[id] = append(l.pools[id], p.Name)
		}
	}
	return l
}

// Lister refreshes the pools' lists; Models is safe for concurrent use.
type Lister struct {
	opts   Options
	list   atomic.Pointer[List]
	primed chan struct{}
	once   sync.Once
}

// New returns a Lister; nothing is fetched until Run.
func New(opts Options) *Lister {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.KeepFor <= 0 {
		opts.KeepFor = DefaultKeepFor
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Fetch == nil {
		opts.Fetch = Fetcher(opts.Timeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Lister{opts: opts, primed: make(chan struct{})}
}

// List is the latest listing: empty (never nil) before the first round.
func (l *Lister) List() *List {
	if cur := l.list.Load(); cur != nil {
		return cur
	}
	return &List{IDs: []string{}}
}

// Models are the latest listing's ids; the caller must not modify them.
func (l *Lister) Models() []string { return l.List().IDs }

// Primed is closed once the first round has ended, every pool having
// answered or failed (within Timeout).
func (l *Lister) Primed() <-chan struct{} { return l.primed }

// pool is what the refresher knows of one pool.
type pool struct {
	ids     []string  // the last good list; nil: none
	at      time.Time // when it was fetched
	failing bool
}

// Run fetches every pool now and then every Interval, until ctx is done.
func (l *Lister) Run(ctx context.Context) {
	state := make([]pool, len(l.opts.Pools))
	t := time.NewTicker(l.opts.Interval)
	defer t.Stop()
	for {
		l.refresh(ctx, state)
		l.once.Do(func() { close(l.primed) })
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh fetches every pool at once and publishes the merged listing: a
// pool that fails keeps its last good list until it is KeepFor old.
func (l *Lister) refresh(ctx context.Context, state []pool) {
	type result struct {
		ids []string
		err error
	}
	results := make([]result, len(l.opts.Pools))
	var wg sync.WaitGroup
	for i, p := range l.opts.Pools {
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
			defer cancel()
			ids, err := l.opts.Fetch(fctx, p)
			if err == nil {
				ids, err = Bound(ids)
			}
			results[i] = result{ids, err}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: what failed failed because of it
	}
	now := time.Now()
	lists := make([][]string, len(state))
	for i, r := range results {
		st, name := &state[i], l.opts.Pools[i].Name
		switch {
		case r.err == nil:
			if st.failing {
				l.opts.Logger.Info("pool model list recovered", "pool", name, "models", len(r.ids))
			}
			*st = pool{ids: r.ids, at: now}
		case !st.failing:
			st.failing = true
			l.opts.Logger.Warn("pool model list failing; its last list is kept for a while", "pool", name, "err", r.err,
				"keep_for", l.opts.KeepFor.String())
		}
		if st.ids != nil && now.Sub(st.at) > l.opts.KeepFor {
			l.opts.Logger.Warn("pool model list dropped: the pool has not answered for too long", "pool", name,
				"since", st.at)
			st.ids = nil
		}
		lists[i] = st.ids
	}
	l.list.Store(merge(l.opts.Pools, lists))
}

// Bounds on one pool's list, which comes from a peer.
const (
	// MaxBodyBytes bounds a model list's body: a thousand models take
	// about 100 KiB in vLLM's format.
	MaxBodyBytes = 1 << 20
	// MaxModels bounds the ids kept of one pool, and of all together; the
	// rest are dropped.
	MaxModels = 1024
	// MaxIDBytes bounds an id, as the gate bounds a body's model
	// (extproc.MaxModelBytes); longer ids are dropped.
	MaxIDBytes = 256
)

// errNotList is a body that is not an OpenAI model list.
var errNotList = errors.New("not an OpenAI model list")

// Bound keeps the ids a client could call: valid (see ValidID), each once,
// at most MaxModels. A list of only invalid ids is an error: the pool is
// not speaking OpenAI's API.
func Bound(ids []string) ([]string, error) {
	out := make([]string, 0, min(len(ids), MaxModels))
	seen := make(map[string]bool, cap(out))
	for _, id := range ids {
		if len(out) == MaxModels {
			break
		}
		if ValidID(id) && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	if len(out) == 0 && len(ids) > 0 {
		return nil, fmt.Errorf("%w: no valid model id in %d", errNotList, len(ids))
	}
	return out, nil
}
