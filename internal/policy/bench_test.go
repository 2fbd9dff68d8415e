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

// BenchmarkDecideLatency reports the distribution of single decisions with
// the default policies, one after another, as p50/p99/p99.9 metrics
// (ns/op alone hides the tail):
//
//	go test ./internal/policy -run '^$' -bench DecideLatency
func BenchmarkDecideLatency(b *testing.B) {
	e := loadDefault(b)
	in := benchInput()
	ctx := context.Background()
	for range 1000 { // warm up
		if _, err := e.Decide(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, 20000)
	for b.Loop() {
		start := time.Now()
		d, err := e.Decide(ctx, in)
		lat = append(lat, time.Since(start))
		if err != nil || !d.Allow {
			b.Fatal(d, err)
		}
	}
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) }
	b.ReportMetric(p(0.50), "p50-ns")
	b.ReportMetric(p(0.99), "p99-ns")
	b.ReportMetric(p(0.999), "p99.9-ns")
}

func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		if _, err := Load(context.Background(), policiesDir); err != nil {
			b.Fatal(err)
		}
	}
}
