package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The configuration file refuses extproc.tls on a Unix socket with its
// line; a --extproc-listen flag that moves the port to a socket is refused
// too, rather than serving the socket without the TLS the file asks for.
func TestExtProcTLSNotOnUnixSocket(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tls.yaml")
	os.WriteFile(cfg, []byte("extproc:\n  tls: {certFile: /x/tls.crt, keyFile: /x/tls.key, clientCAFile: /x/ca.crt}\n"), 0o644)
	err := Run(context.Background(), []string{"serve", "--config", cfg, "--extproc-listen", "unix:" + filepath.Join(dir, "s.sock"),
		"--admin-listen", "127.0.0.1:0"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "extproc.tls: not used on a unix: socket") {
		t.Errorf("serve: %v", err)
	}
}
