// Command overhead measures what infergate adds to LLM traffic the way the
// public gateway overhead board (GetBusbar/benchmarking) measures gateways,
// side by side with plain Envoy: `make bench-overhead`.
//
// It starts, on loopback, infergate's mock in the board's profile
// (`infergate-bench mock --profile board`), plain Envoy (envoy/overhead-plain.yaml)
// and Envoy with infergate's gate and meter (envoy/overhead.yaml; the
// example policies with limits on), and drives the three paths — direct to
// the mock, through plain Envoy, through Envoy + infergate — with the same
// requests, interleaved, using bench/loadgen: c=1 latency (one request at a
// time, as the board measures one path at a time), streams at c=1, 64 and
// 256, throughput against the 20 ms mock, and a zero-delay stream for CPU
// per token. Every body through a gateway must be byte-identical to the
// direct one and no request may fail, or the run fails. Peer gateways
// (--peers: the LiteLLM proxy, the Portkey gateway; peers.go) run as lanes
// of their own in the same phases; their failures and bodies are reported,
// never fatal, with infergate's ratios to each. Then each variant
// (two gate round trips, a blocking meter, a Unix socket, no policies,
// Redis limits, tracing) is measured against the default gateway.
//
// Results go to JSON (--json) and to the generated section of a Markdown
// file (--doc, docs/performance.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// pinnedEnv marks the harness re-executed under taskset.
const pinnedEnv = "INFERGATE_OVERHEAD_PINNED"

func main() {
	opts := defaults()
	flag.StringVar(&opts.Infergate, "infergate", "", "infergate binary (default: go build ./cmd/infergate)")
	flag.StringVar(&opts.Mock, "mock-bin", "", "binary to run `mock --profile board` with (default: infergate-bench, built from the repository)")
	flag.StringVar(&opts.Previous, "previous", "", "an earlier infergate binary: the variant \"previous\" measures this build against it, interleaved")
	flag.StringVar(&opts.Envoy, "envoy", "", "Envoy binary (default: scripts/install-envoy.sh, which honours ENVOY_BIN)")
	flag.StringVar(&opts.GatewayCPUs, "gateway-cpus", opts.GatewayCPUs, `CPUs for Envoy and infergate (taskset list; "" unpinned)`)
	flag.StringVar(&opts.InfergateCPUs, "infergate-cpus", "", "CPUs for infergate, when not the gateway CPUs (taskset list)")
	flag.Func("infergate-env", "add NAME=VALUE to infergate's environment (repeatable), e.g. GOMAXPROCS=2", func(v string) error {
		if !strings.Contains(v, "=") {
			return errors.New("want NAME=VALUE")
		}
		opts.InfergateEnv = append(opts.InfergateEnv, v)
		return nil
	})
	flag.StringVar(&opts.ClientCPUs, "client-cpus", opts.ClientCPUs, `CPUs for the mock, Redis and this harness (taskset list; "" unpinned)`)
	var keys []string
	for _, p := range opts.Phases {
		keys = append(keys, p.Key)
	}
	for _, v := range variants() {
		keys = append(keys, v.Key)
	}
	only := flag.String("only", "", "comma-separated phases and variants to run (default: all): "+strings.Join(keys, ", "))
	peers := flag.String("peers", "", "peer gateways measured as lanes of their own in the main phases, comma-separated: "+strings.Join(allPeers, ", ")+
		` (installed by scripts/install-peers.sh); "none" for none (default: all in a full run, none with --only)`)
	jsonOut := flag.String("json", "", "write the report as JSON here")
	doc := flag.String("doc", "", "replace the generated section of this Markdown file")
	command := flag.String("command", "", "the command to record as reproducing the run (default: this one)")
	flag.StringVar(&opts.ProfileDir, "profile-dir", "", "write a CPU profile of infergate per phase here (perturbs the numbers a little)")
	flag.StringVar(&opts.Work, "work", "", "keep configs and process logs in this directory")
	flag.BoolVar(&opts.AccessLog, "envoy-access-log", false, "give every Envoy an access log in --work with its timings per request (DS_RX_BEG to US_TX_BEG, ...)")
	variantPhases := flag.String("variant-phases", "", "the phases each variant is measured with, from the main and variant phases (default: c1,stream-c8)")
	scale := flag.Float64("scale", 1, "multiply every warm-up and measurement window (e.g. 0.2 for a quick look; the published numbers use 1)")
	flag.Parse()
	if *scale <= 0 {
		fatal(errors.New("--scale must be positive"))
	}
	for _, phases := range [][]phaseSpec{opts.Phases, opts.Variants} {
		for i := range phases {
			phases[i].Warmup = time.Duration(float64(phases[i].Warmup) * *scale)
			phases[i].Measure = time.Duration(float64(phases[i].Measure) * *scale)
		}
	}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
	}
	switch {
	case *peers == "none":
	case *peers != "":
		opts.Peers = strings.Split(*peers, ",")
		for _, p := range opts.Peers {
			if !slices.Contains(allPeers, p) {
				fatal(fmt.Errorf("--peers: unknown peer %q (want %s)", p, strings.Join(allPeers, ", ")))
			}
		}
	case *only == "": // a quick run stays quick
		opts.Peers = allPeers
	}
	if *variantPhases != "" {
		all := append(slices.Clone(opts.Variants), opts.Phases...) // a variant's own c1 is the shorter
		var picked []phaseSpec
		for _, key := range strings.Split(*variantPhases, ",") {
			i := slices.IndexFunc(all, func(p phaseSpec) bool { return p.Key == key })
			if i < 0 {
				fatal(fmt.Errorf("--variant-phases: no phase %q", key))
			}
			picked = append(picked, all[i])
		}
		opts.Variants = picked
	}
	if opts.ClientCPUs != "" && os.Getenv(pinnedEnv) == "" {
		pinSelf(opts.ClientCPUs)
	}
	root, err := repoRoot()
	if err != nil {
		fatal(err)
	}
	opts.Root = root
	if opts.ProfileDir != "" {
		if err := os.MkdirAll(opts.ProfileDir, 0o755); err != nil {
			fatal(err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, opts)
	rep.Args = os.Args[1:]
	rep.Command = *command
	if rep.Command == "" {
		rep.Command = "go -C bench run ./overhead " + strings.Join(os.Args[1:], " ")
	}
	if err != nil {
		rep.Error = err.Error()
	}
	if *jsonOut != "" {
		if werr := writeJSON(*jsonOut, rep); werr != nil {
			fatal(werr)
		}
	}
	// A failed run does not overwrite the published numbers.
	if *doc != "" && err == nil {
		if werr := updateDoc(*doc, rep); werr != nil {
			fatal(werr)
		}
	}
	fmt.Print(markdown(rep))
	if err != nil {
		fatal(err)
	}
}

// pinSelf re-executes the harness under taskset on cpus, so that the load
// generator and everything in-process run there (pinning a Go process from
// inside only pins the calling thread).
func pinSelf(cpus string) {
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		fatal(errors.New("taskset not found (util-linux); or run unpinned with --gateway-cpus '' --client-cpus ''"))
	}
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	argv := append([]string{"taskset", "-c", cpus, self}, os.Args[1:]...)
	fatal(syscall.Exec(taskset, argv, append(os.Environ(), pinnedEnv+"=1")))
}

// repoRoot finds the repository from the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/infergate/infergate\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the infergate repository")
		}
		dir = parent
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "overhead:", err)
	os.Exit(1)
}
