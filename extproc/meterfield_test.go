package extproc

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

var sampleField = gateField{
	sent: 1796122683806478, stream: true, promptTokens: 42,
	gateUS: 310, authUS: 12, policyUS: 80, rateLimitUS: 150, checksUS: 0,
	decision: "allow", requestID: "6f1c-4e", model: "llama-3-70b", tenant: "acme", principal: "key:ci",
	reason: "ok", traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	reservation: `MAC.YWNtZQ.{"e":[{"k":"acme|tok","u":"total_tokens","r":1066,"x":1796122740000}]}`,
	api:         "chat",
}

// What the gate writes, the meter reads back exactly, whatever the strings
// hold: separators, escapes, escapes of escapes, any UTF-8.
func TestMeterFieldRoundTrip(t *testing.T) {
	for _, s := range []string{"", "|", "%", "%7C", "%25", "%%||%7c%2", "a|b%c", "ünï|cødé ✓", "%7C|%25|"} {
		f := sampleField
		f.decision, f.requestID, f.model, f.tenant, f.principal, f.reason, f.traceparent, f.reservation, f.api = s, s+"1", s+"2", s, s, s, s, s+"|r", s+"a"
		got, ok := parseGateField(f.encode())
		if !ok || got != f {
			t.Errorf("%q: round trip\n got %+v (ok %v)\nwant %+v", s, got, ok, f)
		}
	}
	if got, ok := parseGateField(sampleField.encode()); !ok || got != sampleField {
		t.Errorf("sample: %+v", got)
	}
	// The common case is plain text: nothing escaped.
	if enc := (&gateField{decision: "allow", model: "m", api: "embeddings"}).encode(); enc != "1|0|0|0|0|0|0|0|0|allow||m||||||embeddings" {
		t.Errorf("encoded %q", enc)
	}
}

func TestMeterFieldRefused(t *testing.T) {
	full := sampleField.encode()
	for name, s := range map[string]string{
		"empty":             "",
		"another version":   "2" + full[1:],
		"no version":        full[2:],
		"too few fields":    "1|1|0|0|0|0|0|0|0|allow|id|m|t|p|r|tp", // no reservation
		"longer than bound": full + "|" + strings.Repeat("x", maxMeterField),
		"whole-map text":    "CelMap value",
	} {
		if f, ok := parseGateField(s); ok {
			t.Errorf("%s: read as %+v", name, f)
		}
	}
	// Fields a later writer appends are ignored, and an older writer's
	// field lacks the appended api; a number that does not parse is absent.
	f, ok := parseGateField(full + "|later|fields")
	if !ok || f != sampleField {
		t.Errorf("appended fields: %+v, %v", f, ok)
	}
	older := sampleField
	older.api = ""
	f, ok = parseGateField(strings.TrimSuffix(full, "|chat"))
	if !ok || f != older {
		t.Errorf("an older writer's field: %+v, %v", f, ok)
	}
	f, ok = parseGateField("1|x|1|-7|1e9|99999999999999999999|0|0|0|a|b|c|d|e|f|g|h")
	if !ok || f.sent != 0 || !f.stream || f.promptTokens != -7 || f.gateUS != 0 || f.authUS != 0 || f.reservation != "h" {
		t.Errorf("numbers: %+v, %v", f, ok)
	}
}

// FuzzMeterField: the meter's reader, fed anything, never panics, never
// returns more than it was given, and what it reads the encoder writes back
// to a string it reads the same; and anything the encoder writes (from
// arbitrary strings and numbers) reads back exactly.
func FuzzMeterField(f *testing.F) {
	f.Add(sampleField.encode(), "a|b", "%7C", int64(1))
	f.Add("1|1|1|1|1|1|1|1|1|||||||%|", "", "", int64(-1))
	f.Add("1|"+strings.Repeat("|", 20), "ü", "%25%", int64(1<<62))
	f.Fuzz(func(t *testing.T, raw, a, b string, n int64) {
		if got, ok := parseGateField(raw); ok {
			for _, s := range []string{got.decision, got.requestID, got.model, got.tenant, got.principal, got.reason, got.traceparent, got.reservation, got.api} {
				if len(s) > len(raw) {
					t.Fatalf("read a %d-byte string from %d bytes", len(s), len(raw))
				}
			}
			again, ok := parseGateField(got.encode())
			if !ok || again != got {
				t.Fatalf("%q read as %+v; re-encoded, read as %+v (%v)", raw, got, again, ok)
			}
		}
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			return // the gate writes UTF-8 only (fieldString)
		}
		want := gateField{sent: n, stream: n%2 == 0, promptTokens: -n, gateUS: n, authUS: n / 3, policyUS: 1, rateLimitUS: n, checksUS: 0,
			decision: a, requestID: b, model: a + b, tenant: b + a, principal: a, reason: b, traceparent: a, reservation: b + "|" + a, api: a + "|"}
		enc := want.encode()
		if len(enc) > maxMeterField {
			return
		}
		if !utf8.ValidString(enc) {
			t.Fatalf("encoded %q is not UTF-8", enc)
		}
		if got, ok := parseGateField(enc); !ok || got != want {
			t.Fatalf("round trip of %+v: %+v (%v)", want, got, ok)
		}
	})
}

// fieldString keeps what the gate writes UTF-8 and within the stamp's bounds.
func TestFieldString(t *testing.T) {
	if got := fieldString("id-\xff\xfe", 256); got != "id-\uFFFD" {
		t.Errorf("%q", got)
	}
	if got := fieldString(strings.Repeat("é", 300), request.MaxStampField); len(got) > request.MaxStampField || !utf8.ValidString(got) {
		t.Errorf("%d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

func BenchmarkMeterField(b *testing.B) {
	enc := sampleField.encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseGateField(enc); !ok {
			b.Fatal("not read")
		}
	}
}

// testSealer seals as a Server without Options.Sealer does.
func testSealer() FieldSealer {
	return seal.Fields{Ring: processKeys(), Once: processOnce(), Longest: time.Hour}
}

// sealed is f as a gate of this process writes it (version 2).
func sealed(f *gateField) string {
	s, err := sealField(context.Background(), testSealer(), f)
	if err != nil {
		panic(err)
	}
	return s
}

// withGateField adds f, sealed, to msg's attributes, as Envoy sends it.
func withGateField(msg *extprocv3.ProcessingRequest, f *gateField) {
	if msg.Attributes == nil {
		msg.Attributes = map[string]*structpb.Struct{}
	}
	if msg.Attributes[attributesKey] == nil {
		msg.Attributes[attributesKey] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	msg.Attributes[attributesKey].Fields[request.MeterAttribute] = structpb.NewStringValue(sealed(f))
}
