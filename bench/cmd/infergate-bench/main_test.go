package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/flagset"
)

func TestCommandLine(t *testing.T) {
	call := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}
	if _, stderr, err := call(); !errors.Is(err, flagset.ErrUsage) || !strings.Contains(stderr, "Commands:") {
		t.Errorf("no args: err %v, stderr %q", err, stderr)
	}
	if _, stderr, err := call("serve"); !errors.Is(err, flagset.ErrUsage) || !strings.Contains(stderr, `unknown command "serve"`) {
		t.Errorf("unknown command: err %v, stderr %q", err, stderr)
	}
	if stdout, _, err := call("version"); err != nil || !strings.HasPrefix(stdout, "infergate-bench dev") {
		t.Errorf("version: err %v, stdout %q", err, stdout)
	}
	for _, cmd := range []string{"bench", "mock"} {
		if _, stderr, err := call(cmd, "--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "Usage: infergate-bench "+cmd+" [flags]") {
			t.Errorf("%s --help: err %v, stderr %q", cmd, err, stderr)
		}
	}
}
