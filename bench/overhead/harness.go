package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// options configure a run; defaults() is the full run of make bench-overhead.
type options struct {
	Root        string // the repository
	Infergate   string // infergate binary; empty: built from Root
	Mock        string // binary whose `mock --profile board` serves; empty: infergate-bench built from Root
	Envoy       string // Envoy binary; empty: scripts/install-envoy.sh (which honours ENVOY_BIN)
	GatewayCPUs string // taskset CPU list for Envoy and infergate; empty: unpinned
	// InfergateCPUs moves infergate off the gateway CPUs (default: with Envoy).
	InfergateCPUs string
	// Previous is an earlier infergate binary, measured against this one
	// by the variant "previous".
	Previous string
	// InfergateEnv is added to infergate's environment (GOMAXPROCS=2, GOGC=200, ...).
	InfergateEnv []string
	ClientCPUs   string // for the mock, the harness (load generator) and Redis
	Only         []string
	ProfileDir   string // CPU profiles of infergate per phase, when set
	Work         string // keep processes' configs and logs here (default: a temporary directory, removed)
	// AccessLog gives every Envoy an access log in Work with its own
	// timings per request (request received, upstream request sent,
	// response started).
	AccessLog bool
	// Peers are other gateways measured in the main phases as lanes of
	// their own (peers.go): litellm, portkey.
	Peers []string

	Phases   []phaseSpec
	Variants []phaseSpec // the phases each variant is measured with
	Log      io.Writer
}

// Durations per path, as the board runs them: 5 s of warm-up, 20 s at c=1,
// 30 s for streams at c=1 (about 22 streams: their p99 is nearly their
// maximum), 10 s for throughput probes; 12 s for streams under load. Under
// load a path's time is split into windowRounds windows, each with its
// share of the warm-up.
func defaults() options {
	const interval, chunks = 20 * time.Millisecond, 64
	return options{
		GatewayCPUs: "0",
		ClientCPUs:  "1",
		Phases: []phaseSpec{
			{Key: "c1", Title: "c=1, non-streaming, instant mock", Concurrency: 1, Warmup: 5 * time.Second, Measure: 20 * time.Second},
			{Key: "stream-c1", Title: "c=1, streaming", Stream: true, Concurrency: 1, Warmup: 5 * time.Second, Measure: 30 * time.Second,
				Interval: interval, Chunks: chunks},
			{Key: "stream-c64", Title: "c=64, streaming", Stream: true, Concurrency: 64, Warmup: 4 * time.Second, Measure: 12 * time.Second,
				Interval: interval, Chunks: chunks},
			{Key: "stream-c256", Title: "c=256, streaming", Stream: true, Concurrency: 256, Warmup: 4 * time.Second, Measure: 12 * time.Second,
				Interval: interval, Chunks: chunks},
			{Key: "rps-c64", Title: "c=64, non-streaming, 20 ms mock", Concurrency: 64, Warmup: 2 * time.Second, Measure: 10 * time.Second,
				Delay: 20 * time.Millisecond},
			{Key: "rps-c256", Title: "c=256, non-streaming, 20 ms mock", Concurrency: 256, Warmup: 2 * time.Second, Measure: 10 * time.Second,
				Delay: 20 * time.Millisecond},
			{Key: "stream-zero", Title: "c=8, streaming, zero-delay mock", Stream: true, Concurrency: 8, Warmup: 2 * time.Second, Measure: 8 * time.Second,
				Chunks: chunks},
		},
		Variants: []phaseSpec{
			{Key: "c1", Title: "c=1, non-streaming", Concurrency: 1, Warmup: 2 * time.Second, Measure: 6 * time.Second},
			{Key: "stream-c8", Title: "c=8, streaming", Stream: true, Concurrency: 8, Warmup: 2 * time.Second, Measure: 8 * time.Second,
				Interval: interval, Chunks: chunks},
		},
		Log: os.Stderr,
	}
}

// harness owns the processes of one run.
type harness struct {
	opts         options
	work         string
	infergateBin string
	envoyBin     string
	mock         *proc
	mockPort     int
	policyDir    string
	keysFile     string
	stacks       []*stack
	peers        []*peer
	otlp         *otlpSink
	start        time.Time
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.opts.Log, "[overhead %6.1fs] %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func (h *harness) want(key string) bool {
	return len(h.opts.Only) == 0 || slices.Contains(h.opts.Only, key)
}

func (h *harness) stackOf(name string) *stack {
	for _, s := range h.stacks {
		if s.name == name {
			return s
		}
	}
	return nil
}

// The three paths of the main run.
const (
	direct  = "direct"
	plain   = "envoy"
	gateway = "gateway"
)

// run measures everything opts asks for and returns the report; the error
// says what failed (a failed request, a body that differs, a process).
func run(ctx context.Context, opts options) (*Report, error) {
	h := &harness{opts: opts, start: time.Now()}
	rep := &Report{Tool: "bench/overhead", StartedAt: h.start.UTC(), Pinning: pinning(opts)}
	defer h.cleanup()
	if err := h.setup(); err != nil {
		return rep, err
	}
	rep.Machine = machine(h.envoyBin)
	rep.Version = version(h.infergateBin)

	if err := h.startMock(); err != nil {
		return rep, err
	}
	envoy, err := h.startPlain(plain)
	if err != nil {
		return rep, err
	}
	h.stacks = append(h.stacks, envoy)
	gw, err := h.startGateway(gateway, gatewaySpec{})
	if err != nil {
		return rep, err
	}
	h.stacks = append(h.stacks, gw)
	paths := []path{
		{name: direct, url: fmt.Sprintf("http://127.0.0.1:%d", h.mockPort)},
		{name: plain, url: envoy.url, procs: envoy.procs()},
		{name: gateway, url: gw.url, procs: gw.procs()},
	}
	peerPaths, peerInfos := h.startPeers()
	paths, rep.Peers = append(paths, peerPaths...), peerInfos
	for _, spec := range opts.Phases {
		if !h.want(spec.Key) {
			continue
		}
		paths = h.livePeers(paths, rep.Peers)
		res, err := h.runPhase(ctx, spec, paths)
		if res != nil {
			rep.Phases = append(rep.Phases, res)
		}
		if err != nil {
			return rep, err
		}
	}
	for _, p := range append(append(envoy.procs(), gw.procs()...), h.peerProcs()...) {
		rep.PeakRSS = append(rep.PeakRSS, ProcessRSS{Name: p.name, Bytes: peakRSS(p.pid())})
	}
	for _, v := range variants() {
		if !h.want(v.Key) || (v.Key == "previous" && opts.Previous == "") {
			continue
		}
		res, err := h.runVariant(ctx, v, gw)
		if res != nil {
			rep.Variants = append(rep.Variants, res)
		}
		if err != nil {
			return rep, err
		}
	}
	rep.DurationS = time.Since(h.start).Seconds()
	rep.Targets = targets(rep)
	peerRatios(rep)
	h.logf("done in %.0fs", rep.DurationS)
	return rep, nil
}

// setup finds Envoy, builds infergate and writes the policies and keys.
func (h *harness) setup() error {
	work := h.opts.Work
	if work == "" {
		dir, err := os.MkdirTemp("", "infergate-overhead-")
		if err != nil {
			return err
		}
		h.work = dir
	} else {
		if err := os.MkdirAll(work, 0o755); err != nil {
			return err
		}
		h.work = work
	}
	h.envoyBin = h.opts.Envoy
	if h.envoyBin == "" {
		out, err := exec.Command(filepath.Join(h.opts.Root, "scripts", "install-envoy.sh")).Output()
		if err != nil {
			return fmt.Errorf("scripts/install-envoy.sh: %w", err)
		}
		h.envoyBin = strings.TrimSpace(string(out))
	}
	h.infergateBin = h.opts.Infergate
	if h.infergateBin == "" {
		h.infergateBin = filepath.Join(h.work, "infergate")
		h.logf("building infergate")
		cmd := exec.Command("go", "build", "-o", h.infergateBin, "./cmd/infergate")
		cmd.Dir = h.opts.Root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/infergate: %w\n%s", err, out)
		}
	} else if abs, err := filepath.Abs(h.infergateBin); err == nil {
		h.infergateBin = abs
	}
	if h.opts.Mock == "" {
		h.opts.Mock = filepath.Join(h.work, "infergate-bench")
		h.logf("building infergate-bench (the mock)")
		cmd := exec.Command("go", "build", "-o", h.opts.Mock, "./cmd/infergate-bench")
		cmd.Dir = filepath.Join(h.opts.Root, "bench")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./bench/cmd/infergate-bench: %w\n%s", err, out)
		}
	} else if abs, err := filepath.Abs(h.opts.Mock); err == nil {
		h.opts.Mock = abs
	}
	if h.opts.Previous != "" {
		abs, err := filepath.Abs(h.opts.Previous)
		if err != nil {
			return err
		}
		h.opts.Previous = abs
	}
	return h.writePolicies()
}

func (h *harness) cleanup() {
	for _, s := range h.stacks {
		s.stop()
	}
	for _, p := range h.peers {
		p.proc.stop()
	}
	h.mock.stop()
	if h.otlp != nil {
		h.otlp.srv.Stop()
	}
	if h.opts.Work == "" && h.work != "" {
		_ = os.RemoveAll(h.work)
	}
}

func version(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// variant is one design choice whose price is measured: the default
// gateway against one that differs in that choice only, interleaved.
type variant struct {
	Key      string
	Title    string
	Baseline string // what the default does
	Changed  string // what the variant does instead
	spec     func(h *harness) (gatewaySpec, func(), error)
	// withPlain measures plain Envoy in the variant's phases too; phases,
	// when set, replaces the variants' phases (opts.Variants).
	withPlain bool
	phases    func(o options) []phaseSpec
}

func variants() []variant {
	return []variant{
		{Key: "gate-buffered", Title: "gate: one ext_proc round trip vs two",
			Baseline: "request body STREAMED + send_body_without_waiting_for_header_response (headers and body answered together)",
			Changed:  "request body BUFFERED (headers answered first, the decision on the body: two round trips)",
			spec: func(*harness) (gatewaySpec, func(), error) {
				return gatewaySpec{envoy: func(doc map[string]any) error {
					tc, err := filterConfig(doc, "infergate.gate")
					if err != nil {
						return err
					}
					tc["processing_mode"].(map[string]any)["request_body_mode"] = "BUFFERED"
					delete(tc, "send_body_without_waiting_for_header_response")
					return nil
				}}, nil, nil
			}},
		{Key: "meter-blocking", Title: "meter: observability mode vs blocking",
			Baseline: "observability_mode: Envoy sends copies and never waits",
			Changed:  "a blocking filter, response body STREAMED: Envoy holds each part until infergate answers it",
			spec: func(*harness) (gatewaySpec, func(), error) {
				return gatewaySpec{envoy: func(doc map[string]any) error {
					tc, err := filterConfig(doc, "infergate.meter")
					if err != nil {
						return err
					}
					delete(tc, "observability_mode")
					delete(tc, "deferred_close_timeout")
					return nil
				}}, nil, nil
			}},
		{Key: "uds", Title: "ext_proc over TCP vs a Unix domain socket",
			Baseline: "Envoy reaches infergate over loopback TCP",
			Changed:  "over a Unix domain socket (extproc.listen unix:PATH, an Envoy pipe address)",
			spec: func(*harness) (gatewaySpec, func(), error) {
				return gatewaySpec{unix: true}, nil, nil
			}},
		{Key: "own-cpu", Title: "infergate beside Envoy vs on another CPU",
			Baseline: "infergate shares the gateway CPU with Envoy",
			Changed:  "infergate runs on the client CPU (with the mock and the load generator), Envoy alone on the gateway CPU",
			spec: func(h *harness) (gatewaySpec, func(), error) {
				if h.opts.ClientCPUs == "" { // unpinned: both stacks are alike, nothing is priced
					h.logf("variant own-cpu: unpinned, so the same as the default")
				}
				return gatewaySpec{cpus: h.opts.ClientCPUs}, nil, nil
			}},
		{Key: "gc", Title: "infergate's GOGC vs Go's default",
			Baseline: "infergate's default GOGC (cli.DefaultGCPercent), or --infergate-env GOGC=N",
			Changed:  "GOGC=100, Go's default",
			spec: func(*harness) (gatewaySpec, func(), error) {
				return gatewaySpec{env: []string{"GOGC=100"}}, nil, nil
			}},
		{Key: "previous", Title: "this build vs an earlier one (--previous)",
			Baseline: "the infergate binary measured",
			Changed:  "the --previous binary, same config and Envoy (before/after a change that keeps both)",
			spec: func(h *harness) (gatewaySpec, func(), error) {
				return gatewaySpec{bin: h.opts.Previous}, nil, nil
			}},
		{Key: "opa-off", Title: "Rego policies and limits on vs off",
			Baseline: "policy.dir: the example policies (authz, per-tier budgets) and the in-memory limiter",
			Changed:  "no policy.dir: API keys only, no policy, no limits",
			spec: func(*harness) (gatewaySpec, func(), error) {
				return gatewaySpec{infergate: func(c map[string]any) { delete(c, "policy") }}, nil, nil
			}},
		{Key: "redis", Title: "limits in memory vs in Redis",
			Baseline: "ratelimit.backend: memory",
			Changed:  "ratelimit.backend: redis (a local redis-server on the client CPUs; one Lua call per request, one per settlement)",
			spec: func(h *harness) (gatewaySpec, func(), error) {
				p, addr, err := h.startRedis()
				if err != nil {
					return gatewaySpec{}, nil, err
				}
				return gatewaySpec{infergate: func(c map[string]any) {
					c["ratelimit"] = map[string]any{"backend": "redis", "redis": map[string]any{"address": addr}}
				}}, p.stop, nil
			}},
		{Key: "tracing", Title: "tracing off vs on",
			Baseline: "no tracing.endpoint",
			Changed:  "tracing.endpoint: an OTLP/gRPC receiver in the harness (counts and drops spans); Envoy's own tracer stays off in both",
			spec: func(h *harness) (gatewaySpec, func(), error) {
				if h.otlp == nil {
					s, err := startOTLPSink()
					if err != nil {
						return gatewaySpec{}, nil, err
					}
					h.otlp = s
				}
				return gatewaySpec{infergate: func(c map[string]any) {
					c["tracing"] = map[string]any{"endpoint": h.otlp.addr, "insecure": true}
				}}, nil, nil
			}},
		wasmMeterVariant(),
		moduleVariant(),
	}
}

// VariantResult is one variant's measurement: the default gateway
// ("gateway") and the variant, interleaved in each phase.
type VariantResult struct {
	Key      string         `json:"key"`
	Title    string         `json:"title"`
	Baseline string         `json:"baseline"`
	Changed  string         `json:"changed"`
	Phases   []*PhaseResult `json:"phases"`
	// Spans is how many spans the tracing variant's receiver got.
	Spans int64 `json:"spans,omitempty"`
}

func (h *harness) runVariant(ctx context.Context, v variant, base *stack) (*VariantResult, error) {
	h.logf("variant %s: %s", v.Key, v.Title)
	spec, cleanup, err := v.spec(h)
	if err != nil {
		return nil, fmt.Errorf("variant %s: %w", v.Key, err)
	}
	if cleanup != nil {
		defer cleanup()
	}
	st, err := h.startGateway(v.Key, spec)
	if err != nil {
		return nil, fmt.Errorf("variant %s: %w", v.Key, err)
	}
	h.stacks = append(h.stacks, st)
	defer func() {
		st.stop()
		h.stacks = slices.DeleteFunc(h.stacks, func(s *stack) bool { return s == st })
	}()
	res := &VariantResult{Key: v.Key, Title: v.Title, Baseline: v.Baseline, Changed: v.Changed}
	var spans0 int64
	if h.otlp != nil {
		spans0 = h.otlp.spans.Load()
	}
	paths := []path{{name: gateway, url: base.url, procs: base.procs()}, {name: v.Key, url: st.url, procs: st.procs()}}
	if p := h.stackOf(plain); v.withPlain && p != nil {
		paths = append(paths, path{name: plain, url: p.url, procs: p.procs()})
	}
	specs := h.opts.Variants
	if v.phases != nil {
		specs = v.phases(h.opts)
	}
	for _, ps := range specs {
		ps.Key = v.Key + "/" + ps.Key
		pr, err := h.runPhase(ctx, ps, paths)
		if pr != nil {
			res.Phases = append(res.Phases, pr)
		}
		if err != nil {
			return res, fmt.Errorf("variant %s: %w", v.Key, err)
		}
	}
	if h.otlp != nil && v.Key == "tracing" {
		st.stop() // a graceful stop flushes the spans still batched
		res.Spans = h.otlp.spans.Load() - spans0
		if res.Spans == 0 {
			return res, errors.New("variant tracing: the receiver got no spans")
		}
	}
	return res, nil
}
