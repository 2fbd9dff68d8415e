package admission

import (
	"encoding/json"
	"errors"
	"strconv"

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
