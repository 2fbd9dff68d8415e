package extproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

const testKey = "sk-identify-test"

// keyedServer is a test server whose policy is the real admission
// controller with one API key: a caller without it is unauthenticated.
func keyedServer(tb testing.TB) (*Server, *captureSink) {
	tb.Helper()
	s, sink := newTestServer(tb, "log: {requests: false}")
	sum := sha256.Sum256([]byte(testKey))
	path := filepath.Join(tb.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte("keys:\n- id: k1\n  sha256: "+hex.EncodeToString(sum[:])+"\n  tenant: acme\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	keys, err := identity.LoadKeys(path)
	if err != nil {
		tb.Fatal(err)
	}
	set := &identity.KeySet{}
	set.Store(keys)
	m, err := admission.NewMetrics(sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		tb.Fatal(err)
	}
	s.policy = &admission.Controller{Keys: set, Log: slog.New(slog.DiscardHandler), Metrics: m}
	return s, sink
}

// tokenIDBody is a /v1/completions body of about size bytes whose prompt
// is token IDs: the cheapest bytes for a client, the dearest to parse.
func tokenIDBody(size int) string {
	const id = "12345,"
	return `{"model":"m","prompt":[` + strings.Repeat(id, size/len(id)) + `1]}`
}

// chunks splits body as Envoy streams it.
func chunks(body string, size int) []*extprocv3.ProcessingRequest {
	var out []*extprocv3.ProcessingRequest
	for len(body) > size {
		out = append(out, bodyMsg(body[:size], false))
		body = body[size:]
	}
	return append(out, bodyMsg(body, true))
}

var completionHeaders = []string{":method", "POST", ":path", "/v1/completions", "content-type", "application/json", "x-request-id", "unauth"}

// BenchmarkGateUnauthenticated is the gate's work for a body of token IDs
// from a caller without a key, streamed as Envoy sends it, up to the
// gate's answer: the same for any size of body.
func BenchmarkGateUnauthenticated(b *testing.B) {
	for _, size := range []int{1 << 10, 960 << 10} {
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			s, _ := keyedServer(b)
			msgs := append([]*extprocv3.ProcessingRequest{headersMsg(false, completionHeaders...)}, chunks(tokenIDBody(size), 16<<10)...)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				g := &gateRequest{started: time.Now(), eager: true}
				var out []*extprocv3.ProcessingResponse
				for _, m := range msgs {
					if out = s.gateStep(ctx, g, m); out != nil {
						break
					}
				}
				if out[0].GetImmediateResponse().GetStatus().GetCode() != 401 {
					b.Fatal(out)
				}
			}
		})
	}
}

// A caller without a credential is answered 401 from its headers alone, in
// both body modes: the gate neither waits for the body nor reads it, so a
// body that is invalid, or huge, tells it nothing. Authentication comes
// before every check of the request itself (method, type, size, JSON,
// fields): an unauthenticated caller learns nothing about them. With the
// key, the same bodies get their usual answers.
func TestGateIdentifiesBeforeTheBody(t *testing.T) {
	s, sink := keyedServer(t)
	buffered := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes.ProcessingMode_BUFFERED}
		return m
	}
	for _, tc := range []struct {
		name     string
		eager    bool
		headers  *extprocv3.ProcessingRequest
		body     string // sent with the key: its usual answer is want
		want     int
		wantCode string
	}{
		{"invalid JSON, streamed", true, headersMsg(false, completionHeaders...), `{"model":`, 400, "invalid_json"},
		{"invalid JSON, buffered", false, buffered(headersMsg(false, completionHeaders...)), `{"model":`, 400, "invalid_json"},
		{"960 KB of token IDs", true, headersMsg(false, completionHeaders...), tokenIDBody(960 << 10), 200, ""},
		{"wrong method", true, headersMsg(false, ":method", "PUT", ":path", "/v1/completions", "content-type", "application/json"), `{}`, 405, "method_not_allowed"},
		{"no body", true, headersMsg(true, ":method", "GET", ":path", "/v1/completions"), "", 405, "method_not_allowed"},
		{"unknown path", true, headersMsg(false, ":method", "POST", ":path", "/admin", "content-type", "application/json"), `{}`, 404, "unknown_url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gateRequest{started: time.Now(), eager: tc.eager}
			out := s.gateStep(context.Background(), g, tc.headers)
			if len(out) != 1 || out[0].GetImmediateResponse() == nil {
				t.Fatalf("the request headers got %v, want one immediate response", out)
			}
			ir := out[0].GetImmediateResponse()
			if ir.GetStatus().GetCode() != 401 || !strings.Contains(string(ir.GetBody()), `"code":"invalid_api_key"`) {
				t.Errorf("got %d %s, want 401 invalid_api_key", ir.GetStatus().GetCode(), ir.GetBody())
			}
			if g.body != nil || !g.decided {
				t.Errorf("body %d bytes kept, decided %v: the gate must be done before the body", len(g.body), g.decided)
			}
			st := sink.stamps[len(sink.stamps)-1]
			if st.Decision != "deny" || st.Status != 401 || st.Reason != "unauthenticated" || st.Model != "" {
				t.Errorf("stamp = %+v", st)
			}
			// Chunks Envoy sent before it read the answer are let go unread.
			if out := s.gateStep(context.Background(), g, bodyMsg(tc.body, true)); len(out) != 1 || out[0].GetRequestBody() == nil || g.body != nil {
				t.Errorf("a chunk after the answer got %v", out)
			}

			// With the key: the usual answer, from the body.
			h := proto.Clone(tc.headers).(*extprocv3.ProcessingRequest)
			rh := h.GetRequestHeaders().GetHeaders()
			rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: "authorization", RawValue: []byte("Bearer " + testKey)})
			g = &gateRequest{started: time.Now(), eager: tc.eager}
			out = s.gateStep(context.Background(), g, h)
			if !h.GetRequestHeaders().GetEndOfStream() {
				if len(out) > 0 && out[0].GetImmediateResponse() != nil {
					t.Fatalf("with the key, the headers got %v", out)
				}
				out = s.gateStep(context.Background(), g, bodyMsg(tc.body, true))
			}
			code := 200
			if ir := out[0].GetImmediateResponse(); ir != nil {
				code = int(ir.GetStatus().GetCode())
				if !strings.Contains(string(ir.GetBody()), `"code":"`+tc.wantCode+`"`) {
					t.Errorf("with the key: %s, want code %s", ir.GetBody(), tc.wantCode)
				}
			}
			if code != tc.want {
				t.Errorf("with the key: %d, want %d", code, tc.want)
			}
		})
	}
}

// Verified JWT claims in Envoy's metadata identify the caller before the
// body as an API key does; Decide still identifies it on its own.
func TestGateIdentifiesFromJWTMetadata(t *testing.T) {
	s, _ := keyedServer(t)
	c := s.policy.(*admission.Controller)
	c.JWT = admission.JWT{Enabled: true, Namespace: "envoy.filters.http.jwt_authn", PayloadKey: "jwt_payload", TenantClaim: "tenant"}
	h := headersMsg(false, completionHeaders...)
	claims, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "u1", "tenant": "acme"}})
	h.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": claims}}
	g := &gateRequest{started: time.Now(), eager: true}
	if out := s.gateStep(context.Background(), g, h); out != nil {
		t.Fatalf("claims in the metadata: the headers got %v", out)
	}
	out := s.gateStep(context.Background(), g, bodyMsg(`{"model":"m","prompt":"hi"}`, true))
	md := out[0].GetDynamicMetadata().GetFields()[request.MetadataNamespace].GetStructValue().GetFields()
	if out[0].GetImmediateResponse() != nil || md["tenant"].GetStringValue() != "acme" {
		t.Fatalf("got %v", out)
	}
}

// A Policy's Identify is asked with what the headers tell (path, API,
// metadata; client x-infergate-* headers removed) and no body.
func TestGateIdentifyAdmission(t *testing.T) {
	s, _ := newTestServer(t, "")
	p := &identifyRecorder{}
	s.policy = p
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, chatHeaders...))
	if len(p.asked) != 1 {
		t.Fatalf("Identify asked %d times", len(p.asked))
	}
	a := p.asked[0]
	if a.Path != "/v1/chat/completions" || a.API != openai.APIChat || !a.Completion || a.Body != nil || a.RequestID != "req-1" {
		t.Errorf("admission = %+v", a)
	}
	if _, ok := a.Headers[request.ModelHeader]; ok {
		t.Errorf("a client's %s reached the policy", request.ModelHeader)
	}
}

type identifyRecorder struct {
	request.AllowAll
	asked []*request.Admission
}

func (p *identifyRecorder) Identify(_ context.Context, a *request.Admission) request.Verdict {
	p.asked = append(p.asked, a)
	return request.Verdict{}
}

// FuzzGateUnauthenticated drives the gate, with a key required, through
// arbitrary message sequences: request headers without the key are
// answered 401 at once, and nothing a body carries after that is kept.
func FuzzGateUnauthenticated(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 0, 0, 0, 3, 0, 7, 2, '/', 'v', 1, 1, 1, 1, 1, 0, 1, 2, '{', '}'})
	f.Add([]byte{1, 0, 1, 2, 1, 0, 0, 255, 1, 3, 5, 0, 255, 0, 1})
	f.Add([]byte{0, 0, 2, 0, 0, 1, 2, 255, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 3, 1, 1, 'x'})
	f.Add([]byte("001100011\x0300000")) // a body before the headers (kept), then keyless headers
	s, _ := keyedServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		sc := &script{b: data}
		g := &gateRequest{started: time.Now(), eager: sc.byte()%2 == 0}
		refused, kept := false, 0
		for i := 0; i < 8 && len(sc.b) > 0; i++ {
			msg := sc.message()
			h, isHeaders := msg.Request.(*extprocv3.ProcessingRequest_RequestHeaders)
			keyless := isHeaders && !g.decided && !slices.ContainsFunc(h.RequestHeaders.GetHeaders().GetHeaders(),
				func(v *corev3.HeaderValue) bool {
					return v.GetKey() == "authorization" && string(v.GetRawValue()) == "Bearer "+testKey
				})
			out := s.gateStep(context.Background(), g, msg)
			if keyless {
				if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 401 {
					t.Fatalf("keyless request headers answered %v", out)
				}
				refused, kept = true, len(g.body)
			}
			if refused && len(g.body) != kept {
				t.Fatalf("%d body bytes kept after the 401", len(g.body)-kept)
			}
		}
	})
}
