// Package flagset is how every infergate subcommand reads its flags: one
// usage layout, --help as a clean exit, and mistakes as ErrUsage (exit
// status 2).
package flagset

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage marks a command-line mistake (exit status 2).
var ErrUsage = errors.New("usage error")

// New returns a flag set for `infergate name` whose usage starts with
// summary.
func New(name, summary string, stderr io.Writer) *flag.FlagSet {
	return NewFor("infergate", name, summary, stderr)
}

// NewFor is New for another program's subcommand (`infergate-bench mock`).
func NewFor(program, name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nUsage: %s %s [flags]\n\nFlags:\n", summary, program, name)
		fs.PrintDefaults()
	}
	return fs
}

// Parse maps flag errors and stray arguments to ErrUsage, and --help to
// flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return ErrUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(0))
		return ErrUsage
	}
	return nil
}
