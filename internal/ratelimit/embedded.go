package ratelimit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/infergate/infergate/internal/ledgerfile"
)

// EmbeddedOptions name the limiter's buckets in the file.
type EmbeddedOptions struct {
	// Bucket holds the counters (default "ratelimit"); its sub-buckets
	// are "counters" (id → used, window end) and "expiry" (window end, id),
	// the index that drops ended counters.
	Bucket string
}

// Embedded is a Limiter whose counters live in a bbolt file on this
// host: one replica's budgets that survive a restart, a kill -9 or a
// power cut. Every Reserve, Settle and Release is one write transaction,
// committed and fsynced before it returns, so a request is admitted only
// once its reservation is on disk: a crash may lose a settlement (the
// reservation stays charged: over-, never under-charged), never a
// reservation it admitted against. Concurrent calls share a commit
// through the database's Batch.
//
// Counter ids are Memory's (DefaultCounterPrefix, no hash tag). Counters
// whose window has ended are dropped on later writes (at most
// sweepPerWrite per write, oldest first), so the file is bounded by the
// counters of the current windows; an ended counter still held takes
// refunds only, as in Memory. Counters saturate at math.MaxInt64.
type Embedded struct {
	db     ledgerfile.Store
	clock  Clock
	bucket []byte
}

var (
	countersBucket = []byte("counters")
	expiryBucket   = []byte("expiry")
)

// NewEmbedded returns a limiter on db, creating its buckets; a nil clock
// means time.Now.
func NewEmbedded(db ledgerfile.Store, clock Clock, opts EmbeddedOptions) (*Embedded, error) {
	if clock == nil {
		clock = time.Now
	}
	if opts.Bucket == "" {
		opts.Bucket = "ratelimit"
	}
	e := &Embedded{db: db, clock: clock, bucket: []byte(opts.Bucket)}
	err := db.Batch(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(e.bucket)
		if err != nil {
			return err
		}
		if _, err := b.CreateBucketIfNotExists(countersBucket); err != nil {
			return err
		}
		_, err = b.CreateBucketIfNotExists(expiryBucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ratelimit: embedded store: %w", err)
	}
	return e, nil
}

// sweepPerWrite bounds the ended counters one write drops: a write after
// a long idle spell does not pay for every window that ended meanwhile
// (the next ones carry on).
const sweepPerWrite = 64

// Reserve implements Limiter; see the package documentation for the
// semantics. It returns once an admission's charges are committed.
func (e *Embedded) Reserve(_ context.Context, limits []Limit, cost Cost) (Result, error) {
	if err := validate(limits, cost); err != nil {
		return Result{}, err
	}
	n := len(limits)
	if n == 0 {
		return Result{Allowed: true}, nil
	}
	ids, ends, used := make([]string, n), make([]int64, n), make([]int64, n)
	now := e.clock()
	nowMs := now.UnixMilli()
	counterIDs(DefaultCounterPrefix, "", limits, nowMs, ids, ends)
	exceeded := -1
	err := e.db.Batch(func(tx *bolt.Tx) error {
		ctrs, exp := e.buckets(tx)
		if err := sweep(ctrs, exp, nowMs); err != nil {
			return err
		}
		exceeded = -1
		for i := range limits {
			used[i], _, _ = readCounter(ctrs, ids[i])
			if exceeded < 0 && !admits(used[i], cost.Of(limits[i].Unit), limits[i].Amount) {
				exceeded = i
			}
		}
		if exceeded >= 0 {
			return nil
		}
		for i := range limits {
			if j := slices.Index(ids[:i], ids[i]); j >= 0 { // two limits on one counter: charged once
				used[i] = used[j]
				continue
			}
			v, _, found := readCounter(ctrs, ids[i])
			v = addSat(v, cost.Of(limits[i].Unit))
			if err := writeCounter(ctrs, exp, ids[i], v, ends[i], !found); err != nil {
				return err
			}
			used[i] = v
		}
		return nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("%w: embedded store: %w", ErrUnavailable, err)
	}
	if exceeded >= 0 {
		st, _ := newResult(n, false)
		fillStates(st, limits, used, ends, now)
		return Result{States: st, Exceeded: &st[exceeded].Limit, RetryAfter: st[exceeded].Reset}, nil
	}
	st, entries := newResult(n, true)
	fillStates(st, limits, used, ends, now)
	for i := range limits {
		entries[i] = Entry{Counter: ids[i], Unit: limits[i].Unit, Reserved: cost.Of(limits[i].Unit), ExpiresAt: ends[i], Limit: limits[i].Amount}
	}
	return Result{Allowed: true, Reservation: Reservation{Entries: dedupEntries(entries)}, States: st}, nil
}

// Settle implements Limiter, as Memory's: see settlePlan. It returns once
// the settlement is committed.
func (e *Embedded) Settle(_ context.Context, r Reservation, actual Cost) error {
	if err := checkActual(actual); err != nil {
		return err
	}
	nowMs := e.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	adj, err := settlePlan(r.Entries, actual, nowMs, buf[:0])
	return errors.Join(err, e.apply(adj, nowMs))
}

// Release implements Limiter, as Memory's.
func (e *Embedded) Release(_ context.Context, r Reservation) error {
	nowMs := e.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	return e.apply(releasePlan(r.Entries, nowMs, buf[:0]), nowMs)
}

// apply commits the changes of a Settle or Release: counters that still
// exist are adjusted (an ended one takes refunds only), not below zero;
// carried charges create their counter if needed.
func (e *Embedded) apply(adj []adjustment, nowMs int64) error {
	if len(adj) == 0 {
		return nil
	}
	var invalid []error
	err := e.db.Batch(func(tx *bolt.Tx) error {
		invalid = invalid[:0]
		ctrs, exp := e.buckets(tx) // ended counters are swept by Reserve, as Memory's
		for i := range adj {
			a := &adj[i]
			used, end, found := readCounter(ctrs, a.counter)
			created := false
			if !found && a.carried {
				if !strings.HasPrefix(a.head, DefaultCounterPrefix+"{") || !strings.HasSuffix(a.head, "}") {
					invalid = append(invalid, fmt.Errorf("%w: counter %q is not a counter of this limiter", ErrInvalid, a.counter))
					continue
				}
				used, end, found, created = 0, a.end, true, true
			}
			// An ended window's counter, while still held, takes refunds only.
			if !found || (end <= nowMs && a.delta >= 0) {
				continue
			}
			over := overLimit(used, a.delta, a.limit)
			if err := writeCounter(ctrs, exp, a.counter, addSat(used, a.delta)-over, end, created); err != nil {
				return err
			}
			if err := carryDebt(ctrs, exp, a, over); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: embedded store: %w", ErrUnavailable, err)
	}
	return errors.Join(invalid...)
}

// Len returns how many counters the file holds (current windows, plus
// ended ones not dropped yet).
func (e *Embedded) Len() int {
	n := 0
	_ = e.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(e.bucket); b != nil {
			n = b.Bucket(countersBucket).Stats().KeyN
		}
		return nil
	})
	return n
}

// Counters reads every counter the file holds, by id: for reconciling a
// ledger after a crash (the file opened read-only once infergate is dead).
func Counters(tx *bolt.Tx, bucket string) map[string]int64 {
	out := map[string]int64{}
	b := tx.Bucket([]byte(cmp.Or(bucket, "ratelimit")))
	if b == nil {
		return out
	}
	_ = b.Bucket(countersBucket).ForEach(func(k, v []byte) error {
		if len(v) == 16 {
			out[string(k)] = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	return out
}

func (e *Embedded) buckets(tx *bolt.Tx) (ctrs, exp *bolt.Bucket) {
	b := tx.Bucket(e.bucket)
	return b.Bucket(countersBucket), b.Bucket(expiryBucket)
}

// A counter's value: used, then its window's end (Unix ms), big-endian.
func readCounter(ctrs *bolt.Bucket, id string) (used, end int64, found bool) {
	v := ctrs.Get([]byte(id))
	if len(v) != 16 {
		return 0, 0, false
	}
	return int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:])), true
}

func writeCounter(ctrs, exp *bolt.Bucket, id string, used, end int64, created bool) error {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:], uint64(used))
	binary.BigEndian.PutUint64(v[8:], uint64(end))
	if err := ctrs.Put([]byte(id), v[:]); err != nil {
		return err
	}
	if created {
		return exp.Put(expiryKey(end, id), nil)
	}
	return nil
}

// expiryKey orders the index by window end (the sign bit flipped, so
// that the byte order is the numeric one), then id.
func expiryKey(end int64, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(end)^(1<<63))
	return append(k, id...)
}

// sweep drops up to sweepPerWrite counters whose window ended at or
// before nowMs, earliest first.
func sweep(ctrs, exp *bolt.Bucket, nowMs int64) error {
	bound := expiryKey(nowMs, "")
	var ended [][]byte
	c := exp.Cursor()
	for k, _ := c.First(); k != nil && len(ended) < sweepPerWrite; k, _ = c.Next() {
		if bytes.Compare(k[:8], bound) > 0 {
			break
		}
		ended = append(ended, k)
	}
	for _, k := range ended {
		if err := ctrs.Delete(k[8:]); err != nil {
			return err
		}
		if err := exp.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// carryDebt moves debt, what a's charge took past its limit, into the
// counters of the windows after a's, as Memory's carryDebt.
func carryDebt(ctrs, exp *bolt.Bucket, a *adjustment, debt int64) error {
	for k := 1; debt > 0 && k <= MaxDebtWindows; k++ {
		id, _, end := a.debtWindow(k)
		used, _, found := readCounter(ctrs, id)
		part := debtPart(debt, used, a.limit, k)
		if part == 0 {
			continue
		}
		if err := writeCounter(ctrs, exp, id, addSat(used, part), end, !found); err != nil {
			return err
		}
		debt -= part
	}
	return nil
}
