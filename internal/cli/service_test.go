package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/internal/testutil"
)

// startServe runs `infergate serve` with args until the test ends and
// returns the admin address it bound.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	return startServeAddrs(t, args...).admin
}

// serving is the addresses a started `serve` bound.
type serving struct{ extproc, admin string }

// startServeAddrs runs `infergate serve` with args until the test ends and
// returns the addresses it bound.
func startServeAddrs(t *testing.T, args ...string) serving {
	t.Helper()
	args = ledgerArgs(t, args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stderr := &testutil.Buffer{}
	go func() { done <- Run(ctx, append([]string{"serve"}, args...), &bytes.Buffer{}, stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for line := range strings.Lines(stderr.String()) {
			var l struct{ Msg, Extproc, Admin string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "infergate serving" {
				return serving{extproc: l.Extproc, admin: l.Admin}
			}
		}
	}
	t.Fatalf("serve never started: %s", stderr.String())
	return serving{}
}

// extproc.listen unix:PATH serves ext_proc on a Unix domain socket, replacing
// a stale socket file a killed process left behind.
func TestServeOnUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "extproc.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	startServe(t, "--extproc-listen", "unix:"+sock, "--admin-listen", "127.0.0.1:0")
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A bodiless request to a path the default policy does not serve: the
	// gate answers at once.
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/nowhere")}}}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if code := resp.GetImmediateResponse().GetStatus().GetCode(); code != 404 {
		t.Fatalf("answer over the Unix socket: %v", resp)
	}
}

// admin.pprof mounts Go's profiler on the admin port; it is off by default.
func TestAdminPprof(t *testing.T) {
	get := func(admin, path string) int {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	off := startServe(t, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	if code := get(off, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof without admin.pprof: %d", code)
	}
	cfg := filepath.Join(t.TempDir(), "pprof.yaml")
	os.WriteFile(cfg, []byte("admin: {pprof: true}\n"), 0o644)
	on := startServe(t, "--config", cfg, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		if code := get(on, p); code != http.StatusOK {
			t.Errorf("GET %s: %d", p, code)
		}
	}
}

// ledgerArgs gives the serve of args a ledger file of the test's own (one
// process per file): in a config of its own, or added to the config args
// name unless it names a ratelimit.
func ledgerArgs(t *testing.T, args []string) []string {
	t.Helper()
	line := "ratelimit: {embedded: {path: " + filepath.Join(t.TempDir(), "ledger.db") + "}}\n"
	i := slices.Index(args, "--config")
	if i < 0 {
		cfg := filepath.Join(t.TempDir(), "ledger.yaml")
		if err := os.WriteFile(cfg, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		return append([]string{"--config", cfg}, args...)
	}
	b, err := os.ReadFile(args[i+1])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "ratelimit:") {
		if err := os.WriteFile(args[i+1], append(b, "\n"+line...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return args
}
