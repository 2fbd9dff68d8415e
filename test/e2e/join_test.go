package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/infergate/infergate/bench/command"
	"github.com/infergate/infergate/bench/result"
)

// `infergate-bench bench --join` pairs every request it sent through the gateway
// with the gateway's record of it, and the breakdown adds up to what the
// client saw and holds the mock's cadence. The client's traceparent is the trace
// Envoy and infergate continue.
func TestBenchJoinsGatewayRecords(t *testing.T) {
	s := startStack(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	var stdout, stderr bytes.Buffer
	err := command.Bench(context.Background(), []string{
		"--target", "gateway=" + s.Envoy.URL, "--model", "pool-a", "--concurrency", "4", "--requests", "40",
		"--output-tokens", "8", "--header", "x-mock-ttft-ms:80", "--header", "x-mock-itl-ms:10",
		"--join", s.Gateway.AdminURL, "--json", out}, &stdout, &stderr, "e2e")
	if err != nil {
		t.Fatalf("bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep result.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	j := rep.Join
	if j == nil || j.Requests != 40 || j.Joined != 40 || len(j.Samples) != 40 {
		t.Fatalf("join %+v", j)
	}
	// Each request's parts add up to what the client saw, and the mock's
	// cadence is inside them: from Envoy's receipt of the request (before
	// the mock got it) to the meter's read of the end (after the mock wrote
	// it), the mock took at least its TTFT and 7 gaps: 80 + 7 × 10 ms. No
	// upper bound: a busy machine may lengthen any part.
	for _, r := range j.Samples {
		if sum := r.GatewayMs + r.ModerationMs + r.UpstreamFirstTokenMs + r.DecodeMs + r.OutsideMs; sum-r.ClientMs > 0.01 || r.ClientMs-sum > 0.01 {
			t.Fatalf("request %s: parts add to %.3f, client saw %.3f", r.RequestID, sum, r.ClientMs)
		}
		if in := r.GatewayMs + r.ModerationMs + r.UpstreamFirstTokenMs + r.DecodeMs; in < 150 || r.DecodeMs <= 0 || r.UpstreamFirstTokenMs <= 0 {
			t.Errorf("request %s: gateway %.3f + moderation %.3f + first token %.3f + decode %.3f = %.3f ms, the mock's cadence takes 150",
				r.RequestID, r.GatewayMs, r.ModerationMs, r.UpstreamFirstTokenMs, r.DecodeMs, in)
		}
	}
	// Envoy continued the client's trace: the gateway's record has its id.
	st := s.Gateway.stamp(t, j.Samples[0].RequestID)
	if st.TraceID != j.Samples[0].TraceID {
		t.Errorf("gateway trace %q, client's traceparent %q", st.TraceID, j.Samples[0].TraceID)
	}
}
