package admission

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/seal"
)

// A reservation travels from the gate to the meter as a string in Envoy's
// dynamic metadata: the JSON of a sealedReservation. It is written and
// read once per request, so both ways avoid encoding/json's reflection.

// sealedReservation is what the gate seals for the meter: the counters
// the request reserved on, and the bounds its charge may not pass, fixed
// at admission where the gate knows them (what the meter reports is the
// pool's word; these are infergate's, under the seal).
type sealedReservation struct {
	ratelimit.Reservation
	proofBounds
}

// proofBounds are the most a request can have used, as its admission
// proves: no pool's usage is charged past them (see bound).
type proofBounds struct {
	// MaxOutput is the output cap sent upstream times the choices asked
	// for: the most output tokens the pool may write. -1: unknown (a
	// reservation sealed before the bound existed, a request whose output
	// the gate does not cap).
	MaxOutput int64 `json:"o"`
	// MaxInput is the most input tokens the request's body can make a
	// server count (openai.Request.MaxPromptTokens). -1: unknown (the
	// body refers to input the gate cannot see).
	MaxInput int64 `json:"i"`
}

// unknownBounds are the bounds of a reservation that carries none.
var unknownBounds = proofBounds{MaxOutput: -1, MaxInput: -1}

// maxBound is the largest bound a sealed reservation may carry.
const maxBound = 1 << 62

// encodeReservation is json.Marshal(r), byte for byte.
func encodeReservation(r sealedReservation) string {
	b := make([]byte, 0, 32+100*len(r.Entries))
	b = append(b, `{"e":`...)
	if r.Entries == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, e := range r.Entries {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"k":`...)
			b = appendJSONString(b, e.Counter)
			b = append(b, `,"u":`...)
			b = appendJSONString(b, string(e.Unit))
			b = append(b, `,"r":`...)
			b = strconv.AppendInt(b, e.Reserved, 10)
			b = append(b, `,"x":`...)
			b = strconv.AppendInt(b, e.ExpiresAt, 10)
			if e.Limit != 0 {
				b = append(b, `,"l":`...)
				b = strconv.AppendInt(b, e.Limit, 10)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"o":`...)
	b = strconv.AppendInt(b, r.MaxOutput, 10)
	b = append(b, `,"i":`...)
	b = strconv.AppendInt(b, r.MaxInput, 10)
	return string(append(b, '}'))
}

// appendJSONString quotes s as encoding/json does; the common case (plain
// printable ASCII) without it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, _ := json.Marshal(s)
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// decodeReservation reads what encodeReservation (or json.Marshal) wrote;
// a reservation sealed without bounds (or an entry without a limit) reads
// as unknownBounds (no debt).
func decodeReservation(s string) (sealedReservation, error) {
	r := sealedReservation{proofBounds: unknownBounds}
	if len(s) > maxSealedReservation {
		return r, errors.New("longer than " + strconv.Itoa(maxSealedReservation) + " bytes")
	}
	doc := gjson.Parse(s)
	if !gjson.Valid(s) || !doc.IsObject() {
		return r, errors.New("not a JSON object")
	}
	for _, f := range [...]struct {
		key string
		dst *int64
	}{{"o", &r.MaxOutput}, {"i", &r.MaxInput}} {
		v := doc.Get(f.key)
		switch {
		case !v.Exists():
		case v.Type != gjson.Number || v.Int() < -1 || v.Int() > maxBound || v.Raw != strconv.FormatInt(v.Int(), 10):
			return r, errors.New(`"` + f.key + `" is not a bound`)
		default:
			*f.dst = v.Int()
		}
	}
	e := doc.Get("e")
	if !e.IsArray() {
		if e.Type == gjson.Null {
			return r, nil
		}
		return r, errors.New(`"e" is not an array`)
	}
	var err error
	r.Entries = make([]ratelimit.Entry, 0, 4)
	e.ForEach(func(_, v gjson.Result) bool {
		if len(r.Entries) == maxEntries {
			err = errors.New("more than " + strconv.Itoa(maxEntries) + " entries")
			return false
		}
		k, u, res, x, l := v.Get("k"), v.Get("u"), v.Get("r"), v.Get("x"), v.Get("l")
		if !v.IsObject() || k.Type != gjson.String || u.Type != gjson.String || res.Type != gjson.Number || x.Type != gjson.Number ||
			len(k.Str) > maxCounter || len(u.Str) > maxCounter || l.Exists() && (l.Type != gjson.Number || l.Int() < 0) {
			err = errors.New("malformed entry " + truncate(v.Raw, 256))
			return false
		}
		r.Entries = append(r.Entries, ratelimit.Entry{Counter: k.Str, Unit: ratelimit.Unit(u.Str), Reserved: res.Int(), ExpiresAt: x.Int(), Limit: l.Int()})
		return true
	})
	return r, err
}

// A reservation is sealed before it leaves the gate (internal/seal): an
// HMAC-SHA256 under the replicas' current key, over the tenant and the
// reservation, with a random id, the time it was issued and an expiry
// (its window's end plus the longest stream, held to the keyring's
// MaxAge). The meter hands it back for settling, and anything that
// reaches the ext_proc port could send one (its counter keys are Redis
// keys): a seal that does not verify, names an unknown key or has expired
// is refused, and a verified one settles once (Controller.Settled), so
// counters move only as infergate decided, once, and the tenant charged
// is the one the gate identified.
//
// Sealed body: base64url(tenant) "." reservation JSON.

// DefaultLongestStream is how long after its window's end a reservation
// may still be settled when Controller.LongestStream is not set.
const DefaultLongestStream = time.Hour

// Bounds on what a sealed reservation may hold: checked before anything
// is decoded (the gate never writes more: a policy's limits are few).
const (
	maxSealedReservation = 16 << 10
	maxEntries           = 64
	maxCounter           = 1 << 10
)

var b64 = base64.RawURLEncoding

var (
	// errForged marks a reservation whose seal does not verify.
	errForged = errors.New("reservation seal does not verify")
	// errReplayed marks a reservation settled (or released) before.
	errReplayed = errors.New("reservation already settled")
)

// sealReservation seals r's encoding for tenant, expiring at the end of
// its last window plus the longest stream, and records it outstanding.
// An error of seal.ErrTenantFull or seal.ErrFull: the request must be
// refused (nothing may settle a seal not recorded); any other (the store
// unreachable) is logged and the seal used all the same (it stays
// charged until its window ends).
func (c *Controller) sealReservation(ctx context.Context, tenant string, r sealedReservation) (string, error) {
	end := c.now()
	for _, e := range r.Entries {
		if x := time.UnixMilli(e.ExpiresAt); x.After(end) {
			end = x
		}
	}
	longest := c.LongestStream
	if longest <= 0 {
		longest = DefaultLongestStream
	}
	sealed, id, exp := c.keyring().SealID(seal.Reservation, b64.EncodeToString([]byte(tenant))+"."+encodeReservation(r), end.Add(longest))
	if err := c.settled().Issue(ctx, seal.Reservation, tenant, id, exp); err != nil {
		if errors.Is(err, seal.ErrTenantFull) || errors.Is(err, seal.ErrFull) {
			return "", err
		}
		c.Log.Error("could not record a reservation as outstanding; it stays charged until its window ends", "err", err)
	}
	return sealed, nil
}

// errClaimUncertain marks a reservation whose claim the store did not
// answer: verified (its tenant and counters are infergate's), but whether
// it was settled before is unknown, so it stays charged whole.
var errClaimUncertain = errors.New("reservation's settlement could not be recorded")

// openSealed verifies a sealed reservation, decodes it, and claims its
// seal: a second settlement of one seal (a replay) is refused. A claim
// the store did not answer (errClaimUncertain) still returns the tenant
// and the reservation, which verified: the caller keeps the charge whole.
func (c *Controller) openSealed(ctx context.Context, sealed string) (tenant string, r sealedReservation, err error) {
	if len(sealed) > maxSealedReservation {
		return "", r, errForged
	}
	s, err := c.keyring().Open(seal.Reservation, sealed)
	if err != nil {
		return "", r, fmt.Errorf("%w: %w", errForged, err)
	}
	tenant64, payload, ok := strings.Cut(s.Body, ".")
	t, err := b64.DecodeString(tenant64)
	if !ok || err != nil {
		return "", r, errForged
	}
	if r, err = decodeReservation(payload); err != nil {
		return "", r, err
	}
	first, err := c.settled().Claim(ctx, seal.Reservation, string(t), s.ID, seal.NewClaimant(), s.Expires)
	switch {
	case errors.Is(err, seal.ErrExpired):
		return "", sealedReservation{}, fmt.Errorf("%w: %w", errForged, err)
	case err != nil:
		return string(t), r, fmt.Errorf("%w: %w", errClaimUncertain, err)
	case !first:
		return "", sealedReservation{}, errReplayed
	}
	return string(t), r, nil
}

// consume claims a sealed reservation that will never be settled (the
// gate released it): a copy of it that reaches Settle is refused.
func (c *Controller) consume(ctx context.Context, sealed string) {
	if sealed == "" {
		return
	}
	if _, _, err := c.openSealed(ctx, sealed); err != nil {
		c.Log.Error("could not record a released reservation as settled", "err", err)
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
