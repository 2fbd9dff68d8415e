package seal

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/infergate/infergate/internal/ledgerfile"
)

// EmbeddedOnce is a Once in a bbolt file: the settle-once table of one
// replica that survives its restart. As MemoryOnce, it keeps the seals
// issued and not yet claimed, each until it expires, at most perTenant of
// one tenant and max in all; ended ones are dropped on later writes. Its
// claims cannot be lost on the way back (no network), so it keeps no
// claimant. Issue returns once the seal is
// committed, so a seal the gate handed out is claimable after a crash
// (with the keys in an EmbeddedStore, the restarted process verifies it),
// and a claim is committed before it is reported: a crash after it cannot
// let a replay settle again.
type EmbeddedOnce struct {
	db             ledgerfile.Store
	max, perTenant int
	now            func() time.Time
	bucket         []byte
}

var (
	onceSeals   = []byte("seals")   // purpose:id → expires (Unix ms), tenant
	onceExpiry  = []byte("expiry")  // expires, purpose:id
	onceTenants = []byte("tenants") // tenant → how many seals it holds
	onceCount   = []byte("n")       // how many seals are held
)

// NewEmbeddedOnce returns a Once on db in bucket (default "seals"),
// holding at most max seals (0: DefaultMaxOutstanding), perTenant of one
// tenant (0: DefaultTenantShare); a nil now means time.Now.
func NewEmbeddedOnce(db ledgerfile.Store, bucket string, max, perTenant int, now func() time.Time) (*EmbeddedOnce, error) {
	if now == nil {
		now = time.Now
	}
	o := &EmbeddedOnce{db: db, max: cmpOr(max, DefaultMaxOutstanding), perTenant: cmpOr(perTenant, DefaultTenantShare),
		now: now, bucket: []byte(cmp.Or(bucket, "seals"))}
	err := db.Batch(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(o.bucket)
		if err != nil {
			return err
		}
		if _, err := b.CreateBucketIfNotExists(onceSeals); err != nil {
			return err
		}
		if _, err := b.CreateBucketIfNotExists(onceTenants); err != nil {
			return err
		}
		_, err = b.CreateBucketIfNotExists(onceExpiry)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("seal: embedded settle-once table: %w", err)
	}
	return o, nil
}

// sweepPerWrite bounds the ended entries one write drops.
const sweepPerWrite = 64

// Issue implements Once.
func (o *EmbeddedOnce) Issue(_ context.Context, p Purpose, tenant, id string, expires time.Time) error {
	nowMs := o.now().UnixMilli()
	if expires.UnixMilli() <= nowMs {
		return ErrExpired
	}
	key := string(p) + ":" + id
	var full error
	err := o.db.Batch(func(tx *bolt.Tx) error {
		full = nil
		b := tx.Bucket(o.bucket)
		n, err := sweepOnce(b, nowMs)
		if err != nil {
			return err
		}
		seals := b.Bucket(onceSeals)
		if seals.Get([]byte(key)) != nil {
			return nil
		}
		held := tenantHeld(b, tenant)
		switch {
		case held >= int64(o.perTenant):
			full = ErrTenantFull
			return nil
		case n >= int64(o.max):
			full = ErrFull
			return nil
		}
		if err := seals.Put([]byte(key), append(msBytes(expires.UnixMilli()), tenant...)); err != nil {
			return err
		}
		if err := b.Bucket(onceExpiry).Put(expiryKey(expires.UnixMilli(), key), nil); err != nil {
			return err
		}
		if err := b.Bucket(onceTenants).Put(tenantKey([]byte(tenant)), msBytes(held+1)); err != nil {
			return err
		}
		return b.Put(onceCount, msBytes(n+1))
	})
	if err != nil {
		return fmt.Errorf("seal: recording %s: %w", key, err)
	}
	return full
}

// tenantKey is tenant's key in onceTenants: prefixed, as bbolt refuses an
// empty key and the anonymous tenant is "".
func tenantKey(tenant []byte) []byte { return append([]byte{'t'}, tenant...) }

// tenantHeld is how many seals tenant holds.
func tenantHeld(b *bolt.Bucket, tenant string) int64 {
	if v := b.Bucket(onceTenants).Get(tenantKey([]byte(tenant))); len(v) == 8 {
		return msOf(v)
	}
	return 0
}

// dropTenant forgets one of the seals of the tenant a seal's value names.
func dropTenant(b *bolt.Bucket, sealValue []byte) error {
	if len(sealValue) < 8 {
		return nil
	}
	tenant := sealValue[8:]
	if n := tenantHeld(b, string(tenant)) - 1; n > 0 {
		return b.Bucket(onceTenants).Put(tenantKey(tenant), msBytes(n))
	}
	return b.Bucket(onceTenants).Delete(tenantKey(tenant))
}

// Outstanding is how many seals tenant holds.
func (o *EmbeddedOnce) Outstanding(tenant string) int {
	var n int64
	_ = o.db.View(func(tx *bolt.Tx) error {
		n = tenantHeld(tx.Bucket(o.bucket), tenant)
		return nil
	})
	return int(n)
}

// Claim implements Once.
func (o *EmbeddedOnce) Claim(_ context.Context, p Purpose, _, id, _ string, expires time.Time) (bool, error) {
	nowMs := o.now().UnixMilli()
	if expires.UnixMilli() <= nowMs {
		return false, ErrExpired
	}
	key := string(p) + ":" + id
	claimed := false
	err := o.db.Batch(func(tx *bolt.Tx) error {
		claimed = false
		b := tx.Bucket(o.bucket)
		n, err := sweepOnce(b, nowMs)
		if err != nil {
			return err
		}
		seals := b.Bucket(onceSeals)
		v := seals.Get([]byte(key))
		if len(v) < 8 {
			return nil
		}
		if err := errors.Join(b.Bucket(onceExpiry).Delete(expiryKey(msOf(v[:8]), key)), dropTenant(b, v)); err != nil {
			return err
		}
		if err := seals.Delete([]byte(key)); err != nil {
			return err
		}
		claimed = true
		return b.Put(onceCount, msBytes(max(0, n-1)))
	})
	if err != nil {
		return false, fmt.Errorf("seal: claiming %s: %w", key, err)
	}
	return claimed, nil
}

// Len is how many seals are held (issued, not claimed, not dropped).
func (o *EmbeddedOnce) Len() int {
	n := 0
	_ = o.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(o.bucket).Bucket(onceSeals).Stats().KeyN
		return nil
	})
	return n
}

// sweepOnce drops up to sweepPerWrite seals that expired at or before
// nowMs and returns how many are held then.
func sweepOnce(b *bolt.Bucket, nowMs int64) (int64, error) {
	var n int64
	if v := b.Get(onceCount); len(v) == 8 {
		n = msOf(v)
	}
	seals, exp := b.Bucket(onceSeals), b.Bucket(onceExpiry)
	bound := expiryKey(nowMs, "")
	var ended [][]byte
	c := exp.Cursor()
	for k, _ := c.First(); k != nil && len(ended) < sweepPerWrite && bytes.Compare(k[:8], bound) <= 0; k, _ = c.Next() {
		ended = append(ended, k)
	}
	for _, k := range ended {
		if err := errors.Join(dropTenant(b, seals.Get(k[8:])), seals.Delete(k[8:]), exp.Delete(k)); err != nil {
			return 0, err
		}
	}
	if len(ended) == 0 {
		return n, nil
	}
	n = max(0, n-int64(len(ended)))
	return n, b.Put(onceCount, msBytes(n))
}

// EmbeddedStore keeps the keyring's keys in a bbolt file, one per period,
// each dropped once its seals have expired: with EmbeddedOnce, a
// restarted replica verifies the seals it made before (a request admitted
// before a restart settles after it). The file holds secrets: it is
// opened readable by its user only (internal/ledgerfile).
type EmbeddedStore struct {
	DB     ledgerfile.Store
	Bucket string           // default "seal-keys"
	Now    func() time.Time // default time.Now
}

// Key implements Store: the period's stored key, or fresh, stored.
func (s EmbeddedStore) Key(_ context.Context, epoch int64, fresh Key, ttl time.Duration) (Key, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	nowMs := now().UnixMilli()
	name := []byte(cmp.Or(s.Bucket, "seal-keys"))
	var out Key
	err := s.DB.Batch(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return err
		}
		var drop [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			if len(v) < 9 || msOf(v[:8]) <= nowMs {
				drop = append(drop, k)
			}
			return nil
		})
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		ek := msBytes(epoch)
		if v := b.Get(ek); len(v) >= 9 && int(v[8]) <= len(v)-9 {
			idLen := int(v[8])
			out = Key{ID: string(v[9 : 9+idLen]), Secret: bytes.Clone(v[9+idLen:])}
			return nil
		}
		if len(fresh.ID) > 255 {
			return errors.New("key id longer than 255 bytes")
		}
		v := append(msBytes(nowMs+ttl.Milliseconds()), byte(len(fresh.ID)))
		v = append(append(v, fresh.ID...), fresh.Secret...)
		out = fresh
		return b.Put(ek, v)
	})
	if err != nil {
		return Key{}, fmt.Errorf("seal: key of period %d: %w", epoch, err)
	}
	return out, nil
}

func msBytes(ms int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(ms)) }

func msOf(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }

// expiryKey orders an index by time (the sign bit flipped, so that byte
// order is numeric order), then key.
func expiryKey(ms int64, key string) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(key)), uint64(ms)^(1<<63))
	return append(k, key...)
}
