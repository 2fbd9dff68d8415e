package tlsreload

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/testpki"
	"github.com/infergate/infergate/internal/testutil/vtime"
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
	conn, err := tls.Dial("tcp", addr, clientConfig(roots, cert, version))
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

// clientConfig trusts roots and presents cert (none if nil), at version.
func clientConfig(roots *testpki.CA, cert *tls.Certificate, version uint16) *tls.Config {
	cfg := &tls.Config{RootCAs: roots.Pool(), ServerName: "infergate", MinVersion: version, MaxVersion: version}
	if cert != nil {
		// Sent whatever CAs the server asks for (Go's client would
		// otherwise keep a certificate of another CA to itself).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
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
// clients and drops the old one's. In virtual time (testing/synctest),
// over in-memory connections: each change is written between two checks,
// still unseen just before the next one and in force right after it.
func TestReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = time.Second
		f := newFixture(t)
		logs := &testutil.Buffer{}
		s, err := New(f.files, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { s.Run(ctx, every); close(done) }()
		defer func() { cancel(); <-done }()
		vtime.Advance(every / 2) // act between checks, at k+0.5s
		// untilCheck waits until just before the next check, and check
		// until just after it.
		untilCheck := func() { vtime.Advance(every/2 - time.Nanosecond) }
		check := func() { vtime.Advance(time.Nanosecond) }
		client := f.ca.Client(t, "envoy").TLS(t)
		serving := func(roots *testpki.CA, client *tls.Certificate) *big.Int {
			t.Helper()
			got, err := handshake(s, roots, client, tls.VersionTLS13)
			if err != nil {
				t.Fatalf("at %v: %v", time.Now().Format(time.StampMilli), err)
			}
			return got
		}
		first := serving(f.ca, &client)

		second := f.serverCert(t)
		untilCheck()
		if got := serving(f.ca, &client); got.Cmp(first) != 0 {
			t.Fatalf("before the check: serving %v, want the first certificate %v", got, first)
		}
		check()
		if got := serving(f.ca, &client); got.Cmp(second) != 0 {
			t.Fatalf("after the check: serving %v, want the second certificate %v", got, second)
		}
		if first.Cmp(second) == 0 {
			t.Fatal("serials do not differ")
		}

		// A certificate without its key: refused, once, the second pair stays.
		vtime.Advance(every / 2)
		testpki.WriteFile(t, f.files.Cert, f.ca.Server(t, "infergate").CertPEM)
		untilCheck()
		if n := s.Refused(); n != 0 {
			t.Fatalf("before the check: %d refused", n)
		}
		check()
		if n := s.Refused(); n != 1 {
			t.Fatalf("after the check: %d refused, want 1", n)
		}
		if !strings.Contains(logs.String(), "not reloaded") {
			t.Errorf("log lacks the refusal:\n%s", logs.String())
		}
		if got := serving(f.ca, &client); got.Cmp(second) != 0 {
			t.Fatalf("after a mismatched pair: serial %v; want the last good %v", got, second)
		}
		if err := s.Health(); err == nil || !strings.Contains(err.Error(), "certFile/keyFile") {
			t.Errorf("Health after a mismatched pair: %v", err)
		}
		vtime.Advance(5 * every)
		if n := s.Refused(); n != 1 {
			t.Fatalf("5 checks later: %d refused, want 1 (a refused version is not retried)", n)
		}

		// Rotate the client CA: the new CA's clients get in, the old one's not.
		vtime.Advance(every / 2)
		next := testpki.NewCA(t, "next CA")
		third := f.serverCert(t)
		testpki.WriteFile(t, f.files.ClientCA, next.PEM)
		nextClient := next.Client(t, "envoy").TLS(t)
		untilCheck()
		if _, err := handshake(s, f.ca, &nextClient, tls.VersionTLS13); err == nil {
			t.Fatal("before the check: a client of the next CA is admitted")
		}
		check()
		if got := serving(f.ca, &nextClient); got.Cmp(third) != 0 {
			t.Fatalf("after the check: serving %v, want the third certificate %v", got, third)
		}
		if err := s.Health(); err != nil {
			t.Errorf("Health after a good version: %v", err)
		}
		if _, err := handshake(s, f.ca, &client, tls.VersionTLS13); err == nil {
			t.Error("a client of the replaced CA is still admitted")
		}
	})
}

// handshake is dial over an in-memory connection to a server with s's
// config, so that it runs in virtual time.
func handshake(s *Server, roots *testpki.CA, cert *tls.Certificate, version uint16) (*big.Int, error) {
	c, srv := net.Pipe()
	defer c.Close()
	go func() {
		conn := tls.Server(srv, s.Config())
		defer conn.Close()
		if conn.Handshake() == nil {
			conn.Write([]byte("k")) // admitted
		}
	}()
	conn := tls.Client(c, clientConfig(roots, cert, version))
	if n, err := conn.Read(make([]byte, 1)); n != 1 {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
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
