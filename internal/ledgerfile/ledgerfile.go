// Package ledgerfile opens the embedded ledger: one bbolt file holding
// what a single replica must not forget across a restart or a kill -9 (the
// budget counters, the settle-once table and its keys, the spend hour
// buckets). Each part is an adapter beside the semantics it implements
// (internal/ratelimit, internal/seal, internal/spend), each in buckets of
// its own; this package only opens the file, so that one place decides
// its permissions, its lock and its durability.
package ledgerfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// LockTimeout is how long Open waits for another process to release the
// file: bbolt locks it (flock) for as long as it is open, so a second
// infergate on the same file fails at start instead of hanging or
// corrupting it.
const LockTimeout = 2 * time.Second

// OpenReadOnly opens the ledger at path to read it (infergate spend, a
// test after a kill), failing rather than creating it.
func OpenReadOnly(path string) (*bolt.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: LockTimeout, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	return db, nil
}

// Store is the part of a bbolt database the ledger's adapters (the embedded
// limiter, settle-once table and spend) use: *bbolt.DB has it, and so has
// DB, whose Batch shares one fsync between concurrent writers.
type Store interface {
	View(fn func(*bolt.Tx) error) error
	// Batch runs fn in a write transaction, committed (fsynced) when it
	// returns; fn may run more than once.
	Batch(fn func(*bolt.Tx) error) error
}

// DB is the opened ledger: a bbolt database whose Batch commits the
// writes of every caller waiting at once in one transaction, one fsync.
type DB struct {
	*bolt.DB

	mu     sync.RWMutex // held to send on calls; Close takes it to close them
	closed bool
	calls  chan call
	done   chan struct{}
}

type call struct {
	fn  func(*bolt.Tx) error
	err chan error
}

// maxBatch bounds the writes one commit carries.
const maxBatch = 1024

// Open opens (creating it, and its directory, if need be) the ledger at
// path, readable by this user only: it holds the keys that seal
// reservations. Every commit is fsynced before it returns, so what a
// caller was told is written survives a kill -9 or a power cut.
func Open(path string) (*DB, error) {
	if path == "" {
		return nil, errors.New("ledger: no path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: LockTimeout,
		// The free pages as a map: allocation does not scan a list that
		// grows with the file.
		FreelistType: bolt.FreelistMapType,
	})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("ledger %s: held by another process (one infergate per file; replicas share Redis): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	d := &DB{DB: db, calls: make(chan call, maxBatch), done: make(chan struct{})}
	go d.run()
	return d, nil
}

// ErrClosed: a write after Close.
var ErrClosed = errors.New("ledger: closed")

// Batch runs fn in a write transaction and returns once it is committed
// and fsynced. Calls that arrive while a commit is being written share
// the next one, so concurrent writers pay one fsync between them, with
// no delay added when there is no contention (unlike bbolt's own Batch,
// which waits MaxBatchDelay for company). As with bbolt's Batch, fn may
// run more than once (the others of a transaction in which one failed
// are run again without it): it must set its results afresh each time.
func (d *DB) Batch(fn func(*bolt.Tx) error) error {
	c := call{fn: fn, err: make(chan error, 1)}
	d.mu.RLock()
	if d.closed {
		d.mu.RUnlock()
		return ErrClosed
	}
	d.calls <- c
	d.mu.RUnlock()
	return <-c.err
}

// run commits the calls waiting, as many as have arrived, one
// transaction at a time.
func (d *DB) run() {
	defer close(d.done)
	batch := make([]call, 0, maxBatch)
	for c := range d.calls {
		batch = append(batch[:0], c)
	more:
		for len(batch) < maxBatch {
			select {
			case c, ok := <-d.calls:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		d.commit(batch)
	}
}

// commit runs calls in one transaction. A call whose fn fails gets its
// error and the others are committed again without it.
func (d *DB) commit(calls []call) {
	for len(calls) > 0 {
		failed := -1
		err := d.DB.Update(func(tx *bolt.Tx) error {
			for i, c := range calls {
				if err := safely(c.fn, tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, c := range calls {
				c.err <- err
			}
			return
		}
		calls[failed].err <- err
		calls = append(calls[:failed:failed], calls[failed+1:]...)
	}
}

func safely(fn func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("ledger: panic in a write: %v", p)
		}
	}()
	return fn(tx)
}

// Close waits for the writes under way, then closes the file (releasing
// its lock).
func (d *DB) Close() error {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.calls)
	}
	d.mu.Unlock()
	<-d.done
	return d.DB.Close()
}
