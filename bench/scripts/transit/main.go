// Command transit splits the error `infergate-bench bench` measures against the
// mock into the mock's part and the generator's part, event by event.
//
// It runs the load generator (bench/loadgen, what `infergate-bench bench` runs)
// against a mock started with --emit-timestamps, keeps every measured
// stream as read (loadgen.Config.Capture), and compares each event's
// arrival with the mock's emit stamp (the mock's clock just before it wrote
// the event; same machine, same clock):
//
//   - mock: what the mock did, from its stamps: TTFT = first content event
//     − role chunk (written as soon as the request is parsed), ITL = the
//     gaps between the stamps of consecutive content events;
//   - generator: what the client added: TTFT = client TTFT − the mock's
//     (the request's way in, the mock's parsing, the first event's way
//     back), ITL = client gap − stamp gap (the change in transit between
//     two events), and each event's transit (arrival − stamp).
//
// Used by bench/scripts/measure.py accuracy; prints one JSON object.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/infergate/infergate/bench/loadgen"
	"github.com/infergate/infergate/bench/result"
)

func main() {
	target := flag.String("target", "", "mock base URL (started with --emit-timestamps)")
	concurrency := flag.Int("concurrency", 256, "users")
	requests := flag.Int("requests", 1024, "measured requests")
	warmup := flag.Int("warmup", 256, "warm-up requests")
	rampUp := flag.Duration("ramp-up", 0, "start the users evenly over this time")
	tokens := flag.Int("tokens", 32, "prompt words and output tokens")
	ttft := flag.Duration("ttft", 100*time.Millisecond, "the mock's configured TTFT")
	itl := flag.Duration("itl", 20*time.Millisecond, "the mock's configured ITL")
	flag.Parse()

	var mu sync.Mutex
	var streams []stream
	cfg := loadgen.Config{
		Targets:     []loadgen.Target{{Name: "mock", URL: *target}},
		Concurrency: *concurrency,
		RampUp:      *rampUp,
		Warmup:      loadgen.Bound{Requests: *warmup},
		Measure:     loadgen.Bound{Requests: *requests},
		Seed:        1,
		Timeout:     time.Minute,
		Workload: &loadgen.Workload{
			Models: []result.Weight{{Value: "demo", Weight: 1}},
			Input:  result.Range{Min: *tokens, Max: *tokens, Dist: "uniform"},
			Output: result.Range{Min: *tokens, Max: *tokens, Dist: "uniform"},
			Stream: true,
		},
		// Copy only; the analysis runs after the load.
		Capture: func(s *loadgen.Sample, raw *loadgen.Raw) {
			if s.Phase != loadgen.Measure || !s.OK() {
				return
			}
			st := stream{ttft: s.TTFT, body: bytes.Clone(raw.Body), lines: slices.Clone(raw.Lines)}
			mu.Lock()
			streams = append(streams, st)
			mu.Unlock()
		},
	}
	if _, err := loadgen.Run(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "transit:", err)
		os.Exit(1)
	}
	var a analysis
	for _, st := range streams {
		if err := a.add(st, *ttft, *itl); err != nil {
			fmt.Fprintln(os.Stderr, "transit:", err)
			os.Exit(1)
		}
	}
	out := map[string]any{
		"streams": len(streams),
		"events":  len(a.transit),
		"client":  map[string]dist{"ttft_err_ms": summarize(a.clientTTFT), "itl_err_ms": summarize(a.clientGap)},
		"mock":    map[string]dist{"ttft_err_ms": summarize(a.mockTTFT), "itl_err_ms": summarize(a.mockGap)},
		"generator": map[string]dist{"ttft_ms": summarize(a.genTTFT), "itl_err_ms": summarize(a.genGap),
			"transit_ms": summarize(a.transit)},
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	_ = enc.Encode(out)
}

type stream struct {
	ttft  time.Duration
	body  []byte
	lines []loadgen.RawLine
}

type analysis struct {
	clientTTFT, mockTTFT, genTTFT []time.Duration
	clientGap, mockGap, genGap    []time.Duration
	transit                       []time.Duration
}

// event is one SSE event of a stream: its emit stamp and its arrival (when
// the blank line that ends it was read, as loadgen times events).
type event struct {
	stamp   int64 // Unix ns
	at      time.Time
	content bool
}

func (a *analysis) add(st stream, ttft, itl time.Duration) error {
	var evs []event
	var cur event
	start := 0
	for _, l := range st.lines {
		line := bytes.TrimRight(st.body[start:l.End], "\r\n")
		start = l.End
		switch {
		case bytes.HasPrefix(line, []byte(": t=")):
			f := bytes.Fields(line[len(": t="):])
			n, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil {
				return fmt.Errorf("bad stamp %q", line)
			}
			cur.stamp = n
		case bytes.HasPrefix(line, []byte("data: ")):
			cur.content = isContent(line[len("data: "):])
		case len(line) == 0:
			cur.at = l.At
			evs = append(evs, cur)
			cur = event{}
		}
	}
	var content []event
	for _, e := range evs {
		if e.stamp == 0 {
			return fmt.Errorf("an event without an emit stamp: start the mock with --emit-timestamps")
		}
		if e.content {
			content = append(content, e)
		}
	}
	if len(evs) == 0 || len(content) == 0 {
		return fmt.Errorf("a stream without content")
	}
	mockTTFT := time.Duration(content[0].stamp - evs[0].stamp) // first content − role chunk
	a.clientTTFT = append(a.clientTTFT, st.ttft-ttft)
	a.mockTTFT = append(a.mockTTFT, mockTTFT-ttft)
	a.genTTFT = append(a.genTTFT, st.ttft-mockTTFT)
	for k, e := range content {
		a.transit = append(a.transit, time.Duration(e.at.UnixNano()-e.stamp))
		if k == 0 {
			continue
		}
		client, emitted := e.at.Sub(content[k-1].at), time.Duration(e.stamp-content[k-1].stamp)
		a.clientGap = append(a.clientGap, client-itl)
		a.mockGap = append(a.mockGap, emitted-itl)
		a.genGap = append(a.genGap, client-emitted)
	}
	return nil
}

// isContent: choices[0].delta carries non-empty content (the mock's chunks).
func isContent(data []byte) bool {
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	return json.Unmarshal(data, &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != ""
}

type dist struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Min  float64 `json:"min"`
}

// summarize: exact nearest-rank percentiles, in ms.
func summarize(xs []time.Duration) dist {
	if len(xs) == 0 {
		return dist{}
	}
	slices.Sort(xs)
	at := func(p float64) float64 {
		i := int(p/100*float64(len(xs))+0.999999) - 1
		return float64(xs[max(min(i, len(xs)-1), 0)]) / 1e6
	}
	return dist{N: len(xs), P50: at(50), P99: at(99), P999: at(99.9), Max: at(100), Min: float64(xs[0]) / 1e6}
}
