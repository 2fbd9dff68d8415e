// Package seal writes and checks what infergate hands to Envoy and expects
// back unchanged: the gate's reservations and the gate→meter field. A
// seal is an HMAC-SHA256 under a key of a keyring the replicas share
// (keys by id, rotated on a schedule), and carries a random id, when it
// was issued and when it expires. Whatever reaches the ext_proc port may
// send one back: a seal that does not verify, whose key is unknown or
// which has expired is refused, and Once lets a verified seal be used one
// time only (a reservation settles once).
package seal

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Purpose separates what a seal is for: a reservation's seal is no
// field's, and the other way round.
type Purpose string

const (
	Reservation Purpose = "reservation"
	Field       Purpose = "field"
)

// Sealed is a verified seal.
type Sealed struct {
	ID      string // random, unique per seal: what Once records
	KeyID   string
	Issued  time.Time
	Expires time.Time
	Body    string
}

var (
	// ErrForged: not a seal, or its MAC does not verify.
	ErrForged = errors.New("seal does not verify")
	// ErrUnknownKey: sealed under a key this replica does not hold (a
	// replica that disagrees on the keys, or a forgery naming a key id).
	ErrUnknownKey = errors.New("seal names an unknown key")
	// ErrExpired: past its expiry.
	ErrExpired = errors.New("seal has expired")
)

// Key is one sealing key.
type Key struct {
	ID     string
	Secret []byte
}

// keyBytes is the length of a secret.
const keyBytes = 32

// NewKey returns a fresh random key named id.
func NewKey(id string) Key {
	k := Key{ID: id, Secret: make([]byte, keyBytes)}
	if _, err := rand.Read(k.Secret); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return k
}

var b64 = base64.RawURLEncoding

// newID is 16 random bytes, base64url.
func newID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b64.EncodeToString(b)
}

// The sealed form, six parts separated by '.':
//
//	keyid.id.issued.expires.mac.body
//
// issued and expires in Unix milliseconds; mac is base64url of the HMAC
// over the purpose, a zero byte and everything but the mac; body is
// opaque (it may hold '.'). Key ids and seal ids are base64url or
// decimal, without '.'.

// maxHeader bounds the parts before the body: a longer one is no seal.
const maxHeader = 256

func mac(key []byte, p Purpose, head, body string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(p))
	m.Write([]byte{0})
	m.Write([]byte(head))
	m.Write([]byte(body))
	return m.Sum(nil)
}

// seal writes body sealed under k; id is the seal's.
func seal(k Key, p Purpose, body string, issued, expires time.Time) (sealed, id string) {
	id = newID()
	head := k.ID + "." + id + "." + strconv.FormatInt(issued.UnixMilli(), 10) + "." +
		strconv.FormatInt(expires.UnixMilli(), 10) + "."
	return head + b64.EncodeToString(mac(k.Secret, p, head, body)) + "." + body, id
}

// parts splits a sealed string; ok is false for anything not shaped as one.
func parts(s string) (head, keyID, id string, issued, expires int64, sum []byte, body string, ok bool) {
	var f [5]string
	rest := s
	n := 0
	for i := range f {
		j := strings.IndexByte(rest, '.')
		if j < 0 || n+j > maxHeader {
			return
		}
		f[i], rest = rest[:j], rest[j+1:]
		n += j + 1
	}
	head = s[:n-len(f[4])-1]
	var err1, err2, err3 error
	issued, err1 = strconv.ParseInt(f[2], 10, 64)
	expires, err2 = strconv.ParseInt(f[3], 10, 64)
	sum, err3 = b64.DecodeString(f[4])
	if f[0] == "" || f[1] == "" || err1 != nil || err2 != nil || err3 != nil {
		return
	}
	return head, f[0], f[1], issued, expires, sum, rest, true
}

// open verifies s against the keys lookup finds: its MAC (in constant
// time), under a known key, not expired at now.
func open(lookup func(id string) (Key, bool), p Purpose, s string, now time.Time) (Sealed, error) {
	head, keyID, id, issued, expires, sum, body, ok := parts(s)
	if !ok {
		return Sealed{}, ErrForged
	}
	k, known := lookup(keyID)
	if !known {
		return Sealed{}, ErrUnknownKey
	}
	if !hmac.Equal(sum, mac(k.Secret, p, head, body)) {
		return Sealed{}, ErrForged
	}
	out := Sealed{ID: id, KeyID: keyID, Issued: time.UnixMilli(issued), Expires: time.UnixMilli(expires), Body: body}
	if !now.Before(out.Expires) {
		return Sealed{}, ErrExpired
	}
	return out, nil
}

// Fields seals the gate→meter field (all of it: tenant, principal, model,
// decision, reservation, ...) and checks it at the meter: each is valid
// until issued plus Longest (the longest stream) and used once.
type Fields struct {
	Ring    *Keyring
	Once    Once
	Longest time.Duration
}

// Seal seals field, whose tenant is tenant, and records it outstanding.
// The sealed field is returned whatever the record's error: ErrTenantFull
// or ErrFull (the caller refuses the request), or the store's (the field
// may still be used: its claim, finding nothing, reads it as a replay, or,
// the store still down, as uncertain).
func (f Fields) Seal(ctx context.Context, tenant, field string) (string, error) {
	s, id, exp := f.Ring.SealID(Field, field, f.Ring.Now().Add(f.Longest))
	return s, f.Once.Issue(ctx, Field, tenant, id, exp)
}

// Open verifies a sealed field: its body, id and expiry.
func (f Fields) Open(sealed string) (field, id string, expires time.Time, err error) {
	s, err := f.Ring.Open(Field, sealed)
	return s.Body, s.ID, s.Expires, err
}

// Claim records a field's id as used by claimant: true the first time,
// and for the same claimant's retry.
func (f Fields) Claim(ctx context.Context, tenant, id, claimant string, expires time.Time) (bool, error) {
	return f.Once.Claim(ctx, Field, tenant, id, claimant, expires)
}
