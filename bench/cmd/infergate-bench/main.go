// Command infergate-bench is infergate's lab on the command line: the load
// generator that measures targets side by side (bench) and the mock
// OpenAI-compatible upstream with a fixed token cadence (mock). A binary
// and a module of its own (bench/go.mod), so that none of it ships in the
// infergate binary or reaches its go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/infergate/infergate/bench/command"
	"github.com/infergate/infergate/internal/flagset"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3"); bench
// writes it into its reports.
var version = "dev"

const usage = `infergate-bench: infergate's load generator and mock upstream.

Usage:
  infergate-bench <command> [flags]

Commands:
  bench      stream load at OpenAI-compatible targets and compare them side by side
  mock       run a mock OpenAI-compatible upstream with a fixed token cadence
  version    print the version

Examples:
  infergate-bench mock --listen 127.0.0.1:8001 --ttft 200ms --itl 20ms
  infergate-bench bench --target http://127.0.0.1:8001 --concurrency 4 --requests 100

Run 'infergate-bench <command> --help' for a command's flags; see
docs/benchmarking.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, flagset.ErrUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "infergate-bench:", err)
		os.Exit(1)
	}
}

// run executes one command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flagset.ErrUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "bench":
		return command.Bench(ctx, rest, stdout, stderr, version)
	case "mock":
		return command.Mock(ctx, rest, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "infergate-bench %s (%s)\n", version, runtime.Version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "infergate-bench: unknown command %q\n\n%s", cmd, usage)
	return flagset.ErrUsage
}
