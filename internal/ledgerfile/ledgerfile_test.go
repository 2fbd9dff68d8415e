package ledgerfile

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// Concurrent writers share commits; one whose write fails gets its error
// and the others' writes are committed without it; a write after Close
// fails; a second Open of a held file fails instead of waiting forever.
func TestBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 200)
	for i := range errs {
		wg.Go(func() {
			errs[i] = db.Batch(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("b"))
				if err != nil {
					return err
				}
				if i%50 == 7 {
					_ = b.Put([]byte("bad"), []byte("x"))
					return boom
				}
				return b.Put(fmt.Appendf(nil, "%03d", i), []byte("x"))
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (i%50 == 7) != errors.Is(err, boom) || (i%50 != 7 && err != nil) {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if _, err := Open(path); err == nil {
		t.Error("a second Open of a held file succeeded")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Batch(func(*bolt.Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Batch after Close = %v, want ErrClosed", err)
	}
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	_ = ro.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("b"))
		if n := b.Stats().KeyN; n != 196 || b.Get([]byte("bad")) != nil {
			t.Errorf("%d keys (bad: %q), want the 196 good writes only", n, b.Get([]byte("bad")))
		}
		return nil
	})
}
