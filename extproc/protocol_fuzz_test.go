package extproc

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/tally"
)

// script turns fuzz bytes into a sequence of ext_proc messages: whatever
// Envoy, or anything else that reaches the port, could send, in any order.
type script struct{ b []byte }

func (s *script) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

// str takes a length-prefixed string; a length byte of 255 asks for a huge
// one (1 MiB), as an attacker would.
func (s *script) str() string {
	n := int(s.byte())
	if n == 255 {
		return strings.Repeat("x", 1<<20)
	}
	n = min(n, len(s.b))
	v := string(s.b[:n])
	s.b = s.b[n:]
	return v
}

func (s *script) number() float64 {
	switch s.byte() % 8 {
	case 0:
		return math.NaN()
	case 1:
		return math.Inf(1)
	case 2:
		return -1e18
	case 3:
		return 1e18
	case 4:
		return -1
	case 5:
		return 0
	}
	return float64(s.byte()) * 7
}

var fuzzKeys = []string{":method", ":path", "content-type", "x-request-id", request.ModelHeader, request.PoolHeader,
	":status", "authorization", "x_infergate_model", "traceparent"}
var fuzzAttrs = []string{"response.code", "upstream.request_attempt_count", "request.time", "upstream.address",
	"xds.cluster_name", "xds.cluster_metadata", "upstream.locality", "response.code_details", request.MeterAttribute, request.PoolOrderAttribute}
var fuzzMeta = []string{"model", "stream", "prompt_tokens", "gate_us", "auth_us", "reservation", "tenant", request.TraceparentKey}

func (s *script) headers() *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for range s.byte() % 6 {
		k := fuzzKeys[int(s.byte())%len(fuzzKeys)]
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(s.str())})
	}
	return hm
}

func (s *script) value() *structpb.Value {
	switch s.byte() % 3 {
	case 0:
		return structpb.NewNumberValue(s.number())
	case 1:
		// The gate's field, well-formed, with hostile values.
		f := gateField{sent: int64(s.number()), stream: s.byte()%2 == 0, promptTokens: int64(s.number()), gateUS: int64(s.number()),
			checksUS: int64(s.number()), requestID: strings.ToValidUTF8(s.str(), ""), model: strings.ToValidUTF8(s.str(), ""),
			tenant: strings.ToValidUTF8(s.str(), ""), reservation: strings.ToValidUTF8(s.str(), "")}
		return structpb.NewStringValue(f.encode())
	}
	return structpb.NewStringValue(strings.ToValidUTF8(s.str(), ""))
}

func (s *script) message() *extprocv3.ProcessingRequest {
	msg := &extprocv3.ProcessingRequest{ObservabilityMode: s.byte()%2 == 0}
	if s.byte()%3 == 0 {
		fields := map[string]*structpb.Value{}
		for range s.byte() % 4 {
			fields[fuzzAttrs[int(s.byte())%len(fuzzAttrs)]] = s.value()
		}
		msg.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: fields}}
	}
	if s.byte()%3 == 0 {
		fields := map[string]*structpb.Value{}
		for range s.byte() % 4 {
			fields[fuzzMeta[int(s.byte())%len(fuzzMeta)]] = s.value()
		}
		msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			request.MetadataNamespace: {Fields: fields},
			request.MeterNamespace:    {Fields: map[string]*structpb.Value{request.MeterKey: s.value()}}}}
	}
	if s.byte()%2 == 0 {
		msg.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes.ProcessingMode_BodySendMode(s.byte() % 6),
			SendBodyWithoutWaitingForHeaderResponse: s.byte()%2 == 0}
	}
	eos := s.byte()%2 == 0
	switch s.byte() % 6 {
	case 0:
		msg.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: s.headers(), EndOfStream: eos}}
	case 1:
		msg.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(s.str()), EndOfStream: eos}}
	case 2:
		msg.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: s.headers(), EndOfStream: eos}}
	case 3:
		msg.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(s.str()), EndOfStream: eos}}
	case 4:
		msg.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
	default:
		msg.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
	}
	return msg
}

// FuzzProtocol drives the gate and the meter with arbitrary message
// sequences: neither may panic (the fuzzer calls them without the
// recovery the server adds), the gate must answer a request whose
// headers and body it has seen, and nothing the meter keeps may exceed its
// bounds.
func FuzzProtocol(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 0, 0, 0, 3, 0, 7, 2, '/', 'v', 1, 1, 1, 1, 1, 0, 1, 2, '{', '}'})
	f.Add([]byte{1, 0, 1, 2, 1, 0, 0, 255, 1, 3, 5, 0, 255, 0, 1})
	f.Add([]byte{2, 3, 1, 1, 3, 1, 9, 1, 2, 9, 0, 1, 1, 0, 0, 3, 255})
	f.Add([]byte{0, 0, 2, 0, 0, 1, 2, 255, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 3, 1, 1, 'x'})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, sink := newTestServer(t, "")
		ctx := context.Background()
		sc := &script{b: data}

		// The gate: answers owed are given; a decision comes at the latest
		// once the body (or a body-less request) is complete.
		g := &gateRequest{started: time.Now(), eager: sc.byte()%2 == 0}
		sawEnd := false
		for i := 0; i < 8 && len(sc.b) > 0; i++ {
			msg := sc.message()
			s.gateStep(ctx, g, msg)
			switch m := msg.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				sawEnd = sawEnd || m.RequestHeaders.GetEndOfStream()
			case *extprocv3.ProcessingRequest_RequestBody:
				sawEnd = sawEnd || (g.headers != nil && m.RequestBody.GetEndOfStream())
			}
			if sawEnd && !g.decided {
				t.Fatalf("request complete after message %d (%T) but undecided", i, msg.Request)
			}
		}

		// The meter.
		m := s.newMeterRequest()
		for i := 0; i < 8 && len(sc.b) > 0; i++ {
			if m.observe(sc.message(), time.Now()) {
				break
			}
			if m.Tally.Kept() > tally.MaxKept || len(m.Tally.Gaps) > m.Tally.MaxGaps {
				t.Fatalf("meter holds %d body bytes, %d gaps", m.Tally.Kept(), len(m.Tally.Gaps))
			}
		}
		s.finish(ctx, m, time.Now(), sc.byte()%2 == 0)
		for _, st := range sink.stamps {
			for _, v := range []string{st.RequestID, st.Model, st.Pool, st.Upstream, st.Tenant, st.Principal, st.ResponseModel} {
				if len(v) > request.MaxStampField {
					t.Fatalf("a stamp field of %d bytes", len(v))
				}
			}
			if st.Attempts < 0 || st.Attempts > meter.MaxAttempts || len(st.PoolsTried) > request.MaxPoolsTried || st.PromptTokens < 0 {
				t.Fatalf("stamp out of range: attempts %d, pools tried %d, prompt tokens %d", st.Attempts, len(st.PoolsTried), st.PromptTokens)
			}
			// Whatever time the gate's field claims, the meter's own
			// timings stay within what it saw (messages arrive now).
			if st.E2E < 0 || st.TTFT < 0 || st.Gateway.Total < 0 || st.E2E > time.Hour+time.Minute {
				t.Fatalf("timings out of range: E2E %v, TTFT %v, gateway %v", st.E2E, st.TTFT, st.Gateway.Total)
			}
		}
	})
}
