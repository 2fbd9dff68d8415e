// Package cli is the infergate command line: `main` only calls Run, so every
// subcommand runs in-process in tests with its own context and writers.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/policy"
)

// Version is set at build time (-ldflags "-X ...cli.Version=v1.2.3").
var Version = "dev"

const usage = `infergate: an Envoy ext_proc plugin for LLM inference traffic.

Envoy streams requests to your inference pools; infergate's "gate" filter
checks and routes each request, its "meter" filter stamps each response with
time to first token (TTFT), inter-token latency (ITL) and token counts.

Usage:
  infergate <command> [flags]

Commands:
  serve      run the ext_proc service, the admin port and, with virtual models,
             the SLA controller and its xDS server (embedded default config)
  extproc    run the ext_proc service alone (for scaled-out deployments)
  controller run the SLA controller and xDS server alone, fed through Redis
  validate   check a config file and exit
  keys       create, list, revoke and rotate API keys in a keys file
  spend      print what the budgets charged, by tenant, team, key or model
  version    print the version

Examples:
  infergate serve                              # ext_proc on 127.0.0.1:50051, admin on 127.0.0.1:9090
  infergate serve --config infergate.yaml
  infergate validate --config infergate.yaml

Run 'infergate <command> --help' for a command's flags. Envoy wiring is in
envoy/snippet.yaml; see README.md. The load generator and the mock upstream
are a binary of their own, infergate-bench (make build-bench).
`

// ErrUsage marks a command-line mistake (exit status 2).
var ErrUsage = flagset.ErrUsage

// Run executes one command line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve", "extproc":
		return runServe(ctx, cmd, rest, stdout, stderr)
	case "controller":
		return runController(ctx, rest, stderr)
	case "bench", "mock":
		// Moved out of the product binary with the rest of the lab (bench/).
		fmt.Fprintf(stderr, "infergate: %s is in the lab's own binary now: infergate-bench %s (make build-bench builds bin/infergate-bench)\n", cmd, cmd)
		return ErrUsage
	case "validate":
		return runValidate(rest, stdout, stderr)
	case "keys":
		return runKeys(ctx, rest, stdout, stderr)
	case "spend":
		return runSpend(ctx, rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "infergate %s (%s, Envoy API v3, tested with Envoy 1.40)\n", Version, runtime.Version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "infergate: unknown command %q\n\n%s", cmd, usage)
	return ErrUsage
}

func runServe(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	summary := "Run infergate whole, in one process: the ext_proc gRPC service (the gate and the meter),\nthe SLA controller with its xDS server, and the admin HTTP port."
	if name == "extproc" {
		summary = "Run the ext_proc gRPC service alone (the gate and the meter) and the admin HTTP port: one of\nseveral replicas sharing their budgets in Redis; the SLA controller runs apart (infergate controller)."
	}
	fs := flagset.New(name, summary, stderr)
	path := fs.String("config", "", "YAML config file (default: the embedded default; see internal/config/default.yaml)")
	extprocAddr := fs.String("extproc-listen", "", "override extproc.listen, e.g. 127.0.0.1:50051 or unix:/run/infergate.sock")
	adminAddr := fs.String("admin-listen", "", "override admin.listen, e.g. 127.0.0.1:9090")
	if err := flagset.Parse(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if *extprocAddr != "" {
		cfg.ExtProc.Listen = *extprocAddr
	}
	if *adminAddr != "" {
		cfg.Admin.Listen = *adminAddr
	}
	if err := cfg.Validate(); err != nil { // the flags' addresses too
		return err
	}
	if name == "extproc" {
		// The ext_proc service alone: routing decisions belong to `serve`
		// (and, later, to a separate controller).
		cfg.VirtualModels = nil
	}
	logger := compose.NewLogger(stderr, cfg.Log)
	tuneGC()
	svc, err := NewService(cfg, logger, stdout)
	if err != nil {
		return err
	}
	return svc.ListenAndServe(ctx)
}

func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flagset.New("validate", "Check a config file, its API keys and its Rego policies (compiled, their tests run)\nwithout starting anything; exits non-zero on the first error, with its line.", stderr)
	path := fs.String("config", "", "YAML config file to check (required; or give it as the only argument)")
	// The path as an argument, before or after the flags, as most tools take it.
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return ErrUsage
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "validate: unexpected argument %q\n", fs.Arg(fs.NArg()-1))
		return ErrUsage
	}
	switch {
	case file != "" && *path != "" && file != *path:
		fmt.Fprintln(stderr, "validate: one config file: --config or an argument, not both")
		return ErrUsage
	case file != "":
		*path = file
	case *path == "":
		fmt.Fprintln(stderr, "validate: a config file is required: infergate validate FILE (or --config FILE)")
		return ErrUsage
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if cfg.Auth.Keys != "" {
		keys, err := identity.LoadKeys(cfg.Auth.Keys)
		if err != nil {
			return fmt.Errorf("auth.keys: %w", err)
		}
		fmt.Fprintf(stdout, "%s: %d API keys\n", cfg.Auth.Keys, keys.Len())
	}
	if cfg.Policy.Dir != "" {
		// Compiles the policies and runs their own tests, as a reload would.
		if err := policy.Validate(context.Background(), cfg.Policy.Dir); err != nil {
			return fmt.Errorf("policy.dir: %w", err)
		}
		fmt.Fprintf(stdout, "%s: policies compile and pass their tests\n", cfg.Policy.Dir)
	}
	// serve would refuse to start on it: say so before a rollout does.
	if err := compose.CheckDebugToken(cfg.Admin); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}

// DefaultGCPercent is the GOGC infergate runs with when the environment
// sets none. Chosen side by side (`make bench-overhead OVERHEAD_ARGS='--only
// gc --variant-phases rps-c64,stream-c64' --infergate-env GOGC=N`): against
// Go's 100, 400 cut infergate's CPU per request 28 % and raised c=64
// requests/s 14 % for +20 MiB of peak RSS (76 vs 55 MiB); 800 saved no
// more for +45 MiB; streamed tokens cost the same under each (the per-chunk
// path allocates little). GOMEMLIMIT (the chart sets it from the
// container's memory limit) still bounds the heap: the collector works
// harder near it rather than letting the heap pass it.
const DefaultGCPercent = 400

// tuneGC applies DefaultGCPercent unless GOGC is set.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(DefaultGCPercent)
	}
}
