package command

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// `infergate-bench mock --tls-cert --tls-key` serves HTTPS, HTTP/2 or HTTP/1.1 as
// the client's ALPN asks.
func TestMockTLS(t *testing.T) {
	const name = "pool.hosted.test"
	ca := testpki.NewCA(t, "mock command test CA")
	leaf := ca.Server(t, name)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, b := range map[string][]byte{cert: leaf.CertPEM, key: leaf.KeyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	stderr := &testutil.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- Mock(ctx, []string{"--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--ttft", "1ms", "--itl", "1ms"}, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mock: %v", err)
		}
	})
	addr := mockAddr(t, stderr, done)

	body := `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	for _, proto := range []string{"h2", "http/1.1"} {
		var p http.Protocols
		p.SetHTTP2(proto == "h2")
		p.SetHTTP1(proto == "http/1.1")
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Protocols: &p,
			TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: name, NextProtos: []string{proto}}}}
		resp, err := client.Post("https://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != proto || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Errorf("%s: status %d over %s (%+v): %q", proto, resp.StatusCode, resp.Proto, resp.TLS, b)
		}
	}
	// Plain HTTP to the TLS port is not served.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP got 200 from the TLS port")
		}
	}
}

func TestMockTLSFlags(t *testing.T) {
	if err := Mock(context.Background(), []string{"--tls-cert", "x.crt"}, io.Discard); !errors.Is(err, flagset.ErrUsage) {
		t.Errorf("--tls-cert alone: %v, want a usage error", err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	err := Mock(context.Background(), []string{"--listen", "127.0.0.1:0", "--tls-cert", missing, "--tls-key", missing}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("unreadable certificate: %v, want an error naming it", err)
	}
}

// mockAddr waits for the mock's "serving" log line and returns its address.
func mockAddr(t *testing.T, stderr *testutil.Buffer, done chan error) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
				TLS  bool   `json:"tls"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "mock upstream serving" {
				if !l.TLS {
					t.Errorf("serving log line says tls=false: %s", line)
				}
				return l.Addr
			}
		}
		select {
		case err := <-done:
			done <- err // for the cleanup's wait
			t.Fatalf("mock exited: %v\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("mock never logged its address:\n%s", stderr.String())
	return ""
}
