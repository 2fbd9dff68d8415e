package e2e

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/stats"
	"github.com/infergate/infergate/internal/testutil"
)

// A policy that admits everything, asks for moderation when the request
// says so, and can be made slow on purpose: a gateway-side delay. The
// delay is a call to a slow endpoint, not CPU work, so it lasts as
// long on a loaded machine under the race detector as anywhere else.
const tracingPolicy = `package infergate.authz

default allow := false

slow if input.request.headers["x-test-slow-policy"] == "1"

allow if not slow

allow if {
	slow
	http.send({"method": "GET", "url": "%s"}).status_code == 200
}

checks contains "moderation" if input.request.headers["x-test-moderate"] == "1"
`

// One request is one trace: Envoy's request span, Envoy's ext_proc call
// spans, and under them infergate's gate (with its stages) and the
// upstream's GenAI span (first token, stream) with the GenAI attributes.
// The breakdown adds up, and a delay lands where it happened: slow
// moderation in moderation, a slow pool in the model, a slow policy in
// the gateway.
func TestTracingBreakdown(t *testing.T) {
	recv := startOTLP(t)
	moderation := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(150 * time.Millisecond)
	}))
	defer moderation.Close()
	slowPolicy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(60 * time.Millisecond)
	}))
	defer slowPolicy.Close()
	dir := t.TempDir()
	policy := fmt.Sprintf(tracingPolicy, slowPolicy.URL)
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`
auth: {policyHeaders: [x-test-slow-policy, x-test-moderate]}
policy: {dir: %s}
checks: {moderation: {url: %s, timeout: 2s}}
tracing: {endpoint: %q, insecure: true}
`, dir, moderation.URL, recv.Addr)
	// The policy reads two headers of its own: the gate must be sent them.
	s := startStackFor(t, "", func(*stack) string { return cfg }, 1)
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr,
		forwardToGate("x-test-slow-policy", "x-test-moderate"))

	send := func(hdr map[string]string) Stamp {
		t.Helper()
		r := mustLockstep(t, s.PoolA, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 6, true, ""), hdr)
		if r.Status != 200 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
			chatBody("pool-a", 6, true, `,"stream_options":{"include_usage":true}`), hdr))
		if string(r.Body) != string(want.Body) {
			t.Fatalf("body through the gateway differs from the mock's\n got: %q\nwant: %q", r.Body, want.Body)
		}
		st := s.Gateway.stamp(t, r.RequestID)
		if st.TraceID == "" {
			t.Fatalf("stamp has no trace id: %+v", st)
		}
		return st
	}
	baseSt := send(map[string]string{"x-mock-ttft-ms": "60", "x-mock-itl-ms": "10"})
	mod := send(map[string]string{"x-test-moderate": "1", "x-mock-ttft-ms": "60", "x-mock-itl-ms": "10"})
	pool := send(map[string]string{"x-mock-ttft-ms": "300", "x-mock-itl-ms": "10"})
	slowSt := send(map[string]string{"x-test-slow-policy": "1", "x-mock-ttft-ms": "60", "x-mock-itl-ms": "10"})
	// Envoy exports in batches (every 5 s): wait once for all four traces.
	type result struct {
		st    Stamp
		spans []span
	}
	var base, slow result
	testutil.Eventually(t, 20*time.Second, func() bool {
		for _, st := range []Stamp{baseSt, mod, pool, slowSt} {
			spans := recv.trace(st.TraceID)
			if !hasSpan(spans, "envoy", "ingress") || !hasSpan(spans, "infergate", "chat pool-a") || !hasSpan(spans, "infergate", "infergate.gate") {
				return false
			}
		}
		return true
	}, "Envoy's and infergate's spans of the four traces")
	base = result{baseSt, recv.trace(baseSt.TraceID)}
	slow = result{slowSt, recv.trace(slowSt.TraceID)}

	// 1. Parentage, attributes, and the sum.
	ingress := findSpan(t, base.spans, "envoy", "ingress")
	gate := findSpan(t, base.spans, "infergate", "infergate.gate")
	chat := findSpan(t, base.spans, "infergate", "chat pool-a")
	for _, child := range []span{gate, chat} {
		parent := byID(base.spans, child.ParentID)
		if parent == nil || parent.Service != "envoy" || parent.ParentID != ingress.SpanID {
			t.Errorf("%s's parent is %+v; want one of Envoy's ext_proc call spans under its request span %s", child.Name, parent, ingress.SpanID)
		}
	}
	for _, name := range []string{"infergate.auth", "infergate.policy"} {
		if sp := findSpan(t, base.spans, "infergate", name); sp.ParentID != gate.SpanID {
			t.Errorf("%s not under the gate span", name)
		}
	}
	first := findSpan(t, base.spans, "infergate", "infergate.upstream.first_token")
	streamed := findSpan(t, base.spans, "infergate", "infergate.upstream.stream")
	if first.ParentID != chat.SpanID || streamed.ParentID != chat.SpanID {
		t.Error("first-token and stream spans not under the GenAI span")
	}
	for k, want := range map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "pool-a",
		"gen_ai.usage.output_tokens": int64(6), "infergate.pool": "pool-a", "infergate.attempts": int64(1)} {
		if chat.Attrs[k] != want {
			t.Errorf("GenAI span %s = %v, want %v", k, chat.Attrs[k], want)
		}
	}
	if in, _ := chat.Attrs["gen_ai.usage.input_tokens"].(int64); in <= 0 {
		t.Errorf("gen_ai.usage.input_tokens %v", chat.Attrs["gen_ai.usage.input_tokens"])
	}
	// The spans are the stamp's times, not a second measurement: the first
	// token's wait is the stamp's TTFT (published floored to the µs).
	if d := first.Duration() - msDur(base.st.TTFTms); d < 0 || d >= time.Microsecond {
		t.Errorf("first-token span %v, the stamp's TTFT %.3f ms", first.Duration(), base.st.TTFTms)
	}
	// Envoy had the request before infergate's gate saw it.
	if gate.Start.Before(ingress.Start) {
		t.Errorf("the gate span starts at %s, before Envoy's request span (%s)", gate.Start, ingress.Start)
	}
	// gateway + moderation + model = total (the stamp), for every request:
	// a delay counted twice, or in no part, breaks the sum.
	for _, st := range []Stamp{base.st, mod, pool, slow.st} {
		if sum := st.Gatewayms + st.Checksms + st.E2Ems; math.Abs(sum-st.Totalms) > 0.01 {
			t.Errorf("gateway %.3f + moderation %.3f + model %.3f = %.3f != total %.3f", st.Gatewayms, st.Checksms, st.E2Ems, sum, st.Totalms)
		}
	}
	st := base.st
	t.Logf("breakdown: total %.1f = gateway %.2f + moderation %.2f + model %.1f ms; Envoy's span %.1f ms",
		st.Totalms, st.Gatewayms, st.Checksms, st.E2Ems, stats.Ms(ingress.Duration()))

	// Each delay lands in its part, by causality: a part that contains a
	// delay is at least that long, and the sum above holds it nowhere else.
	// No upper bound on the others: a busy machine may slow them at will.
	// 2. Slow moderation (the classifier answers after 150 ms): moderation.
	if mod.Checksms < 150 {
		t.Errorf("slow moderation: moderation %.1f ms, the classifier took 150", mod.Checksms)
	}
	// 3. Slow pool (first token 300 ms after the mock got the request): the
	// model's. The meter dates the request's departure at most maxHandoff
	// (10 ms) after the gate answered, and the gate answered before the
	// mock got the request, so TTFT ≥ 300 − 10 ms, whatever the machine.
	if pool.TTFTms < 290 || pool.E2Ems < pool.TTFTms || base.st.Checksms != 0 || pool.Checksms != 0 || slow.st.Checksms != 0 {
		t.Errorf("slow pool: model %.1f (TTFT %.1f), moderation %.3f; without moderation %.3f and %.3f ms",
			pool.E2Ems, pool.TTFTms, pool.Checksms, base.st.Checksms, slow.st.Checksms)
	}
	// 4. Slow policy (its http.send answers after 60 ms): the gateway's.
	if slow.st.Policyms < 60 || slow.st.Gatewayms < slow.st.Policyms {
		t.Errorf("slow policy: policy %.1f, gateway %.1f ms", slow.st.Policyms, slow.st.Gatewayms)
	}
	if p := findSpan(t, slow.spans, "infergate", "infergate.policy"); p.Duration() < 60*time.Millisecond {
		t.Errorf("policy span %v", p.Duration())
	}
	t.Logf("slow moderation: moderation %.1f ms; slow pool: model %.1f ms; slow policy: gateway %.1f ms (policy %.1f)",
		mod.Checksms, pool.E2Ems, slow.st.Gatewayms, slow.st.Policyms)
}

func hasSpan(spans []span, service, name string) bool {
	for _, s := range spans {
		if s.Service == service && s.Name == name {
			return true
		}
	}
	return false
}

func findSpan(t *testing.T, spans []span, service, name string) span {
	t.Helper()
	for _, s := range spans {
		if s.Service == service && s.Name == name {
			return s
		}
	}
	var names []string
	for _, s := range spans {
		names = append(names, s.Service+":"+s.Name)
	}
	t.Fatalf("no %s span %q among %s", service, name, strings.Join(names, ", "))
	return span{}
}

func byID(spans []span, id string) *span {
	for i := range spans {
		if spans[i].SpanID == id {
			return &spans[i]
		}
	}
	return nil
}
