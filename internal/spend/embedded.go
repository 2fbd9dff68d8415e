package spend

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/infergate/infergate/internal/ledgerfile"
)

// Embedded is a Store in a bbolt file, beside the budgets of the embedded
// limiter: one bucket per hour (its Unix hour, big-endian) holding each
// key's Amount, and the number of keys it holds. An Add returns once it
// is committed (fsynced), so the spend read back after a restart or a
// kill -9 is everything that was added. Hours older than Retention are
// dropped on later writes.
type Embedded struct {
	DB     ledgerfile.Store
	Bucket string // default "spend"
	Shares Shares // an hour's rows per key, per tenant and in all; zero fields: defaults
}

// In an hour's bucket, beside the rows, their counts (no encoded key
// starts with NUL): in all, per tenant, per (tenant, team, key).
var spendCount = []byte("\x00n")

func tenantCountKey(k Key) []byte { return []byte("\x00t" + k.Tenant) }
func keyCountKey(k Key) []byte {
	return []byte("\x00k" + k.Tenant + fieldSep + k.Team + fieldSep + k.KeyID)
}

// boltRows is an hour's bucket as the Rows Shares.Slot places keys in.
type boltRows struct{ b *bolt.Bucket }

func (r boltRows) Has(k Key) bool { return r.b.Get([]byte(encodeKey(k))) != nil }

func (r boltRows) Count(k Key) (all, tenant, key int) {
	n := func(name []byte) int {
		if v := r.b.Get(name); len(v) == 8 {
			return int(binary.BigEndian.Uint64(v))
		}
		return 0
	}
	return n(spendCount), n(tenantCountKey(k)), n(keyCountKey(k))
}

// counted adds a new row k to the counts: in all, and, but for OtherKey,
// for its tenant and its (tenant, team, key).
func (r boltRows) counted(k Key) error {
	all, tenant, key := r.Count(k)
	put := func(name []byte, n int) error { return r.b.Put(name, binary.BigEndian.AppendUint64(nil, uint64(n))) }
	if err := put(spendCount, all+1); err != nil || k == OtherKey {
		return err
	}
	return errors.Join(put(tenantCountKey(k), tenant+1), put(keyCountKey(k), key+1))
}

// Add implements Store.
func (e *Embedded) Add(_ context.Context, hour int64, k Key, a Amount) error {
	bounded := k.Bounded()
	err := e.DB.Batch(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists([]byte(cmp.Or(e.Bucket, "spend")))
		if err != nil {
			return err
		}
		if err := dropOldHours(root, hour); err != nil {
			return err
		}
		if newest, _ := root.Cursor().Last(); newest != nil && hour <= hourOf(newest)-int64(Retention/time.Hour) {
			return nil // past retention: a report would not read it
		}
		b, err := root.CreateBucketIfNotExists(hourKey(hour))
		if err != nil {
			return err
		}
		rows := boltRows{b}
		slot := e.Shares.Slot(bounded, rows)
		key := []byte(encodeKey(slot))
		v := b.Get(key)
		if v == nil {
			if err := rows.counted(slot); err != nil {
				return err
			}
		}
		return b.Put(key, encodeAmount(decodeAmount(v).Add(a.charge())))
	})
	if err != nil {
		return fmt.Errorf("spend: adding to hour %d: %w", hour, err)
	}
	return nil
}

// Hours implements Store.
func (e *Embedded) Hours(_ context.Context, first, last int64) (map[int64]Bucket, error) {
	out := map[int64]Bucket{}
	err := e.DB.View(func(tx *bolt.Tx) error {
		root := tx.Bucket([]byte(cmp.Or(e.Bucket, "spend")))
		if root == nil {
			return nil
		}
		c := root.Cursor()
		for k, _ := c.Seek(hourKey(first)); k != nil; k, _ = c.Next() {
			h := hourOf(k)
			if h > last {
				break
			}
			b, bucket := Bucket{}, root.Bucket(k)
			_ = bucket.ForEach(func(ek, v []byte) error {
				if k, ok := decodeKey(string(ek)); ok {
					b[k] = decodeAmount(v)
				}
				return nil
			})
			out[h] = b
		}
		return nil
	})
	return out, err
}

// dropOldHours deletes the hours a report no longer reads, relative to
// hour (at most a few per write: one per hour passed).
func dropOldHours(root *bolt.Bucket, hour int64) error {
	c := root.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.First() {
		if hourOf(k) > hour-int64(Retention/time.Hour) {
			return nil
		}
		if err := root.DeleteBucket(k); err != nil {
			return err
		}
	}
	return nil
}

// hourKey orders hours numerically (the sign bit flipped).
func hourKey(h int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(h)^1<<63) }

func hourOf(k []byte) int64 { return int64(binary.BigEndian.Uint64(k) ^ 1<<63) }

func encodeAmount(a Amount) []byte {
	b := make([]byte, 0, 40)
	for _, v := range [...]int64{a.Requests, a.InputTokens, a.CachedTokens, a.OutputTokens, a.Cost} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

func decodeAmount(b []byte) Amount {
	if len(b) != 40 {
		return Amount{}
	}
	p := func(i int) int64 { return int64(binary.BigEndian.Uint64(b[8*i:])) }
	return Amount{Requests: p(0), InputTokens: p(1), CachedTokens: p(2), OutputTokens: p(3), Cost: p(4)}
}

// decodeKey reads encodeKey's form.
func decodeKey(s string) (Key, bool) {
	var f [4]string
	for i := range 3 {
		j := strings.IndexByte(s, fieldSep[0])
		if j < 0 {
			return Key{}, false
		}
		f[i], s = s[:j], s[j+1:]
	}
	f[3] = s
	return Key{Tenant: f[0], Team: f[1], KeyID: f[2], Model: f[3]}, true
}
