package tlsreload

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

type fixture struct {
	files Files
	ca    *testpki.CA
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	f := &fixture{ca: testpki.NewCA(t, "test CA"), files: Files{Cert: filepath.Join(dir, "tls.crt"),
		Key: filepath.Join(dir, "tls.key"), ClientCA: filepath.Join(dir, "ca.crt")}}
	f.serverCert(t)
	testpki.WriteFile(t, f.files.ClientCA, f.ca.PEM)
	return f
}

// serverCert writes a new server certificate and returns its serial.
func (f *fixture) serverCert(t *testing.T) *big.Int {
	leaf := f.ca.Server(t, "infergate")
	testpki.WriteFile(t, f.files.Cert, leaf.CertPEM)
	testpki.WriteFile(t, f.files.Key, leaf.KeyPEM)
	return leaf.Cert.SerialNumber
}

// serve accepts TLS connections with s's config and completes handshakes.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", s.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if conn.(*tls.Conn).Handshake() == nil {
					conn.Write([]byte("k")) // admitted
				}
			}()
		}
	}()
	return lis.Addr().String()
}

// dial handshakes as a client with cert (none if nil) trusting roots, and
// returns the server certificate's serial.
func dial(addr string, roots *testpki.CA, cert *tls.Certificate, version uint16) (*big.Int, error) {
	cfg := &tls.Config{RootCAs: roots.Pool(), ServerName: "infergate", MinVersion: version, MaxVersion: version}
	if cert != nil {
		// Sent whatever CAs the server asks for (Go's client would
		// otherwise keep a certificate of another CA to itself).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// TLS 1.3 clients finish before the server has checked their
	// certificate: a refusal arrives on the first read.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	// (n, EOF) when the byte and the server's close come together.
	if n, err := conn.Read(make([]byte, 1)); n != 1 {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func start(t *testing.T, f *fixture) (*Server, *testutil.Buffer) {
	t.Helper()
	logs := &testutil.Buffer{}
	s, err := New(f.files, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, logs
}

// Only clients with a certificate from the CA get through, over TLS 1.2
// and 1.3.
func TestClientCertificateRequired(t *testing.T) {
	f := newFixture(t)
	s, _ := start(t, f)
	addr := serve(t, s)
	good, other := f.ca.Client(t, "envoy").TLS(t), testpki.NewCA(t, "other CA").Client(t, "envoy").TLS(t)
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		if _, err := dial(addr, f.ca, &good, v); err != nil {
			t.Errorf("TLS %x with the CA's client certificate: %v", v, err)
		}
		if _, err := dial(addr, f.ca, nil, v); err == nil || !strings.Contains(err.Error(), "tls: ") {
			t.Errorf("TLS %x without a client certificate: %v, want a TLS alert", v, err)
		}
		if _, err := dial(addr, f.ca, &other, v); err == nil || !strings.Contains(err.Error(), "tls: unknown certificate authority") {
			t.Errorf("TLS %x with another CA's client certificate: %v, want a TLS alert", v, err)
		}
	}
	if _, err := dial(addr, f.ca, &good, tls.VersionTLS11); err == nil {
		t.Error("TLS 1.1: accepted")
	}
	if got := s.Config().GetConfigForClient; got == nil {
		t.Fatal("no GetConfigForClient")
	}
	if cfg, _ := s.Config().GetConfigForClient(nil); cfg.NextProtos[0] != "h2" || cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("handshake config: ALPN %v, client auth %v", cfg.NextProtos, cfg.ClientAuth)
	}
}

// A new certificate reaches new handshakes; a broken one (a key that does
// not match) is logged and the last good one stays; a new CA admits its
// clients and drops the old one's.
func TestReload(t *testing.T) {
	f := newFixture(t)
	s, logs := start(t, f)
	addr := serve(t, s)
	client := f.ca.Client(t, "envoy").TLS(t)
	first, err := dial(addr, f.ca, &client, tls.VersionTLS13)
	if err != nil {
		t.Fatal(err)
	}

	second := f.serverCert(t)
	waitServing(t, addr, f.ca, &client, second)

	// A certificate without its key: refused, the second pair stays.
	refused := s.Refused() // a poll between the two writes above may already count one
	testpki.WriteFile(t, f.files.Cert, f.ca.Server(t, "infergate").CertPEM)
	for deadline := time.Now().Add(5 * time.Second); s.Refused() == refused; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a certificate without its key was not refused")
		}
	}
	if !strings.Contains(logs.String(), "not reloaded") {
		t.Errorf("log lacks the refusal:\n%s", logs.String())
	}
	if got, err := dial(addr, f.ca, &client, tls.VersionTLS13); err != nil || got.Cmp(second) != 0 {
		t.Fatalf("after a mismatched pair: serial %v, %v; want the last good %v", got, err, second)
	}
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "certFile/keyFile") {
		t.Errorf("Health after a mismatched pair: %v", err)
	}
	if first.Cmp(second) == 0 {
		t.Fatal("serials do not differ")
	}

	// Rotate the client CA: the new CA's clients get in, the old one's not.
	next := testpki.NewCA(t, "next CA")
	third := f.serverCert(t)
	testpki.WriteFile(t, f.files.ClientCA, next.PEM)
	waitServing(t, addr, f.ca, ptr(next.Client(t, "envoy").TLS(t)), third)
	if err := s.Health(); err != nil {
		t.Errorf("Health after a good version: %v", err)
	}
	if _, err := dial(addr, f.ca, &client, tls.VersionTLS13); err == nil {
		t.Error("a client of the replaced CA is still admitted")
	}
}

func TestNewRefusesBrokenFiles(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(f.files.ClientCA, []byte("not PEM"), 0o600)
	if _, err := New(f.files, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "clientCAFile") {
		t.Errorf("CA without a certificate: %v", err)
	}
	f = newFixture(t)
	os.Remove(f.files.Key)
	if _, err := New(f.files, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "keyFile") {
		t.Errorf("missing key: %v", err)
	}
}

func waitServing(t *testing.T, addr string, roots *testpki.CA, client *tls.Certificate, want *big.Int) {
	t.Helper()
	var got *big.Int
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, err = dial(addr, roots, client, tls.VersionTLS13); err == nil && got.Cmp(want) == 0 {
			return
		}
	}
	t.Fatalf("server certificate %v (%v), want %v", got, err, want)
}

func ptr[T any](v T) *T { return &v }
