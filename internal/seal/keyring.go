package seal

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Store is where replicas find the key of each rotation period (an
// epoch: Unix time divided by the rotation), so that every replica seals
// and verifies with the same keys. Key returns the stored key of epoch,
// storing fresh first when there is none; ttl is how long it must stay.
type Store interface {
	Key(ctx context.Context, epoch int64, fresh Key, ttl time.Duration) (Key, error)
}

// Options shape a Keyring.
type Options struct {
	// Rotation is how long one key seals (default 24h); Refresh how often
	// the keys are read again from the store (default 1m, less than
	// Rotation). The key of the next period is read ahead, so every
	// replica holds it before any seals with it.
	Rotation, Refresh time.Duration
	// MaxAge is the longest a seal lives (default 25h): a key verifies
	// until the last seal it made has expired.
	MaxAge time.Duration
	Now    func() time.Time // default time.Now
	Log    *slog.Logger
}

// Keyring holds the keys by id: the current period's, which seals, and
// those of earlier periods whose seals may still be valid, which verify.
// Its keys come from a Store, read again every Refresh: replicas converge
// without a restart, after the store lost its keys (they are created
// again) or a start while it was unreachable (a key of this replica
// meanwhile, kept to verify what it sealed). A seal under a key id the
// ring does not hold is counted (UnknownKeys) and logged: replicas that
// disagree.
type Keyring struct {
	store Store
	opts  Options
	log   *slog.Logger

	mu      sync.RWMutex
	byEpoch map[int64]Key   // the store's key of each period
	byID    map[string]held // every key that verifies: the store's, those it replaced, this replica's own
	local   *Key            // sealing while the store is unreachable

	unknown atomic.Int64 // seals naming a key id not held
	changed atomic.Int64 // keys replaced in the store (lost, then created again)
	failed  atomic.Int64 // refreshes that could not reach the store
	lastLog atomic.Int64 // Unix seconds of the last log line on an unknown key
}

// held is a key that verifies and the period it sealed in.
type held struct {
	Key
	epoch int64
}

// NewKeyring returns a keyring on store; call Refresh (or Run) to load
// its keys. Until then, and while the store is unreachable, it seals with
// a key of its own.
func NewKeyring(store Store, opts Options) *Keyring {
	if opts.Rotation <= 0 {
		opts.Rotation = 24 * time.Hour
	}
	if opts.Refresh <= 0 || opts.Refresh >= opts.Rotation {
		opts.Refresh = min(time.Minute, opts.Rotation/2)
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = 25 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Keyring{store: store, opts: opts, log: log, byEpoch: map[int64]Key{}, byID: map[string]held{}}
}

// MaxAge is the longest a seal of this ring may live.
func (r *Keyring) MaxAge() time.Duration { return r.opts.MaxAge }

// Now is the ring's clock.
func (r *Keyring) Now() time.Time { return r.opts.Now() }

func (r *Keyring) epoch(t time.Time) int64 {
	return t.UnixNano() / int64(r.opts.Rotation)
}

// kept is how many earlier periods' keys may still have live seals.
func (r *Keyring) kept() int64 {
	return int64((r.opts.MaxAge+r.opts.Rotation-1)/r.opts.Rotation) + 1
}

// Refresh reads the keys of the periods whose seals may be live, and of
// the next one, from the store, creating those it lacks. A key the store
// now holds under an epoch where the ring held another is adopted, and
// the one it replaces kept to verify (counted in Changed and logged).
func (r *Keyring) Refresh(ctx context.Context) error {
	now := r.opts.Now()
	cur := r.epoch(now)
	ttl := r.opts.MaxAge + 2*r.opts.Rotation
	got := map[int64]Key{}
	var errs []error
	for e := cur - r.kept(); e <= cur+1; e++ {
		fresh := NewKey(strconv.FormatInt(e, 36) + "-" + newID()[:8])
		k, err := r.store.Key(ctx, e, fresh, ttl)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !validKey(k, e) {
			errs = append(errs, errors.New("the store holds a malformed key for period "+strconv.FormatInt(e, 10)))
			continue
		}
		got[e] = k
	}
	r.mu.Lock()
	for e, k := range got {
		if old, ok := r.byEpoch[e]; ok && old.ID != k.ID {
			r.changed.Add(1)
			r.log.Warn("the shared reservation key of a period changed in the store (lost and created again?); "+
				"adopted, the one it replaced still verifies", "period", e, "was", old.ID, "now", k.ID)
		}
		r.byEpoch[e] = k
		r.byID[k.ID] = held{k, e}
	}
	r.forget(cur)
	r.mu.Unlock()
	if len(errs) > 0 {
		r.failed.Add(1)
		return errors.Join(errs...)
	}
	return nil
}

// validKey: a key the store returned for epoch, named as Refresh names
// them, with a full secret.
func validKey(k Key, epoch int64) bool {
	prefix, _, ok := strings.Cut(k.ID, "-")
	return ok && prefix == strconv.FormatInt(epoch, 36) && len(k.Secret) == keyBytes && !strings.Contains(k.ID, ".")
}

// forget drops the keys whose seals have all expired (r.mu held).
func (r *Keyring) forget(cur int64) {
	oldest := cur - r.kept()
	for e := range r.byEpoch {
		if e < oldest {
			delete(r.byEpoch, e)
		}
	}
	for id, h := range r.byID {
		if h.epoch < oldest {
			delete(r.byID, id)
		}
	}
	if r.local != nil {
		if _, ok := r.byID[r.local.ID]; !ok {
			r.local = nil
		}
	}
}

// Run refreshes every Refresh until ctx is done; the first refresh is now.
func (r *Keyring) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Refresh)
	defer t.Stop()
	for {
		if err := r.Refresh(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("could not read the shared reservation keys; retrying", "every", r.opts.Refresh, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// current is the key that seals now: the current period's from the
// store, else (not loaded yet, the store unreachable) one of this
// replica's, kept while it may have live seals.
func (r *Keyring) current(now time.Time) Key {
	e := r.epoch(now)
	r.mu.RLock()
	k, ok := r.byEpoch[e]
	fresh := r.local != nil && r.byID[r.local.ID].epoch == e
	if !ok && fresh {
		k, ok = *r.local, true
	}
	r.mu.RUnlock()
	if ok {
		return k
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local == nil {
		k := NewKey("local-" + newID()[:12])
		r.local = &k
		r.log.Warn("sealing with a key of this replica until the shared keys can be read " +
			"(another replica's settlements of these seals are refused: over-, never under-charged)")
	}
	r.byID[r.local.ID] = held{*r.local, e} // it verifies as long as its latest seals may live
	return *r.local
}

// Seal seals body for p, issued now, expiring at expires (held to
// MaxAge from now).
func (r *Keyring) Seal(p Purpose, body string, expires time.Time) string {
	s, _, _ := r.SealID(p, body, expires)
	return s
}

// SealID is Seal, with the seal's id and expiry (for Once.Issue).
func (r *Keyring) SealID(p Purpose, body string, expires time.Time) (sealed, id string, exp time.Time) {
	now := r.opts.Now()
	if last := now.Add(r.opts.MaxAge); expires.After(last) {
		expires = last
	}
	sealed, id = seal(r.current(now), p, body, now, expires)
	return sealed, id, time.UnixMilli(expires.UnixMilli())
}

// Open verifies s (sealed for p): its MAC, its key, its expiry.
func (r *Keyring) Open(p Purpose, s string) (Sealed, error) {
	out, err := open(r.lookup, p, s, r.opts.Now())
	if errors.Is(err, ErrUnknownKey) {
		r.unknown.Add(1)
		now := r.opts.Now().Unix()
		if last := r.lastLog.Load(); now-last >= 10 && r.lastLog.CompareAndSwap(last, now) {
			r.log.Error("a seal names a key this replica does not hold: replicas disagree on the reservation keys, "+
				"or a forgery", "purpose", string(p))
		}
	}
	return out, err
}

func (r *Keyring) lookup(id string) (Key, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.byID[id]
	return h.Key, ok
}

// UnknownKeys counts seals naming a key id not held; Changed the keys
// replaced in the store; Failed the refreshes that could not read it.
func (r *Keyring) UnknownKeys() int64 { return r.unknown.Load() }
func (r *Keyring) Changed() int64     { return r.changed.Load() }
func (r *Keyring) Failed() int64      { return r.failed.Load() }

// MemoryStore is a Store of one process (no replicas to share with).
type MemoryStore struct {
	mu   sync.Mutex
	keys map[int64]Key
}

// Key implements Store; keys are kept for the process's life, bounded
// by the Keyring asking only for live periods (older ones are dropped).
func (m *MemoryStore) Key(_ context.Context, epoch int64, fresh Key, _ time.Duration) (Key, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = map[int64]Key{}
	}
	if k, ok := m.keys[epoch]; ok {
		return k, nil
	}
	for e := range m.keys {
		if e < epoch-1000 {
			delete(m.keys, e)
		}
	}
	m.keys[epoch] = fresh
	return fresh, nil
}
