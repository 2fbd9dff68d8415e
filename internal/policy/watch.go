package policy

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	filewatch "github.com/infergate/infergate/internal/watch"
)

// DefaultInterval is how often a Watcher polls when given no interval.
const DefaultInterval = time.Second

// Watcher serves decisions from the latest good version of a policy
// directory, polling it for changes. A version that fails to parse,
// compile or pass its own tests is reported (Health, Reloads, the log) and
// the previous one keeps serving.
type Watcher struct {
	dir      string
	interval time.Duration
	log      *slog.Logger

	engine   atomic.Pointer[Engine]
	lastErr  atomic.Pointer[error] // nil after a good reload
	ok, fail atomic.Int64
	memo     bool // memoize each version's decisions (Engine.Memoize)
	// The memo counts of the versions replaced, so the totals never fall.
	pastHits, pastMisses atomic.Uint64

	fingerprint string // of the version loaded last
}

// Option changes how a Watcher serves decisions.
type Option func(*Watcher)

// WithMemo memoizes each policy version's decisions (Engine.Memoize) when
// on is true.
func WithMemo(on bool) Option { return func(w *Watcher) { w.memo = on } }

// NewWatcher loads dir (an error if that fails); Run then reloads it
// whenever the names, sizes or modification times of its policy and data
// files change. The directory is checked every interval (default 1s).
func NewWatcher(ctx context.Context, dir string, interval time.Duration, log *slog.Logger, opts ...Option) (*Watcher, error) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{dir: dir, interval: interval, log: log}
	for _, o := range opts {
		o(w)
	}
	fp, err := filewatch.Fingerprint(dir, isPolicyFile)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", dir, err)
	}
	e, err := w.load(ctx)
	if err != nil {
		return nil, err
	}
	w.engine.Store(e)
	log.Info("policy loaded", "dir", dir, "modules", e.modules, "tests", e.tests, "memoized", e.memo != nil)
	w.fingerprint = fp
	return w, nil
}

// Run polls the directory and reloads it on change, until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	filewatch.Poll(ctx, w.dir, isPolicyFile, w.fingerprint, w.interval, func() error { return w.reload(ctx) }, w.failed)
}

// load loads one version of the directory.
func (w *Watcher) load(ctx context.Context) (*Engine, error) {
	e, err := Load(ctx, w.dir)
	if err == nil && w.memo {
		e.Memoize()
	}
	return e, err
}

// Decide evaluates the current policy; see Engine.Decide.
func (w *Watcher) Decide(ctx context.Context, in *Input) (Decision, error) {
	return w.engine.Load().Decide(ctx, in)
}

// MemoStats counts decisions served from the memo and evaluated, over
// every policy version loaded (Engine.MemoStats of each).
func (w *Watcher) MemoStats() (hits, misses uint64) {
	h, m := w.engine.Load().MemoStats()
	return h + w.pastHits.Load(), m + w.pastMisses.Load()
}

// Engine returns the policy version currently serving.
func (w *Watcher) Engine() *Engine { return w.engine.Load() }

// Health is nil, or the error of the last reload when it failed (the
// previous policy is still serving): for /readyz.
func (w *Watcher) Health() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Reloads counts the reloads after the initial load that succeeded and
// that failed.
func (w *Watcher) Reloads() (ok, failed int64) { return w.ok.Load(), w.fail.Load() }

// reload loads the directory again; on success the new version serves.
func (w *Watcher) reload(ctx context.Context) error {
	start := time.Now()
	e, err := w.load(ctx)
	if err != nil {
		return err
	}
	h, m := w.engine.Swap(e).MemoStats()
	w.pastHits.Add(h)
	w.pastMisses.Add(m)
	w.lastErr.Store(nil)
	w.ok.Add(1)
	w.log.Info("policy reloaded", "dir", w.dir, "modules", e.modules, "tests", e.tests, "memoized", e.memo != nil,
		"took", time.Since(start).Round(time.Millisecond).String()) // "75ms", not slog's 75000000 ns
	return nil
}

// failed records a refused version; the previous one keeps serving.
func (w *Watcher) failed(err error) {
	// A version that did not load says so already; the directory's own
	// errors (it vanished, say) get the same prefix, once.
	if prefix := "policy " + w.dir + ":"; !strings.HasPrefix(err.Error(), prefix) {
		err = fmt.Errorf("policy %s: %w", w.dir, err)
	}
	w.fail.Add(1)
	w.lastErr.Store(&err)
	w.log.Error("policy reload failed; the previous policy keeps serving", "dir", w.dir, "err", err)
}
