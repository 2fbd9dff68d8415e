package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// The metadata and the meter's field say what the plan says, the field's
// strings cut to the stamp's bounds; what protobuf cannot carry is an
// error (the request then fails closed).
func TestPlanEncodings(t *testing.T) {
	p := gate.Plan{Stamp: request.Stamp{RequestID: "req-1", Model: "m", API: openai.APIChat, Stream: true, PromptTokens: 9,
		Decision: "allow", Reason: strings.Repeat("r", request.MaxStampReason+10), Principal: "key-1", Tenant: "acme",
		Gateway: request.GatewayTime{Gate: 5 * time.Microsecond, Timings: request.Timings{Auth: time.Microsecond,
			Policy: 2 * time.Microsecond, RateLimit: 3 * time.Microsecond, Checks: 4 * time.Microsecond}}},
		MaxTokens: 20, Reservation: "r-1", UsageAdded: true,
		Metadata: map[string]any{"note": "x", "model": "policy's", request.UsageAddedKey: false}}
	md, err := gateMetadata(&p, "00-tp")
	if err != nil {
		t.Fatal(err)
	}
	f := md.GetFields()
	for k, want := range map[string]any{"model": "policy's", "api": "chat", "stream": true, "max_tokens": 20.0, "prompt_tokens": 9.0,
		"decision": "allow", "reason": p.Stamp.Reason, "principal": "key-1", "tenant": "acme", "gate_us": 5.0, "auth_us": 1.0,
		"policy_us": 2.0, "ratelimit_us": 3.0, "checks_us": 4.0, "reservation": "r-1", request.TraceparentKey: "00-tp", "note": "x",
		request.UsageAddedKey: true} { // the gate's, not the policy's
		if got := f[k].AsInterface(); got != want {
			t.Errorf("metadata %s = %v, want %v", k, got, want)
		}
	}
	if len(f) != 18 {
		t.Errorf("metadata has %d fields, want 18", len(f))
	}
	q := p
	q.Reservation, q.Metadata = "", nil
	if md, _ := gateMetadata(&q, ""); md.GetFields()["reservation"] != nil || md.GetFields()[request.TraceparentKey] != nil {
		t.Errorf("metadata %v: no reservation nor traceparent wanted", md)
	}

	got := meterField(&p, 1234, "00-tp")
	want := gateField{sent: 1234, stream: true, promptTokens: 9, gateUS: 5, authUS: 1, policyUS: 2, rateLimitUS: 3, checksUS: 4,
		decision: "allow", requestID: "req-1", model: "m", tenant: "acme", principal: "key-1",
		reason: request.Truncate(p.Stamp.Reason, request.MaxStampReason), traceparent: "00-tp", reservation: "r-1", api: "chat"}
	if got != want {
		t.Errorf("field %+v\nwant  %+v", got, want)
	}
	q = p
	q.Stamp.RequestID = "id-\xff"
	if f := meterField(&q, 0, ""); f.requestID != "id-\uFFFD" {
		t.Errorf("field request id %q, want valid UTF-8", f.requestID)
	}

	for name, bad := range map[string]func(*gate.Plan){
		"a string that is not UTF-8": func(p *gate.Plan) { p.Stamp.Tenant = "\xff" },
		"a key that is not UTF-8":    func(p *gate.Plan) { p.Metadata = map[string]any{"\xff": "x"} },
		"a value protobuf can't":     func(p *gate.Plan) { p.Metadata = map[string]any{"f": func() {}} },
	} {
		q := p
		bad(&q)
		if _, err := gateMetadata(&q, ""); err == nil {
			t.Errorf("%s: encoded, want an error", name)
		}
	}
}

// The adapter's last check: a field longer than the meter reads (only a
// reservation can make one) fails closed, its reservation given back.
func TestGateFailsClosedOnAnOverlongField(t *testing.T) {
	s, sink := newTestServer(t, "")
	p := &capPolicy{}
	s.policy = p
	g := &gateRequest{started: time.Now(), headers: headers{":path": "/v1/chat/completions", "x-request-id": "req-1"}}
	adm := &request.Admission{RequestID: "req-1", Request: openai.Request{Model: "m"}}
	v := request.Verdict{Reservation: strings.Repeat("r", maxMeterField)}
	plan := gate.PlanOf(s.gateRules(), adm, nil, v)
	out := s.answer(context.Background(), g, adm, v, &plan)
	if len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 500 {
		t.Fatalf("answers %v, want one 500", out)
	}
	if len(p.released) != 1 || len(sink.stamps) != 1 || sink.stamps[0].Reason != "gate_error" || sink.stamps[0].Model != "m" {
		t.Errorf("releases %d, stamps %+v; want the reservation released and a gate_error stamp", len(p.released), sink.stamps)
	}
}
