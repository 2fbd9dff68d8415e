package extproc

import (
	"context"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/request"
)

// The meter's field: what the meter needs of the gate's decision, as one
// string. The gate writes it once per request (request.MeterNamespace,
// key request.MeterKey) and Envoy hands it to the meter once, as an
// attribute of the request headers (request.MeterAttribute), where a
// forwarded metadata namespace would ride on every message Envoy builds,
// each body chunk included.
//
// Version 1, seventeen fields separated by '|':
//
//	1|sent|flags|prompt_tokens|gate_us|auth_us|policy_us|ratelimit_us|checks_us|decision|request_id|model|tenant|principal|reason|traceparent|reservation
//
// sent is when the gate answered, in Unix microseconds of the gate's clock;
// flags is a decimal bit set (1: the request streams); the other numbers
// are decimal integers; the strings have '%' and '|' escaped as %25 and
// %7C. The reader takes the first seventeen fields and ignores any after
// them (a later writer of version 1 may append some); a value of another
// version, longer than maxMeterField, or with fewer fields is absent. A
// number that does not parse is absent (0); every value is range-checked
// where it is used, as anything that reaches the port may send one.
//
// Appended since, each absent from an older writer's field:
//
//	api: the request's API (openai.API: chat, embeddings, responses, messages, ...)
//
// Version 2 is a version-1 field sealed whole (Options.Sealer: an HMAC
// under the replicas' keyring, with a random id, an expiry and a key id):
//
//	2|<sealed version-1 field>
//
// Anything that reaches the port may send a meter stream or an access-log
// entry with a field: only a sealed one that verifies is trusted for who
// called (tenant, principal), what the gate decided and what it reserved.
// A version-1 field (an older gate's, or anyone's) is read for the
// request's timing, model and API only.

const (
	// maxMeterField bounds the field, both ways: the gate fails closed
	// rather than write a longer one, and the meter ignores a longer one.
	// Its strings are cut to the stamp's bounds before they are written, so
	// only a reservation over a hundred or so budgets could reach it.
	maxMeterField = 16 << 10
	meterVersion  = "1|"
	sealedVersion = "2|"
	meterFields   = 17 // the version included
	flagStream    = 1
)

// gateField is the meter's field, decoded.
type gateField struct {
	sent                                            int64 // Unix µs, the gate's clock
	stream                                          bool
	promptTokens                                    int64
	gateUS, authUS, policyUS, rateLimitUS, checksUS int64
	decision, requestID, model, tenant, principal   string
	reason, traceparent, reservation                string
	api                                             string // appended: see above
}

// encode renders f in version 1.
func (f *gateField) encode() string {
	n := 64 + len(f.api) + len(f.decision) + len(f.requestID) + len(f.model) + len(f.tenant) + len(f.principal) +
		len(f.reason) + len(f.traceparent) + len(f.reservation)
	b := make([]byte, 0, n)
	b = append(b, meterVersion...)
	b = strconv.AppendInt(b, f.sent, 10)
	flags := int64(0)
	if f.stream {
		flags |= flagStream
	}
	for _, v := range [...]int64{flags, f.promptTokens, f.gateUS, f.authUS, f.policyUS, f.rateLimitUS, f.checksUS} {
		b = append(b, '|')
		b = strconv.AppendInt(b, v, 10)
	}
	for _, v := range [...]string{f.decision, f.requestID, f.model, f.tenant, f.principal, f.reason, f.traceparent, f.reservation, f.api} {
		b = append(b, '|')
		b = appendEscaped(b, v)
	}
	return string(b)
}

// FieldSealer seals the gate's field for the meter and checks it there;
// the composition root wires the replicas' keyring (internal/seal.Fields).
type FieldSealer interface {
	// Seal seals a version-1 field whose tenant is tenant and records it
	// outstanding, within the tenant's share of such records: the sealed
	// field always, and seal.ErrTenantFull or seal.ErrFull when it may not
	// be used (the request is refused), another error when the record
	// failed otherwise (the field goes all the same).
	Seal(ctx context.Context, tenant, field string) (string, error)
	// Open verifies a sealed field (MAC, key, expiry) and returns it, its
	// seal's id and expiry.
	Open(sealed string) (field, id string, expires time.Time, err error)
	// Claim records a seal's id as used by claimant: true the first time
	// (and for the same claimant's retry), false for a replay; an error
	// when it cannot be recorded (the claim is then uncertain).
	Claim(ctx context.Context, tenant, id, claimant string, expires time.Time) (bool, error)
}

// fieldSeal is what the meter keeps of a verified field's seal, to claim
// it once the response ended; zero for a field that is not trusted.
type fieldSeal struct {
	id, tenant string // the tenant the field names: its seal is in that tenant's share
	expires    time.Time
}

// sealField renders f in version 2 (and the sealer's error: see Seal).
func sealField(ctx context.Context, sealer FieldSealer, f *gateField) (string, error) {
	s, err := sealer.Seal(ctx, f.tenant, f.encode())
	return sealedVersion + s, err
}

// readGateField decodes a field of either version. A sealed one is
// trusted once it verifies (fs set); one that does not verify is absent.
// A version-1 field is read untrusted: who called, the decision and the
// reservation are dropped.
func readGateField(sealer FieldSealer, s string) (f gateField, fs fieldSeal, ok bool) {
	if len(s) > maxMeterField {
		return f, fs, false
	}
	if sealed, isSealed := strings.CutPrefix(s, sealedVersion); isSealed {
		if sealer == nil {
			return f, fs, false
		}
		field, id, expires, err := sealer.Open(sealed)
		if err != nil {
			return f, fs, false
		}
		if f, ok = parseGateField(field); ok {
			fs = fieldSeal{id: id, tenant: f.tenant, expires: expires}
		}
		return f, fs, ok
	}
	if f, ok = parseGateField(s); ok {
		f.untrusted()
	}
	return f, fs, ok
}

// untrusted drops what only a verified field may say.
func (f *gateField) untrusted() {
	f.tenant, f.principal, f.decision, f.reason, f.reservation = "", "", "", "", ""
}

// parseGateField decodes what encode wrote; ok is false for anything else
// it cannot read (see above).
func parseGateField(s string) (f gateField, ok bool) {
	if len(s) > maxMeterField || !strings.HasPrefix(s, meterVersion) {
		return f, false
	}
	var v [meterFields - 1]string
	rest := s[len(meterVersion):]
	appended := "" // the fields after the seventeenth
	for i := range v {
		j := strings.IndexByte(rest, '|')
		if j < 0 {
			if i != len(v)-1 {
				return gateField{}, false
			}
			v[i] = rest
			break
		}
		v[i], rest = rest[:j], rest[j+1:]
		if i == len(v)-1 {
			appended = rest
		}
	}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0 // out of range included: ParseInt would give the bound
		}
		return n
	}
	f.sent = num(v[0])
	f.stream = num(v[1])&flagStream != 0
	f.promptTokens = num(v[2])
	f.gateUS, f.authUS, f.policyUS, f.rateLimitUS, f.checksUS = num(v[3]), num(v[4]), num(v[5]), num(v[6]), num(v[7])
	f.decision, f.requestID, f.model = unescape(v[8]), unescape(v[9]), unescape(v[10])
	f.tenant, f.principal, f.reason = unescape(v[11]), unescape(v[12]), unescape(v[13])
	f.traceparent, f.reservation = unescape(v[14]), unescape(v[15])
	api, _, _ := strings.Cut(appended, "|")
	f.api = unescape(api)
	return f, true
}

// appendEscaped appends s with '%' and '|' escaped.
func appendEscaped(b []byte, s string) []byte {
	for {
		i := strings.IndexAny(s, "%|")
		if i < 0 {
			return append(b, s...)
		}
		b = append(b, s[:i]...)
		if s[i] == '%' {
			b = append(b, "%25"...)
		} else {
			b = append(b, "%7C"...)
		}
		s = s[i+1:]
	}
}

// unescape undoes appendEscaped; any other '%' is kept as it is. The common
// case (no '%') is s itself, with no copy.
func unescape(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for ; i >= 0; i = strings.IndexByte(s, '%') {
		b.WriteString(s[:i])
		switch {
		case strings.HasPrefix(s[i:], "%25"):
			b.WriteByte('%')
			s = s[i+3:]
		case strings.HasPrefix(s[i:], "%7C"):
			b.WriteByte('|')
			s = s[i+3:]
		default:
			b.WriteByte('%')
			s = s[i+1:]
		}
	}
	b.WriteString(s)
	return b.String()
}

// fieldString is s as the gate writes it into the field: valid UTF-8 (a
// protobuf string; a client's request id may be any bytes) and cut to n
// bytes, as the stamp would cut it.
func fieldString(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return request.Truncate(s, n)
}

// sentTime is when the gate answered, or zero.
func (f *gateField) sentTime() time.Time {
	if f.sent <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(f.sent)
}
