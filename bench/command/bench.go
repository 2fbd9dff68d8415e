package command

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/loadgen"
	"github.com/infergate/infergate/bench/report"
	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/stats"
)

const benchSummary = `Send inference requests to one or more targets and measure time to first
token (TTFT), inter-token latency (ITL), time per output token (TPOT),
end-to-end latency (E2E), throughput and goodput, side by side.

--api picks the API: chat (OpenAI /v1/chat/completions, the default),
completions (/v1/completions), responses (OpenAI /v1/responses), messages
(Anthropic /v1/messages; keys go as x-api-key) or embeddings
(/v1/embeddings: never streamed, so latency and throughput only, no TTFT
or ITL). Streams are read in each API's own format: the content events
time TTFT and ITL, the usage counts tokens.

Load: a closed loop (--concurrency users, each sending its next request when
the last one ended) or, with --rate, an open loop (arrivals on a seeded
constant, Poisson or gamma schedule; --concurrency then caps requests in
flight). Latency is also measured from each request's intended send time,
so a target slower than the schedule shows up instead of slowing the
generator. The run is bounded by --requests or --duration, with optional
--warmup and --cooldown (excluded from the numbers).

Every request goes to every target, back to back, in an order that rotates
request by request, so targets see the same requests at the same moment.
With two targets (or --compare-targets A,B), the paired differences B − A
are reported with 95% confidence intervals.

Synthetic prompts are words (1 word ≈ 1 token); requests ask for exactly
max_tokens output tokens (min_tokens and ignore_eos; --no-length-hints for
servers that reject them). Percentiles cover successful requests; failures
are counted by class. The command fails if every request to a target
failed, or if --baseline finds a regression.

Progress goes to stderr; the table to stdout; --json writes the report
documented in docs/bench-json.md.

Examples:
  infergate-bench bench --target http://127.0.0.1:8001 --concurrency 4 --requests 100
  infergate-bench bench --target direct=http://127.0.0.1:8001 \
    --target gateway=http://127.0.0.1:10000 --concurrency 4 --requests 40
  infergate-bench bench --target http://127.0.0.1:8001 --rate 20 --arrival gamma \
    --burstiness 0.5 --duration 30s --warmup 5s --slo-ttft 200ms
  infergate-bench bench --target http://127.0.0.1:8001 --sweep concurrency=1:64:2 \
    --requests 200 --slo-ttft 250ms --slo-itl 30ms`

// errRegression marks a --baseline regression (exit status 1).
var errRegression = errors.New("bench: regression against the baseline")

// benchFlags are the parsed command line.
type benchFlags struct {
	targets      []loadgen.Target
	compare      string
	models       []result.Weight
	keys         []loadgen.Key
	headers      map[string]string
	mixes        []loadgen.HeaderChoice
	concurrency  int
	rate         float64
	arrival      string
	burstiness   float64
	rampUp       time.Duration
	rampUsers    float64
	requests     int
	duration     time.Duration
	warmup       loadgen.Bound
	cooldown     loadgen.Bound
	input        result.Range
	output       result.Range
	prefix       result.Prefix
	prompt       string
	dataset      string
	stream       bool
	api          loadgen.API
	noHints      bool
	seed         int64
	timeout      time.Duration
	slo          result.SLO
	sweep        string
	sweepSpec    loadgen.SweepSpec
	jsonPath     string
	htmlPath     string
	join         string
	baseline     string
	tolerances   loadgen.Tolerances
	setByUser    map[string]bool
	sloTTFT      time.Duration
	sloITL       time.Duration
	sloE2E       time.Duration
	datasetItems []loadgen.DatasetEntry
}

// joinWait bounds how long --join waits for the gateway's last records.
const joinWait = 5 * time.Second

func parseBenchFlags(args []string, stderr io.Writer) (*benchFlags, error) {
	fs := flagset.NewFor("infergate-bench", "bench", benchSummary, stderr)
	f := &benchFlags{headers: map[string]string{}, tolerances: loadgen.Tolerances{Default: 0.10}}
	fs.Func("target", "a target, as `NAME=URL` (URL is the base, without /v1/...); repeatable; a plain URL is named \"target\"", func(v string) error {
		t, err := parseBenchTarget(v)
		if err != nil {
			return err
		}
		for _, have := range f.targets {
			if have.Name == t.Name {
				return fmt.Errorf("duplicate target name %q", t.Name)
			}
		}
		f.targets = append(f.targets, t)
		return nil
	})
	fs.StringVar(&f.compare, "compare-targets", "", "compare two targets request by request, as `A,B` (--target names, URLs or NAME=URL): B − A with 95% CIs")
	fs.Func("model", "model name(s), as `NAME[@WEIGHT][,...]`: one drawn per request by weight; repeatable (default demo)", func(v string) error {
		w, err := loadgen.ParseWeighted(v)
		f.models = append(f.models, w...)
		return err
	})
	fs.Func("api-key", "an API key sent as Authorization: Bearer, as `[NAME=]KEY[@WEIGHT]`; repeatable for a weighted tenant mix (NAME labels it in the report; keys are never written out)", func(v string) error {
		k, err := parseAPIKey(v, len(f.keys)+1)
		f.keys = append(f.keys, k)
		return err
	})
	fs.Func("header", "header to send on every request, as `K:V` (e.g. x-tenant:demo); repeatable", func(v string) error {
		k, val, ok := strings.Cut(v, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("want K:V, got %q", v)
		}
		f.headers[k] = strings.TrimSpace(val)
		return nil
	})
	fs.Func("header-mix", "a header value drawn per request, as `K:V[@WEIGHT]`; repeat with the same K for its other values", func(v string) error {
		c, err := parseHeaderChoice(v)
		f.mixes = append(f.mixes, c)
		return err
	})
	fs.IntVar(&f.concurrency, "concurrency", 4, "users per target, each with one request in flight; with --rate, a cap on requests in flight (none unless given)")
	fs.Float64Var(&f.rate, "rate", 0, "open loop: `R` arrivals per second on average (each goes to every target)")
	fs.StringVar(&f.arrival, "arrival", "poisson", "open-loop arrivals: constant, poisson or gamma")
	fs.Float64Var(&f.burstiness, "burstiness", 1, "gamma shape for --arrival gamma: 1 is Poisson, below 1 burstier, above smoother")
	fs.DurationVar(&f.rampUp, "ramp-up", 0, "open loop: raise the rate linearly from 0 over this time; closed loop: start users evenly over it")
	fs.Float64Var(&f.rampUsers, "ramp-users", 0, "closed loop: start this many users per second (instead of all at once)")
	fs.IntVar(&f.requests, "requests", 32, "measured requests per target (with --duration alone: none, the run is bounded by time)")
	fs.DurationVar(&f.duration, "duration", 0, "measure for this long (with --requests too, whichever ends first)")
	fs.Func("warmup", "before measuring, send `N` requests or for a duration (e.g. 10 or 5s); excluded from the results", func(v string) (err error) {
		f.warmup, err = parseBound(v)
		return err
	})
	fs.Func("cooldown", "after measuring, keep the load on for `N` requests or a duration, and until the measured ones end; excluded", func(v string) (err error) {
		f.cooldown, err = parseBound(v)
		return err
	})
	f.input = result.Range{Min: 32, Max: 32, Dist: "uniform"}
	f.output = result.Range{Min: 32, Max: 32, Dist: "uniform"}
	rangeFlag := func(dst *result.Range) func(string) error {
		return func(v string) (err error) {
			*dst, err = loadgen.ParseRange(v)
			return err
		}
	}
	fs.Func("input-tokens", "prompt length in words ≈ tokens: `N`, MIN:MAX (uniform) or normal:MEAN,STDDEV[,MIN,MAX] (default 32)", rangeFlag(&f.input))
	fs.Func("output-tokens", "max_tokens per request, `N`, MIN:MAX or normal:... as --input-tokens (default 32)", rangeFlag(&f.output))
	fs.Func("max-tokens", "alias of --output-tokens, as `N`", rangeFlag(&f.output))
	fs.Float64Var(&f.prefix.Share, "prefix-share", 0, "`fraction` of requests whose prompt starts with one shared prefix (exercises prefix caches)")
	fs.IntVar(&f.prefix.Tokens, "prefix-tokens", 0, "length of the shared prefix in words, counted in --input-tokens")
	fs.StringVar(&f.prompt, "prompt", "", "a fixed user message instead of synthetic words")
	fs.StringVar(&f.dataset, "dataset", "", "JSONL `file` of requests, one per line: {\"messages\":[...]} or {\"prompt\":\"...\"}, optional max_tokens and model")
	fs.BoolVar(&f.stream, "stream", true, "stream responses (--stream=false: TTFT = E2E, no ITL)")
	f.api = loadgen.APIChat
	fs.Func("api", "the `API` to call: chat, completions, responses, messages or embeddings (default chat)", func(v string) (err error) {
		f.api, err = loadgen.ParseAPI(v)
		return err
	})
	fs.BoolVar(&f.noHints, "no-length-hints", false, "do not send min_tokens and ignore_eos (output may then end before max_tokens; only chat and completions send them)")
	fs.Int64Var(&f.seed, "seed", 1, "seed of the schedule and the workload (same seed, same requests and arrivals)")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "per-request timeout, whole stream included (0: none)")
	fs.DurationVar(&f.sloTTFT, "slo-ttft", 0, "SLO: a request's TTFT at most this (goodput, sweep knee)")
	fs.DurationVar(&f.sloITL, "slo-itl", 0, "SLO: a request's TPOT (its mean inter-token time) at most this")
	fs.DurationVar(&f.sloE2E, "slo-e2e", 0, "SLO: a request's E2E latency at most this")
	fs.Float64Var(&f.slo.Percentile, "slo-percentile", 99, "percentile at which a sweep level must meet the SLOs")
	fs.StringVar(&f.sweep, "sweep", "", "one measurement per load level: concurrency=1,2,4 or rate=5,10,20, or VAR=START:STOP:FACTOR; reports the knee")
	fs.StringVar(&f.jsonPath, "json", "", "write the report to this JSON `file` (docs/bench-json.md)")
	fs.StringVar(&f.htmlPath, "html", "", "write a self-contained HTML report to this `file`")
	fs.StringVar(&f.join, "join", "", "infergate's admin `URL` (with admin.debug.enabled): send a traceparent per request, then join each request with the gateway's record of it (gateway, moderation, upstream first token, decode, outside)")
	fs.StringVar(&f.baseline, "baseline", "", "compare with a previous --json `file`; exit non-zero on a regression")
	fs.Func("tolerance", "allowed worsening vs --baseline, as `T`: 10% (the default) for the default metrics, or METRIC=5% (e.g. ttft_ms.p99=5%); repeatable", f.tolerances.ParseTolerance)
	if err := flagset.Parse(fs, args); err != nil {
		return nil, err
	}
	f.setByUser = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.setByUser[fl.Name] = true })
	f.slo.TTFTMs, f.slo.ITLMs, f.slo.E2EMs = stats.Ms(f.sloTTFT), stats.Ms(f.sloITL), stats.Ms(f.sloE2E)
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return nil, flagset.ErrUsage
	}
	return f, nil
}

// check validates the flags together and fills the defaults that depend on
// other flags.
func (f *benchFlags) check() error {
	if len(f.models) == 0 {
		f.models = []result.Weight{{Value: "demo", Weight: 1}}
	}
	if f.duration > 0 && !f.setByUser["requests"] {
		f.requests = 0
	}
	if f.sweep != "" {
		spec, err := loadgen.ParseSweep(f.sweep)
		if err != nil {
			return fmt.Errorf("--sweep: %w", err)
		}
		f.sweepSpec = spec
	}
	open := f.rate > 0 || f.sweepSpec.Variable == "rate"
	if open && !f.setByUser["concurrency"] {
		f.concurrency = 0 // no cap unless asked for
	}
	if f.compare != "" {
		if err := f.pickCompareTargets(); err != nil {
			return err
		}
	}
	switch {
	case len(f.targets) == 0:
		return errors.New("at least one --target is required")
	case f.rate < 0:
		return errors.New("--rate must not be negative")
	case !open && f.concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case f.concurrency < 0:
		return errors.New("--concurrency must not be negative")
	case f.requests < 0 || f.duration < 0:
		return errors.New("--requests and --duration must not be negative")
	case f.requests == 0 && f.duration == 0:
		return errors.New("--requests or --duration must be positive")
	case f.timeout < 0:
		return errors.New("--timeout must not be negative")
	case f.slo.Percentile <= 0 || f.slo.Percentile > 100:
		return errors.New("--slo-percentile must be in (0, 100]")
	case f.rate > 0 && f.rampUsers > 0:
		return errors.New("--ramp-users is for a closed loop; with --rate use --ramp-up")
	case f.arrival != string(loadgen.Constant) && f.arrival != string(loadgen.Poisson) && f.arrival != string(loadgen.Gamma):
		return fmt.Errorf("--arrival must be constant, poisson or gamma, got %q", f.arrival)
	case !(f.burstiness > 0):
		return errors.New("--burstiness must be positive")
	case f.sweep != "" && len(f.targets) != 1:
		return errors.New("--sweep measures one --target")
	case f.setByUser["tolerance"] && f.baseline == "":
		return errors.New("--tolerance needs --baseline")
	}
	for _, m := range f.models {
		if m.Value == "" {
			return errors.New("--model must not be empty")
		}
	}
	if f.dataset != "" {
		items, err := loadgen.LoadDataset(f.dataset)
		if err != nil {
			return err
		}
		f.datasetItems = items
	}
	return nil
}

// pickCompareTargets makes the --compare-targets pair the run's targets.
func (f *benchFlags) pickCompareTargets() error {
	names := strings.Split(f.compare, ",")
	if len(names) != 2 {
		return fmt.Errorf("--compare-targets wants A,B, got %q", f.compare)
	}
	var pair []loadgen.Target
	for i, n := range names {
		n = strings.TrimSpace(n)
		found := false
		for _, t := range f.targets {
			if t.Name == n {
				pair, found = append(pair, t), true
			}
		}
		if found {
			continue
		}
		t, err := parseBenchTarget(n)
		if err != nil {
			return fmt.Errorf("--compare-targets: %q is neither a --target name nor a URL", n)
		}
		if t.Name == "target" {
			t.Name = string(rune('A' + i))
		}
		pair = append(pair, t)
	}
	if pair[0].Name == pair[1].Name {
		return fmt.Errorf("--compare-targets: the two targets are both named %q", pair[0].Name)
	}
	for _, t := range f.targets {
		if t.Name != pair[0].Name && t.Name != pair[1].Name {
			return fmt.Errorf("--compare-targets compares two targets; --target %s is a third", t.Name)
		}
	}
	f.targets = pair
	return nil
}

// config turns the flags into a loadgen.Config.
func (f *benchFlags) config() loadgen.Config {
	return loadgen.Config{
		Targets:     f.targets,
		Concurrency: f.concurrency,
		Rate:        f.rate,
		Arrival:     loadgen.Arrival(f.arrival),
		Burstiness:  f.burstiness,
		RampUp:      f.rampUp,
		RampUsers:   f.rampUsers,
		Warmup:      f.warmup,
		Measure:     loadgen.Bound{Requests: f.requests, Duration: f.duration},
		Cooldown:    f.cooldown,
		Seed:        f.seed,
		Timeout:     f.timeout,
		Workload: &loadgen.Workload{
			Models:  f.models,
			Keys:    f.keys,
			Headers: f.headers,
			Mixes:   f.mixes,
			Input:   f.input,
			Output:  f.output,
			Prefix:  f.prefix,
			Prompt:  f.prompt,
			Dataset: f.datasetItems,
			Stream:  f.stream,
			NoHints: f.noHints,
			API:     f.api,
		},
	}
}

// Bench runs `infergate-bench bench`; version goes into the report.
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer, version string) error {
	return bench(ctx, args, stdout, stderr, version, nil)
}

// bench is Bench with the targets dialled by dial (nil: TCP).
func bench(ctx context.Context, args []string, stdout, stderr io.Writer, version string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) error {
	f, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	var base *result.Report
	if f.baseline != "" {
		if base, err = loadgen.LoadReport(f.baseline); err != nil {
			return fmt.Errorf("bench: --baseline: %w", err)
		}
	}
	cfg := f.config()
	cfg.Trace = f.join != ""
	cfg.Dial = dial
	rep := &result.Report{
		SchemaVersion: result.SchemaVersion,
		Tool:          "infergate bench",
		Version:       version,
		StartedAt:     time.Now().UTC(),
	}
	start := time.Now()
	var rec *loadgen.Recording
	var runErr error
	if f.sweep != "" {
		rec, runErr = runSweep(ctx, f, cfg, rep, stderr)
	} else {
		progress := loadgen.StartProgress(stderr, "bench: ", expectedRequests(cfg), expectedDuration(cfg))
		cfg.OnSample = progress.Observe
		rec, runErr = loadgen.Run(ctx, cfg)
		progress.Stop()
	}
	if rec == nil {
		return runErr
	}
	rep.DurationS = time.Since(start).Seconds()
	rep.Parameters = f.parameters(cfg)
	for i := range rec.Targets {
		rep.Targets = append(rep.Targets, rec.Result(i, f.slo))
	}
	rep.Metrics = rep.Targets[0].Metrics
	if len(rec.Targets) == 2 {
		c := rec.Compare(0, 1)
		rep.Compare = &c
	}
	if f.join != "" && runErr == nil {
		// The gateway records a request once it has settled it, just
		// after its client saw the end: the last records may come a
		// little later, so the join is read again until every request
		// has its record, for joinWait at most.
		i := loadgen.GatewayTarget(rec.Samples)
		for deadline := time.Now().Add(joinWait); ; {
			recs, err := loadgen.FetchRecords(ctx, http.DefaultClient, f.join)
			if err != nil {
				return fmt.Errorf("bench: --join: %w", err)
			}
			rep.Join = loadgen.Join(f.join, rec.Samples[i], recs)
			if rep.Join.Joined >= rep.Join.Requests || time.Now().After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		rep.Join.Target = rec.Targets[i].Name
	}
	if base != nil && runErr == nil {
		if rep.Baseline, err = loadgen.CheckBaseline(rep, base, f.baseline, f.tolerances); err != nil {
			return err
		}
	}

	loadgen.WriteReport(stdout, rep)
	if err := writeBenchOutputs(f, rep); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	for _, t := range rep.Targets {
		if m := t.Metrics.Requests; f.sweep == "" && m.Sent > 0 && m.Failed == m.Sent {
			return fmt.Errorf("bench: every request to %q failed (%s)", t.Name, firstExample(t.Metrics.Errors))
		}
	}
	if rep.Baseline != nil && !rep.Baseline.Passed {
		var worse []string
		for _, c := range rep.Baseline.Checks {
			if !c.Passed {
				worse = append(worse, c.Target+" "+c.Metric)
			}
		}
		return fmt.Errorf("%w %s: %s", errRegression, f.baseline, strings.Join(worse, ", "))
	}
	return nil
}

// runSweep measures each level and fills rep.Sweep; it returns the
// recording whose targets the report shows: the knee's, else the first
// level's.
func runSweep(ctx context.Context, f *benchFlags, cfg loadgen.Config, rep *result.Report, stderr io.Writer) (*loadgen.Recording, error) {
	spec := f.sweepSpec
	var progress *loadgen.Progress
	cfg.OnSample = func(s *loadgen.Sample) { progress.Observe(s) }
	onLevel := func(i int, load float64) {
		if progress != nil {
			progress.Stop()
		}
		label := fmt.Sprintf("bench [%s %s, %d/%d]: ", spec.Variable, strconv.FormatFloat(load, 'f', -1, 64), i+1, len(spec.Levels))
		progress = loadgen.StartProgress(stderr, label, expectedRequests(cfg), expectedDuration(cfg))
	}
	sw, recs, err := loadgen.Sweep(ctx, cfg, spec, f.slo, onLevel)
	if progress != nil {
		progress.Stop()
	}
	rep.Sweep = sw
	if len(recs) == 0 {
		return nil, err
	}
	pick := 0
	if sw.Knee >= 0 {
		pick = sw.Knee
	}
	if spec.Variable == "rate" {
		f.rate = spec.Levels[pick]
	} else {
		f.rate, f.concurrency = 0, int(spec.Levels[pick])
	}
	return recs[pick], err
}

func expectedRequests(c loadgen.Config) int {
	n := 0
	for _, b := range []loadgen.Bound{c.Warmup, c.Measure, c.Cooldown} {
		if b.Duration > 0 && b.Requests == 0 {
			return 0 // bounded by time: the bar follows the clock
		}
		n += b.Requests
	}
	return n * len(c.Targets)
}

func expectedDuration(c loadgen.Config) time.Duration {
	return c.Warmup.Duration + c.Measure.Duration + c.Cooldown.Duration
}

// parameters records the run's configuration in the report.
func (f *benchFlags) parameters(cfg loadgen.Config) result.Parameters {
	p := result.Parameters{
		Mode:             "closed",
		Concurrency:      f.concurrency,
		Requests:         f.requests,
		DurationS:        f.duration.Seconds(),
		WarmupS:          f.warmup.Duration.Seconds(),
		CooldownS:        f.cooldown.Duration.Seconds(),
		WarmupRequests:   f.warmup.Requests,
		CooldownRequests: f.cooldown.Requests,
		Stream:           f.stream && f.api != loadgen.APIEmbeddings,
		LengthHints:      !f.noHints && (f.api == loadgen.APIChat || f.api == loadgen.APICompletions),
		Models:           f.models,
		InputTokens:      f.input,
		OutputTokens:     f.output,
		Dataset:          f.dataset,
		Seed:             f.seed,
		SLO:              f.slo,
		TimeoutS:         f.timeout.Seconds(),
	}
	for _, t := range cfg.Targets {
		p.Targets = append(p.Targets, result.Target{Name: t.Name, URL: t.URL})
	}
	if f.rate > 0 {
		p.Mode, p.RatePerS, p.Arrival = "open", f.rate, f.arrival
		if f.arrival == string(loadgen.Gamma) {
			p.Burstiness = f.burstiness
		}
		if f.rampUp > 0 {
			p.RampUp = fmt.Sprintf("linear 0→%g req/s over %s", f.rate, f.rampUp)
		}
	} else {
		switch {
		case f.rampUsers > 0:
			p.RampUp = fmt.Sprintf("%g users/s", f.rampUsers)
		case f.rampUp > 0 && f.concurrency > 1:
			p.RampUp = fmt.Sprintf("%.3g users/s", float64(f.concurrency-1)/f.rampUp.Seconds())
		}
	}
	if f.prefix.Share > 0 && f.prefix.Tokens > 0 {
		p.SharedPrefix = &result.Prefix{Share: f.prefix.Share, Tokens: f.prefix.Tokens}
	}
	for _, k := range f.keys {
		p.Tenants = append(p.Tenants, result.Weight{Value: k.Name, Weight: k.Weight})
	}
	for _, m := range f.mixes {
		p.HeaderMixes = append(p.HeaderMixes, result.Weight{Value: m.Name + ": " + m.Value, Weight: m.Weight})
	}
	return p
}

func writeBenchOutputs(f *benchFlags, rep *result.Report) error {
	if f.jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(f.jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: writing --json: %w", err)
		}
	}
	if f.htmlPath != "" {
		out, err := os.Create(f.htmlPath)
		if err != nil {
			return fmt.Errorf("bench: writing --html: %w", err)
		}
		err = report.WriteHTML(out, rep)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("bench: writing --html: %w", err)
		}
	}
	return nil
}

func firstExample(e result.Errors) string {
	for _, class := range []string{loadgen.ClassConnection, loadgen.ClassTimeout, loadgen.ClassHTTP5xx,
		loadgen.ClassHTTP429, loadgen.ClassHTTP4xx, loadgen.ClassStream, loadgen.ClassOther} {
		if msg, ok := e.Examples[class]; ok {
			return msg
		}
	}
	return "no detail"
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

// parseAPIKey reads [NAME=]KEY[@WEIGHT]; unnamed keys are key1, key2, ...
// A key containing "=" needs the NAME= form.
func parseAPIKey(v string, n int) (loadgen.Key, error) {
	k := loadgen.Key{Name: "key" + strconv.Itoa(n), Key: v, Weight: 1}
	if i := strings.LastIndexByte(k.Key, '@'); i >= 0 {
		w, err := strconv.ParseFloat(k.Key[i+1:], 64)
		if err != nil || !(w > 0) {
			return k, fmt.Errorf("want [NAME=]KEY[@WEIGHT] with a positive weight, got %q", v)
		}
		k.Key, k.Weight = k.Key[:i], w
	}
	if name, key, ok := strings.Cut(k.Key, "="); ok && name != "" && key != "" {
		k.Name, k.Key = name, key
	}
	if k.Key == "" {
		return k, fmt.Errorf("empty API key in %q", v)
	}
	return k, nil
}

// parseHeaderChoice reads K:V[@WEIGHT].
func parseHeaderChoice(v string) (loadgen.HeaderChoice, error) {
	k, val, ok := strings.Cut(v, ":")
	c := loadgen.HeaderChoice{Name: strings.TrimSpace(k), Value: strings.TrimSpace(val), Weight: 1}
	if !ok || c.Name == "" {
		return c, fmt.Errorf("want K:V[@WEIGHT], got %q", v)
	}
	if i := strings.LastIndexByte(c.Value, '@'); i >= 0 {
		w, err := strconv.ParseFloat(c.Value[i+1:], 64)
		if err != nil || !(w > 0) {
			return c, fmt.Errorf("want K:V[@WEIGHT] with a positive weight, got %q", v)
		}
		c.Value, c.Weight = strings.TrimSpace(c.Value[:i]), w
	}
	return c, nil
}

// parseBound reads a request count ("100") or a duration ("30s").
func parseBound(v string) (loadgen.Bound, error) {
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return loadgen.Bound{Requests: n}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return loadgen.Bound{Duration: d}, nil
	}
	return loadgen.Bound{}, fmt.Errorf("want a request count (e.g. 10) or a duration (e.g. 5s), got %q", v)
}
