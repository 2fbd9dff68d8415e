package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/cli"
)

// `infergate bench --join` pairs every request it sent through the gateway
// with the gateway's record of it, and the breakdown matches the mock's
// cadence: upstream first token ≈ its TTFT, decode ≈ its ITL × tokens, a
// small gateway and outside share. The client's traceparent is the trace
// Envoy and infergate continue.
func TestBenchJoinsGatewayRecords(t *testing.T) {
	s := startStack(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	var stdout, stderr bytes.Buffer
	err := cli.Run(context.Background(), []string{"bench",
		"--target", "gateway=" + s.Envoy.URL, "--model", "pool-a", "--concurrency", "4", "--requests", "40",
		"--output-tokens", "8", "--header", "x-mock-ttft-ms:80", "--header", "x-mock-itl-ms:10",
		"--join", s.Gateway.AdminURL, "--json", out}, &stdout, &stderr)
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
	within := func(name string, got, lo, hi float64) {
		if got < lo || got > hi {
			t.Errorf("%s p50 %.2f ms, want in [%v, %v]", name, got, lo, hi)
		}
	}
	// From the meter's request-headers message, which Envoy sends beside
	// the upstream request, not before it: a loaded machine may deliver it
	// after the mock started its 80 ms (see checkCadence).
	within("upstream first token", j.UpstreamFirstTokenMs.P50, 75, 95)
	within("decode", j.DecodeMs.P50, 65, 85) // 7 gaps of 10 ms, then finish and usage
	within("gateway", j.GatewayMs.P50, 0, 10)
	within("outside", j.OutsideMs.P50, 0, 10)
	for _, r := range j.Samples {
		if sum := r.GatewayMs + r.ModerationMs + r.UpstreamFirstTokenMs + r.DecodeMs + r.OutsideMs; sum-r.ClientMs > 0.01 || r.ClientMs-sum > 0.01 {
			t.Fatalf("request %s: parts add to %.3f, client saw %.3f", r.RequestID, sum, r.ClientMs)
		}
	}
	// Envoy continued the client's trace: the gateway's record has its id.
	st := s.Gateway.stamp(t, j.Samples[0].RequestID)
	if st.TraceID != j.Samples[0].TraceID {
		t.Errorf("gateway trace %q, client's traceparent %q", st.TraceID, j.Samples[0].TraceID)
	}
}
