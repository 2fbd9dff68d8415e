package admission

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/internal/ratelimit"
)

// A reservation travels from the gate to the meter as a string in Envoy's
// dynamic metadata: the JSON of ratelimit.Reservation. It is written and
// read once per request, so both ways avoid encoding/json's reflection.

// encodeReservation is json.Marshal(r), byte for byte.
func encodeReservation(r ratelimit.Reservation) string {
	b := make([]byte, 0, 8+80*len(r.Entries))
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
			b = append(b, '}')
		}
		b = append(b, ']')
	}
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

// decodeReservation reads what encodeReservation (or json.Marshal) wrote.
func decodeReservation(s string) (ratelimit.Reservation, error) {
	var r ratelimit.Reservation
	doc := gjson.Parse(s)
	if !gjson.Valid(s) || !doc.IsObject() {
		return r, errors.New("not a JSON object")
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
		k, u, res, x := v.Get("k"), v.Get("u"), v.Get("r"), v.Get("x")
		if !v.IsObject() || k.Type != gjson.String || u.Type != gjson.String || res.Type != gjson.Number || x.Type != gjson.Number {
			err = errors.New("malformed entry " + v.Raw)
			return false
		}
		r.Entries = append(r.Entries, ratelimit.Entry{Counter: k.Str, Unit: ratelimit.Unit(u.Str), Reserved: res.Int(), ExpiresAt: x.Int()})
		return true
	})
	return r, err
}

// A reservation is sealed before it leaves the gate: an HMAC-SHA256 under
// a key only infergate holds, over the tenant and the reservation. The
// meter hands it back for settling, and anything that reaches the ext_proc
// port could forge one (its counter keys are Redis keys): a seal that does
// not verify is refused, so counters move only as infergate decided, and
// the tenant charged is the one the gate identified.
//
// Sealed form: base64url(mac) "." base64url(tenant) "." reservation JSON.

// NewReservationKey returns a fresh random key.
func NewReservationKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return k
}

func reservationMAC(key []byte, tenant, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(tenant))
	m.Write([]byte{0})
	m.Write([]byte(payload))
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// sealReservation binds payload (encodeReservation's) to tenant under key.
func sealReservation(key []byte, tenant, payload string) string {
	return b64.EncodeToString(reservationMAC(key, tenant, payload)) + "." + b64.EncodeToString([]byte(tenant)) + "." + payload
}

// errForged marks a reservation whose seal does not verify.
var errForged = errors.New("reservation seal does not verify")

// openReservation verifies a sealed reservation and returns its tenant and
// payload.
func openReservation(key []byte, sealed string) (tenant, payload string, err error) {
	mac64, rest, ok1 := strings.Cut(sealed, ".")
	tenant64, payload, ok2 := strings.Cut(rest, ".")
	mac, err1 := b64.DecodeString(mac64)
	t, err2 := b64.DecodeString(tenant64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		return "", "", errForged
	}
	if !hmac.Equal(mac, reservationMAC(key, string(t), payload)) {
		return "", "", errForged
	}
	return string(t), payload, nil
}
