package extproc

import (
	"context"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
)

// respHeadersWith is the response-headers message of a meter that skips the
// request headers: the gate's field, when given, and Envoy's request.time
// among the response attributes, as Envoy 1.40 sends them (keyed by the
// expression, the field a plain string).
func respHeadersWith(ct, field string, envoyStart time.Time) *extprocv3.ProcessingRequest {
	msg := respHeaders(ct)
	a := msg.Attributes[attributesKey].Fields
	if field != "" {
		a[request.MeterAttribute] = structpb.NewStringValue(field)
	}
	if !envoyStart.IsZero() {
		a["request.time"] = structpb.NewStringValue(envoyStart.UTC().Format("2006-01-02T15:04:05.999999-07:00"))
	}
	return msg
}

func newMeter(s *Server) *meterRequest {
	m := testMeter(100, &s.orders)
	return m
}

// The shipped meter (envoy/snippet.yaml): the gate's field and request.time
// arrive once, as request attributes, with the request headers, whose
// arrival starts TTFT and E2E as it always did; no metadata anywhere.
func TestMeterFieldAsRequestAttribute(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	f := sampleField
	f.sent = at(2).UnixMicro()
	hdrs := headersMsg(false, "x-request-id", "hdr-id", request.ModelHeader, "hdr-model")
	hdrs.ObservabilityMode = true
	hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
		request.MeterAttribute: structpb.NewStringValue(sealed(&f)),
		"request.time":         structpb.NewStringValue(t0.UTC().Format("2006-01-02T15:04:05.999999-07:00"))}}}
	m := newMeter(s)
	m.observe(hdrs, at(3))
	m.observe(respHeaders("text/event-stream"), at(40))
	m.observe(respBody(contentChunk, false), at(53))
	m.observe(respBody(usageChunk+"data: [DONE]\n\n", true), at(60))
	s.finish(context.Background(), m, at(60), true)
	st := sink.stamps[0]
	if st.RequestID != f.requestID || st.Model != f.model || st.Tenant != "acme" || st.Principal != f.principal || !st.Stream {
		t.Errorf("what the gate decided: %+v", st)
	}
	if st.TTFT != 50*time.Millisecond || st.E2E != 57*time.Millisecond || st.Gateway.Total != 3*time.Millisecond || !st.Start.Equal(t0) {
		t.Errorf("TTFT %v E2E %v gateway %v start %v; want 50ms 57ms 3ms, from the request headers' arrival", st.TTFT, st.E2E, st.Gateway.Total, st.Start.Sub(t0))
	}
	if len(p.settled) != 1 || p.settled[0].Reservation != f.reservation {
		t.Errorf("settlements %+v", p.settled)
	}
}

// Envoy's request.time is Envoy's clock, the arrivals infergate's: where
// Envoy's runs ahead by more than the gateway took (or the external checks
// took longer than the two clocks allow), the gateway's time is 0, never
// negative, and Total is still its parts' sum.
func TestStampAddsUpUnderClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name        string
		envoyAhead  time.Duration // Envoy's start after the headers' arrival
		checks      time.Duration
		wantGateway time.Duration
	}{
		// Envoy's clock ahead of the read: TestStampOf.
		{"in step", -3 * time.Millisecond, 0, 3 * time.Millisecond},
		{"checks longer than the clocks allow", -time.Millisecond, 2 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, sink := newTestServer(t, "")
			t0 := time.Unix(1_796_000_000, 0)
			f := sampleField
			f.sent, f.checksUS = t0.UnixMicro(), tc.checks.Microseconds()
			hdrs := headersMsg(false, "x-request-id", "hdr-id")
			hdrs.ObservabilityMode = true
			hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
				request.MeterAttribute: structpb.NewStringValue(sealed(&f)),
				"request.time":         structpb.NewStringValue(t0.Add(tc.envoyAhead).UTC().Format(time.RFC3339Nano))}}}
			m := newMeter(s)
			m.observe(hdrs, t0)
			m.observe(respHeaders("application/json"), t0.Add(40*time.Millisecond))
			s.finish(context.Background(), m, t0.Add(60*time.Millisecond), true)
			st := sink.stamps[0]
			if st.Gateway.Total != tc.wantGateway || st.E2E != 60*time.Millisecond {
				t.Errorf("gateway %v, E2E %v; want %v, 60ms", st.Gateway.Total, st.E2E, tc.wantGateway)
			}
			if sum := st.Gateway.Total + st.Gateway.Checks + st.E2E; st.Total != sum || !st.Start.Equal(st.Sent.Add(-sum+st.E2E)) {
				t.Errorf("total %v, parts %v (gateway %v + checks %v + E2E %v), start %v before sent",
					st.Total, sum, st.Gateway.Total, st.Gateway.Checks, st.E2E, st.Sent.Sub(st.Start))
			}
		})
	}
}

// A meter that skips the request headers reads everything the gate
// decided from its one field, and times the response from the gate's
// answer: TTFT and E2E from there, the gateway's time up to it.
func TestMeterReadsTheGateFieldAttribute(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	f := sampleField
	f.sent = at(3).UnixMicro()
	f.checksUS = 1000
	m := newMeter(s)
	m.observe(respHeadersWith("text/event-stream", sealed(&f), at(0)), at(50))
	m.observe(respBody(roleChunk, false), at(60))
	m.observe(respBody(contentChunk, false), at(103))
	m.observe(respBody(contentChunk+usageChunk, false), at(120))
	if !m.observe(respBody("data: [DONE]\n\n", true), at(130)) {
		t.Fatal("not ended")
	}
	s.finish(context.Background(), m, at(130), true)
	if len(sink.stamps) != 1 {
		t.Fatalf("%d stamps", len(sink.stamps))
	}
	st := sink.stamps[0]
	if st.RequestID != f.requestID || st.Model != f.model || st.Tenant != f.tenant || st.Principal != f.principal ||
		st.Decision != f.decision || st.Reason != f.reason || !st.Stream {
		t.Errorf("what the gate decided: %+v", st)
	}
	if st.Gateway.Gate != 310*time.Microsecond || st.Gateway.Policy != 80*time.Microsecond || st.Gateway.RateLimit != 150*time.Microsecond ||
		st.Gateway.Checks != time.Millisecond {
		t.Errorf("gate timings %+v", st.Gateway)
	}
	if st.TTFT != 100*time.Millisecond || st.E2E != 127*time.Millisecond || !st.Sent.Equal(at(3)) || !st.Start.Equal(at(0)) ||
		st.Gateway.Total != 2*time.Millisecond || st.Total != 130*time.Millisecond {
		t.Errorf("timings: TTFT %v E2E %v sent %v start %v gateway %v total %v; want 100ms 127ms +3ms +0 2ms (3ms less 1ms of checks) 130ms",
			st.TTFT, st.E2E, st.Sent.Sub(t0), st.Start.Sub(t0), st.Gateway.Total, st.Total)
	}
	if len(p.settled) != 1 || p.settled[0].Reservation != f.reservation || p.settled[0].Tenant != "acme" || p.settled[0].CompletionTokens != 3 {
		t.Errorf("settlements %+v", p.settled)
	}
}

// The gate's time is another process's clock when gate and meter streams
// land on different replicas: it is bounded by what the meter knows, never
// before Envoy had the request, never after the response reached the meter.
// Without it, Envoy's request.time; without that, the response's arrival.
func TestMeterDepartureBounds(t *testing.T) {
	t0 := time.Unix(1_796_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name       string
		sent       int64 // the gate's field; 0: none
		envoyStart time.Time
		want       time.Time
	}{
		{"the gate's answer", at(4).UnixMicro(), at(0), at(4)},
		{"a gate clock ahead", at(80).UnixMicro(), at(0), at(50)},
		{"a gate clock behind", at(-30).UnixMicro(), at(0), at(0)},
		{"a gate clock behind, no request.time", at(-30).UnixMicro(), time.Time{}, at(-30)},
		{"absurd", -5, at(0), at(0)},
		{"1970", 1, time.Time{}, at(50)},
		{"over an hour before the response", at(-3_600_001).UnixMicro(), time.Time{}, at(50)},
		{"no field", 0, at(1), at(1)},
		{"nothing", 0, time.Time{}, at(50)},
		{"an Envoy clock ahead", at(4).UnixMicro(), at(70), at(50)},
	} {
		s, sink := newTestServer(t, "")
		m := newMeter(s)
		f := sampleField
		f.sent = tc.sent
		m.observe(respHeadersWith("application/json", sealed(&f), tc.envoyStart), at(50))
		s.finish(context.Background(), m, at(90), true)
		if st := sink.stamps[0]; !st.Sent.Equal(tc.want) || st.E2E < 0 || st.TTFT < 0 || st.Gateway.Total < 0 {
			t.Errorf("%s: sent at %v, E2E %v, gateway %v; want sent at %v", tc.name, st.Sent.Sub(t0), st.E2E, st.Gateway.Total, tc.want.Sub(t0))
		}
	}
}

// Envoy Gateway cannot name the field as an attribute: its meter forwards
// the field's own namespace (one key), which Envoy copies into every
// message; the meter reads it once, from the response headers.
func TestMeterReadsTheGateFieldNamespace(t *testing.T) {
	s, sink := newTestServer(t, "")
	m := newMeter(s)
	t0 := time.Unix(1000, 0)
	f := sampleField
	f.sent = t0.UnixMicro()
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MeterNamespace: {Fields: map[string]*structpb.Value{
		request.MeterKey: structpb.NewStringValue(sealed(&f))}}}}
	resp := respHeadersWith("text/event-stream", "", t0)
	resp.MetadataContext = md
	m.observe(resp, t0.Add(10*time.Millisecond))
	body := respBody(contentChunk, true)
	body.MetadataContext = md
	m.observe(body, t0.Add(40*time.Millisecond))
	s.finish(context.Background(), m, t0.Add(40*time.Millisecond), true)
	if st := sink.stamps[0]; st.RequestID != f.requestID || st.Tenant != "acme" || st.TTFT != 40*time.Millisecond || st.Pool != "pool-a" {
		t.Errorf("stamp %+v", st)
	}
}

// An older Envoy config (request headers sent, the gate's namespace of one
// key per field forwarded) keeps working; where the field is there too, it
// is what counts.
func TestMeterOlderWire(t *testing.T) {
	old := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MetadataNamespace: {Fields: map[string]*structpb.Value{
		"tenant": structpb.NewStringValue("from-struct"), "reservation": structpb.NewStringValue("r-struct"),
		"gate_us": structpb.NewNumberValue(77), "model": structpb.NewStringValue("struct-model")}}}}
	t0 := time.Unix(1000, 0)
	for _, withField := range []bool{false, true} {
		s, sink := newTestServer(t, "")
		p := &capPolicy{}
		s.policy = p
		m := newMeter(s)
		hdrs := headersMsg(false, "x-request-id", "hdr-id", request.ModelHeader, "hdr-model")
		hdrs.MetadataContext = old
		hdrs.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
			"request.time": structpb.NewStringValue(t0.UTC().Format(time.RFC3339Nano))}}}
		m.observe(hdrs, t0.Add(2*time.Millisecond))
		field := ""
		if withField {
			f := sampleField
			f.sent = t0.Add(time.Millisecond).UnixMicro()
			field = sealed(&f)
		}
		m.observe(respHeadersWith("application/json", field, time.Time{}), t0.Add(20*time.Millisecond))
		m.observe(respBody(`{"choices":[{"message":{"content":"x"}}]}`, true), t0.Add(30*time.Millisecond))
		s.finish(context.Background(), m, t0.Add(30*time.Millisecond), true)
		st := sink.stamps[0]
		// The request headers' arrival stays the start either way.
		if st.E2E != 28*time.Millisecond || st.Gateway.Total != 2*time.Millisecond {
			t.Errorf("field %v: E2E %v, gateway %v; want 28ms, 2ms", withField, st.E2E, st.Gateway.Total)
		}
		// The older namespace is not sealed: read for the model, trusted
		// for neither the tenant nor the reservation.
		want, wantSettled, wantModel, wantID := "", 0, "struct-model", "hdr-id"
		if withField {
			want, wantSettled, wantModel, wantID = "acme", 1, sampleField.model, sampleField.requestID
		}
		if st.Tenant != want || len(p.settled) != wantSettled || wantSettled == 1 && p.settled[0].Reservation != sampleField.reservation ||
			st.Model != wantModel || st.RequestID != wantID {
			t.Errorf("field %v: tenant %q model %q id %q settlements %+v", withField, st.Tenant, st.Model, st.RequestID, p.settled)
		}
	}
}

// A meter stream that shows neither the request nor the gate's decision
// (a response the gate answered itself, stamped by the gate; or a stream
// from anything else) is not stamped, and settles nothing.
func TestMeterStampsOnlyWhatTheGateDecided(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	m := newMeter(s)
	t0 := time.Unix(1000, 0)
	for _, field := range []string{"", "CelMap value", "2|future"} {
		m.observe(respHeadersWith("application/json", field, t0), t0)
	}
	m.observe(respBody(`{}`, true), t0)
	s.finish(context.Background(), m, t0, true)
	if len(sink.stamps) != 0 || len(p.settled) != 0 {
		t.Errorf("stamps %+v, settlements %+v", sink.stamps, p.settled)
	}
}

// The gate writes the field in its own namespace, next to the namespace of
// one key per field (access logs, x-ratelimit-* headers, older meters), and
// both say the same; the meter, given the field, stamps what the gate
// decided.
func TestGateToMeterThroughTheField(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{metadata: map[string]any{"x-ratelimit-remaining-tokens": "99"}}
	s.policy = p
	g := &gateRequest{started: time.Now(), eager: true}
	ctx := context.Background()
	s.gateStep(ctx, g, headersMsg(false, append(slices.Clone(chatHeaders), "x-request-id", "id-\xff")...))
	out := s.gateStep(ctx, g, bodyMsg(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`, true))
	md := out[0].GetDynamicMetadata().GetFields()
	ns := md[request.MetadataNamespace].GetStructValue().GetFields()
	if ns["x-ratelimit-remaining-tokens"].GetStringValue() != "99" || ns["reservation"].GetStringValue() != "r-1" || ns["model"].GetStringValue() != "m1" {
		t.Errorf("the gate's namespace lost keys: %v", ns)
	}
	field := md[request.MeterNamespace].GetStructValue().GetFields()[request.MeterKey].GetStringValue()
	f, fs, ok := readGateField(s.sealer, field)
	if !ok || fs.id == "" || f.model != "m1" || !f.stream || f.reservation != "r-1" || f.decision != "allow" || f.requestID != "id-\uFFFD" ||
		f.promptTokens != int64(ns["prompt_tokens"].GetNumberValue()) || f.gateUS != int64(ns["gate_us"].GetNumberValue()) || f.sent == 0 {
		t.Fatalf("field %q read as %+v", field, f)
	}
	m := newMeter(s)
	m.observe(respHeadersWith("text/event-stream", field, time.Time{}), time.Now())
	m.observe(respBody(contentChunk+"data: [DONE]\n\n", true), time.Now())
	s.finish(ctx, m, time.Now(), true)
	if st := sink.stamps[len(sink.stamps)-1]; st.Model != "m1" || st.RequestID != "id-\uFFFD" || len(p.settled) != 1 || p.settled[0].Reservation != "r-1" {
		t.Errorf("stamp %+v, settlements %+v", st, p.settled)
	}
}

// The pool order arrives as one string (a JSON array), the one field of
// the cluster metadata the meter asks for.
func TestMeterPoolOrderAttribute(t *testing.T) {
	s, sink := newTestServer(t, "")
	m := newMeter(s)
	resp := respHeadersWith("application/json", sealed(&sampleField), time.Time{})
	a := resp.Attributes[attributesKey].Fields
	a["xds.cluster_name"] = structpb.NewStringValue("infergate-fallback/llama/pool-b")
	a[request.PoolOrderAttribute] = structpb.NewStringValue(`["pool-b","pool-a"]`)
	a["upstream.request_attempt_count"] = structpb.NewNumberValue(3)
	m.observe(resp, time.Now())
	s.finish(context.Background(), m, time.Now(), true)
	if st := sink.stamps[0]; !slices.Equal(st.PoolsTried, []string{"pool-b", "pool-a", "pool-b"}) || st.Pool != "pool-b" {
		t.Errorf("pools %v, pool %q", st.PoolsTried, st.Pool)
	}
}
