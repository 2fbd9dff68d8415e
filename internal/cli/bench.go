package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/bench/loadgen"
)

const benchSummary = `Stream chat completions to one or more OpenAI-compatible targets and compare
time to first token (TTFT), inter-token latency (ITL) and end-to-end latency
(E2E) side by side.

Each target gets exactly --requests POSTs to URL/v1/chat/completions with
"stream": true. The load is a closed loop: --concurrency workers each keep one
request in flight and alternate targets request by request, so every target
sees the same machine conditions. Percentiles cover successful requests only;
failures are counted in the errors row. The command fails if every request to
some target failed.

Progress goes to stderr once a second; the table goes to stdout.

Example (straight to a mock upstream vs through Envoy and infergate):
  infergate bench --target direct=http://127.0.0.1:8001 \
    --target gateway=http://127.0.0.1:10000 --concurrency 4 --requests 40`

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", benchSummary, stderr)
	var targets []loadgen.Target
	fs.Func("target", "a target to load, as `NAME=URL` (URL is the base, without /v1/...); repeatable; a plain URL is named \"target\"", func(v string) error {
		t, err := parseBenchTarget(v)
		if err != nil {
			return err
		}
		for _, have := range targets {
			if have.Name == t.Name {
				return fmt.Errorf("duplicate target name %q", t.Name)
			}
		}
		targets = append(targets, t)
		return nil
	})
	headers := map[string]string{}
	fs.Func("header", "header to send on every request, as `K:V` (e.g. x-tenant:demo); repeatable", func(v string) error {
		k, val, ok := strings.Cut(v, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("want K:V, got %q", v)
		}
		headers[k] = strings.TrimSpace(val)
		return nil
	})
	model := fs.String("model", "demo", "model name sent in each request")
	concurrency := fs.Int("concurrency", 4, "workers, each with one request in flight (shared by all targets)")
	requests := fs.Int("requests", 32, "requests per target")
	maxTokens := fs.Int("max-tokens", 32, "max_tokens sent in each request")
	prompt := fs.String("prompt", "Write one sentence about the sea.", "the single user message")
	timeout := fs.Duration("timeout", 60*time.Second, "per-request timeout, whole stream included (0: none)")
	jsonPath := fs.String("json", "", "also write the summaries and every sample to this JSON `file`")
	if err := parse(fs, args); err != nil {
		return err
	}
	var bad string
	switch {
	case len(targets) == 0:
		bad = "at least one --target is required"
	case *concurrency < 1:
		bad = "--concurrency must be at least 1"
	case *requests < 1:
		bad = "--requests must be at least 1"
	case *maxTokens < 1:
		bad = "--max-tokens must be at least 1"
	case *timeout < 0:
		bad = "--timeout must not be negative"
	case *model == "":
		bad = "--model must not be empty"
	}
	if bad != "" {
		fmt.Fprintf(stderr, "bench: %s\n", bad)
		return ErrUsage
	}

	total := *requests * len(targets)
	var done, failed atomic.Int64
	opts := loadgen.Options{
		Targets:     targets,
		Model:       *model,
		Concurrency: *concurrency,
		Requests:    *requests,
		MaxTokens:   *maxTokens,
		Prompt:      *prompt,
		Headers:     headers,
		Timeout:     *timeout,
		OnSample: func(s loadgen.Sample) {
			if s.Err != "" {
				failed.Add(1)
			}
			done.Add(1)
		},
	}

	start := time.Now()
	stopProgress := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				fmt.Fprintf(stderr, "bench: %d/%d requests done, %d failed (%s)\n",
					done.Load(), total, failed.Load(), time.Since(start).Round(time.Second))
			}
		}
	})
	samples, runErr := loadgen.Run(ctx, opts)
	wall := time.Since(start)
	close(stopProgress)
	wg.Wait()
	if samples == nil {
		return runErr
	}
	fmt.Fprintf(stderr, "bench: %d/%d requests done, %d failed, in %s\n",
		done.Load(), total, failed.Load(), wall.Round(time.Millisecond))

	sums := make([]loadgen.Summary, 0, len(targets))
	for _, t := range targets {
		sums = append(sums, loadgen.Summarize(t.Name, samples[t.Name], wall))
	}
	loadgen.WriteTable(stdout, sums)

	if *jsonPath != "" {
		if err := writeBenchJSON(*jsonPath, opts, wall, sums, samples); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	for _, s := range sums {
		if s.Requests > 0 && s.Errors == s.Requests {
			return fmt.Errorf("bench: every request to %q failed, first with: %s", s.Target, samples[s.Target][0].Err)
		}
	}
	return nil
}

// parseBenchTarget accepts NAME=URL or a plain URL (named "target").
func parseBenchTarget(v string) (loadgen.Target, error) {
	t := loadgen.Target{Name: "target", URL: v}
	if name, rest, ok := strings.Cut(v, "="); ok && !strings.Contains(name, "/") {
		t.Name, t.URL = name, rest
	}
	u, err := url.Parse(t.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return t, fmt.Errorf("want NAME=URL with an http(s) base URL, got %q", v)
	}
	if t.Name == "" {
		return t, fmt.Errorf("empty target name in %q", v)
	}
	t.URL = strings.TrimSuffix(t.URL, "/")
	return t, nil
}

func writeBenchJSON(path string, opts loadgen.Options, wall time.Duration, sums []loadgen.Summary, samples map[string][]loadgen.Sample) error {
	report := struct {
		Targets     []loadgen.Target            `json:"targets"`
		Model       string                      `json:"model"`
		Concurrency int                         `json:"concurrency"`
		Requests    int                         `json:"requests_per_target"`
		MaxTokens   int                         `json:"max_tokens"`
		Wall        time.Duration               `json:"wall_ns"`
		Summaries   []loadgen.Summary           `json:"summaries"`
		Samples     map[string][]loadgen.Sample `json:"samples"`
	}{opts.Targets, opts.Model, opts.Concurrency, opts.Requests, opts.MaxTokens, wall, sums, samples}
	b, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: writing --json: %w", err)
	}
	return nil
}
