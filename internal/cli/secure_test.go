package cli

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/internal/config"
)

// A fresh `serve` with the default configuration listens on loopback only:
// every listening socket the process holds is bound to 127.0.0.0/8 or ::1.
// The listeners bind the configured host on a free port, so the test does
// not depend on 50051 and 9090 being free.
func TestServeDefaultListensOnLoopbackOnly(t *testing.T) {
	cfg, err := config.Load("")
	if err != nil {
		t.Fatal(err)
	}
	ledgerInTemp(t, cfg)
	svc, err := NewService(cfg, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string
	svc.listen = func(network, addr string) (net.Listener, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		asked = append(asked, addr)
		mu.Unlock()
		return net.Listen(network, net.JoinHostPort(host, "0"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.ListenAndServe(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for deadline := time.Now().Add(5 * time.Second); !svc.ready.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("serve never became ready")
		}
	}
	mu.Lock()
	t.Logf("listen addresses asked for: %q", asked)
	mu.Unlock()
	listening := listeningSockets(t)
	if len(listening) < 2 {
		t.Fatalf("found %d listening sockets, want ext_proc and admin at least: %v", len(listening), listening)
	}
	for _, a := range listening {
		if !a.Addr().Unmap().IsLoopback() {
			t.Errorf("listening on %s, beyond loopback", a)
		}
	}
}

// listeningSockets are the local addresses of the TCP sockets this process
// listens on, from /proc/net/tcp{,6} filtered by the process's own sockets.
func listeningSockets(t *testing.T) []netip.AddrPort {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			mine[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var out []netip.AddrPort
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			const listen = "0A"
			if len(fields) < 10 || fields[3] != listen || !mine[fields[9]] {
				continue
			}
			out = append(out, procAddr(t, fields[1]))
		}
		f.Close()
	}
	return out
}

// procAddr decodes /proc/net/tcp's HEXIP:HEXPORT: the address is in 32-bit
// words of host (little-endian) byte order.
func procAddr(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ipHex, portHex, _ := strings.Cut(s, ":")
	raw, err := hex.DecodeString(ipHex)
	port, perr := strconv.ParseUint(portHex, 16, 16)
	if err != nil || perr != nil || (len(raw) != 4 && len(raw) != 16) {
		t.Fatalf("bad /proc/net/tcp address %q", s)
	}
	for i := 0; i < len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip, uint16(port))
}

// A listen flag is checked like the file: beyond loopback and plaintext is
// refused at start, with what to do instead.
func TestServeRefusesPlaintextBeyondLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"--extproc-listen", ":0", "--admin-listen", "127.0.0.1:0"},
		{"--extproc-listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"},
	} {
		// A serve that starts (and should not have) ends with the context.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := Run(ctx, append([]string{"serve"}, args...), io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "is not a loopback address") {
			t.Errorf("serve %q: %v, want a refusal", args, err)
		}
	}
}

// The access-log service (the Wasm meter's summaries) is registered only
// with meter.wasm: without it a forged summary gets Unimplemented.
func TestAccessLogServiceOnlyWithWasmMeter(t *testing.T) {
	send := func(extproc string) error {
		conn, err := grpc.NewClient(extproc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&accesslogv3.StreamAccessLogsMessage{}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	off := startServeAddrs(t, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	if err := send(off.extproc); status.Code(err) != codes.Unimplemented {
		t.Errorf("a summary without meter.wasm: %v, want Unimplemented", err)
	}
	cfg := filepath.Join(t.TempDir(), "wasm.yaml")
	os.WriteFile(cfg, []byte("meter: {wasm: true}\n"), 0o644)
	on := startServeAddrs(t, "--config", cfg, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	if err := send(on.extproc); status.Code(err) == codes.Unimplemented {
		t.Errorf("a summary with meter.wasm: %v", err)
	}
}

// /debug/* is off by default (404); admin.debug.enabled turns it on, and
// admin.debug.tokenFile puts it (pprof too) behind a bearer token: no
// token or a wrong one gets 401.
func TestDebugPagesNeedTheSwitchAndTheToken(t *testing.T) {
	get := func(admin, path, token string) int {
		req, _ := http.NewRequest("GET", "http://"+admin+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	pages := []string{"/debug/requests", "/debug/requests?format=json", "/debug/controller", "/debug/spend", "/debug/spend?format=json", "/debug/pprof/"}
	off := startServe(t, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	for _, p := range pages {
		if code := get(off, p, ""); code != http.StatusNotFound {
			t.Errorf("default config: GET %s: %d, want 404", p, code)
		}
	}

	dir := t.TempDir()
	open := filepath.Join(dir, "open.yaml")
	os.WriteFile(open, []byte("admin: {debug: {enabled: true}}\n"), 0o644)
	on := startServe(t, "--config", open, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	for _, p := range pages[:len(pages)-1] {
		if code := get(on, p, ""); code != http.StatusOK {
			t.Errorf("admin.debug.enabled: GET %s: %d, want 200", p, code)
		}
	}

	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("s3cret-debug-token\n"), 0o600)
	guarded := filepath.Join(dir, "guarded.yaml")
	os.WriteFile(guarded, []byte("admin: {pprof: true, debug: {enabled: true, tokenFile: "+token+"}}\n"), 0o644)
	locked := startServe(t, "--config", guarded, "--extproc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	for _, p := range pages {
		for _, bad := range []string{"", "wrong", "s3cret-debug-token-and-more", "s3cret"} {
			if code := get(locked, p, bad); code != http.StatusUnauthorized {
				t.Errorf("GET %s with token %q: %d, want 401", p, bad, code)
			}
		}
		if code := get(locked, p, "s3cret-debug-token"); code != http.StatusOK {
			t.Errorf("GET %s with the token: %d, want 200", p, code)
		}
	}
	if code := get(locked, "/metrics", ""); code != http.StatusOK {
		t.Errorf("/metrics needs no token: %d", code)
	}
}
