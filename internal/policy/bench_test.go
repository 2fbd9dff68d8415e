package policy

import (
	"context"
	"slices"
	"testing"
	"time"
)

// benchInput is a realistic request: a streaming chat completion from a
// standard-tier API key, with the headers the gate passes by default.
func benchInput() *Input {
	in := chat("globex", "llama-3.1-70b-instruct")
	in.Labels = map[string]string{"team": "search", "env": "prod"}
	in.Request.MaxTokens = 1024
	in.Request.EstimatedPromptTokens = 350
	return in
}

func BenchmarkDecide(b *testing.B) {
	e := loadDefault(b)
	in := benchInput()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := e.Decide(ctx, in)
		if err != nil || !d.Allow {
			b.Fatal(d, err)
		}
	}
}

func BenchmarkDecideDenied(b *testing.B) {
	e := loadDefault(b)
	in := benchInput()
	in.Tenant = "initech"
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if d, err := e.Decide(ctx, in); err != nil || d.Allow {
			b.Fatal(d, err)
		}
	}
}

func BenchmarkInputValue(b *testing.B) {
	in := benchInput()
	b.ReportAllocs()
	for b.Loop() {
		_ = in.Value()
	}
}

// TestDecideLatency measures the latency of single decisions with the
// default policies, one after another; run with -v to see the numbers. It
// only fails when p50 is pathological: timings on a shared CI machine are
// too noisy for a tight bound.
func TestDecideLatency(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("latency measurement")
	}
	e := loadDefault(t)
	in := benchInput()
	ctx := context.Background()
	const n = 20000
	for range 1000 { // warm up
		if _, err := e.Decide(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	lat := make([]time.Duration, n)
	for i := range lat {
		start := time.Now()
		d, err := e.Decide(ctx, in)
		lat[i] = time.Since(start)
		if err != nil || !d.Allow {
			t.Fatal(d, err)
		}
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(n-1))] }
	t.Logf("Decide over %d evaluations: p50 %v, p90 %v, p99 %v, p99.9 %v, max %v",
		n, p(0.50), p(0.90), p(0.99), p(0.999), lat[n-1])
	if p(0.50) > 2*time.Millisecond {
		t.Errorf("p50 %v, want well under 2ms", p(0.50))
	}
}

func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		if _, err := Load(context.Background(), policiesDir); err != nil {
			b.Fatal(err)
		}
	}
}
