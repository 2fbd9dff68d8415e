package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/testutil"
)

func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestUsage(t *testing.T) {
	if _, stderr, err := run(t); !errors.Is(err, ErrUsage) || !strings.Contains(stderr, "Commands:") {
		t.Errorf("no args: err %v, stderr %q", err, stderr)
	}
	if stdout, _, err := run(t, "--help"); err != nil || !strings.Contains(stdout, "infergate serve") {
		t.Errorf("--help: err %v, stdout %q", err, stdout)
	}
	if _, stderr, err := run(t, "frobnicate"); !errors.Is(err, ErrUsage) || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: err %v, stderr %q", err, stderr)
	}
	if stdout, _, err := run(t, "version"); err != nil || !strings.HasPrefix(stdout, "infergate ") {
		t.Errorf("version: err %v, stdout %q", err, stdout)
	}
	for _, cmd := range []string{"bench", "mock"} {
		if _, stderr, err := run(t, cmd, "--help"); !errors.Is(err, ErrUsage) || !strings.Contains(stderr, "infergate-bench "+cmd) {
			t.Errorf("%s: err %v, stderr %q, want a pointer to infergate-bench", cmd, err, stderr)
		}
	}
	for _, cmd := range []string{"serve", "extproc", "controller", "validate"} {
		if _, stderr, err := run(t, cmd, "--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "Usage: infergate "+cmd) {
			t.Errorf("%s --help: err %v, stderr %q", cmd, err, stderr)
		}
	}
	// extproc says what it is, not serve's text.
	_, serveHelp, _ := run(t, "serve", "--help")
	_, extprocHelp, _ := run(t, "extproc", "--help")
	if first := func(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }; first(serveHelp) == first(extprocHelp) {
		t.Errorf("extproc --help repeats serve's summary: %q", first(extprocHelp))
	}
	if _, _, err := run(t, "serve", "--no-such-flag"); !errors.Is(err, ErrUsage) {
		t.Errorf("bad flag: err %v", err)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("gate:\n  maxBodyBytes: 2048\n"), 0o644)
	os.WriteFile(bad, []byte("gate:\n  maxBodyBytes: 2048\n  colour: blue\n"), 0o644)

	if stdout, _, err := run(t, "validate", "--config", good); err != nil || !strings.Contains(stdout, "ok") {
		t.Errorf("good config: err %v, stdout %q", err, stdout)
	}
	_, _, err := run(t, "validate", "--config", bad)
	if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "colour") {
		t.Errorf("bad config: err %v, want the line and the key", err)
	}
	if _, _, err := run(t, "validate"); !errors.Is(err, ErrUsage) {
		t.Errorf("validate without --config: err %v", err)
	}
	// The file as an argument, as most tools take it; one file only.
	if stdout, _, err := run(t, "validate", good); err != nil || !strings.Contains(stdout, good+": ok") {
		t.Errorf("validate FILE: err %v, stdout %q", err, stdout)
	}
	if _, _, err := run(t, "validate", bad); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("validate BAD: err %v", err)
	}
	for _, args := range [][]string{{good, bad}, {"--config", good, bad}} {
		if _, _, err := run(t, append([]string{"validate"}, args...)...); !errors.Is(err, ErrUsage) {
			t.Errorf("validate %v: err %v, want a usage error", args, err)
		}
	}
	if _, _, err := run(t, "serve", "--config", bad); err == nil {
		t.Error("serve started with a bad config")
	}
	// Policies are compiled and their own tests run.
	policies := filepath.Join("..", "..", "policies")
	withPolicy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(withPolicy, []byte("policy:\n  dir: "+policies+"\n"), 0o644)
	if stdout, _, err := run(t, "validate", "--config", withPolicy); err != nil || !strings.Contains(stdout, "pass their tests") {
		t.Errorf("config with policies: err %v, stdout %q", err, stdout)
	}
	broken := t.TempDir()
	os.WriteFile(filepath.Join(broken, "authz.rego"), []byte("package infergate.authz\nallow if {\n"), 0o644)
	os.WriteFile(withPolicy, []byte("policy:\n  dir: "+broken+"\n"), 0o644)
	if _, _, err := run(t, "validate", "--config", withPolicy); err == nil || !strings.Contains(err.Error(), "authz.rego") {
		t.Errorf("broken policy: err %v, want the file named", err)
	}
}

// validate reads admin.debug.tokenFile as serve does at start: a missing
// or empty token file fails the check, not the rollout.
func TestValidateDebugToken(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	cfg := filepath.Join(dir, "debug.yaml")
	if err := os.WriteFile(cfg, []byte("admin:\n  debug: {enabled: true, tokenFile: "+token+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, "validate", "--config", cfg); err == nil || !strings.Contains(err.Error(), "admin.debug.tokenFile") {
		t.Errorf("missing token file: err %v, want admin.debug.tokenFile named", err)
	}
	if err := os.WriteFile(token, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, "validate", "--config", cfg); err == nil || !strings.Contains(err.Error(), "admin.debug.tokenFile") {
		t.Errorf("empty token file: err %v, want admin.debug.tokenFile named", err)
	}
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if stdout, _, err := run(t, "validate", "--config", cfg); err != nil || !strings.Contains(stdout, "ok") {
		t.Errorf("readable token file: err %v, stdout %q", err, stdout)
	}
}

// serve stops cleanly when its context ends.
func TestServeStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stderr := &testutil.Buffer{}
	go func() {
		done <- Run(ctx, []string{"serve", "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
			&bytes.Buffer{}, stderr)
	}()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stderr.String(), "infergate serving"); {
		if time.Now().After(deadline) {
			t.Fatalf("serve never started: %s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
	if !strings.Contains(stderr.String(), "infergate stopped") {
		t.Errorf("log: %s", stderr.String())
	}
}

// The admin port's root lists what the port serves, the /debug pages only
// when they are on; anything else under / stays a 404.
func TestAdminIndex(t *testing.T) {
	for _, debug := range []bool{false, true} {
		cfg, err := config.Parse(fmt.Appendf(nil, "admin:\n  debug:\n    enabled: %t\n", debug))
		if err != nil {
			t.Fatal(err)
		}
		ledgerInTemp(t, cfg)
		svc, err := NewService(cfg, slog.New(slog.DiscardHandler), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		h := svc.AdminHandler()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		body := rec.Body.String()
		if rec.Code != 200 || !strings.Contains(body, `href="/metrics"`) || !strings.Contains(body, `href="/readyz"`) {
			t.Errorf("debug %t: GET / = %d %q", debug, rec.Code, body)
		}
		if strings.Contains(body, "/debug/spend") != debug {
			t.Errorf("debug %t: the index lists /debug/spend: %t", debug, !debug)
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/nothing", nil))
		if rec.Code != 404 {
			t.Errorf("GET /nothing = %d", rec.Code)
		}
	}
}

// serve says loudly when nothing authenticates, and only then.
func TestUnauthenticatedWarning(t *testing.T) {
	for _, c := range []struct {
		yaml string
		warn bool
	}{
		{"", true},
		{"policy:\n  dir: /p\n", true},
		{"auth:\n  keys: /k.yaml\n", false},
		{"auth:\n  jwt:\n    enabled: true\n", false},
	} {
		var cfg config.Config
		cfg.Auth.Keys = map[bool]string{true: "/k.yaml"}[strings.Contains(c.yaml, "keys")]
		cfg.Auth.JWT.Enabled = strings.Contains(c.yaml, "jwt")
		cfg.Policy.Dir = map[bool]string{true: "/p"}[strings.Contains(c.yaml, "policy")]
		if w := unauthenticatedWarning(&cfg); (w != "") != c.warn || (c.warn && !strings.Contains(w, "NOTHING AUTHENTICATES")) {
			t.Errorf("%q: warning %q", c.yaml, w)
		}
	}
}
