// Package tlsreload serves TLS with client certificates (mTLS) from files
// that are reloaded when they change: a certificate, its key and the CA
// client certificates must chain to. New handshakes get the files' current
// version; established connections keep the one they started with. A new
// version that does not load never replaces a good one.
package tlsreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/internal/watch"
)

// Files names the PEM files served.
type Files struct {
	Cert     string // the server's certificate chain
	Key      string // its private key
	ClientCA string // the CA certificates a client's certificate must chain to
}

// Server holds the last good version of the files.
type Server struct {
	files   Files
	log     *slog.Logger
	current atomic.Pointer[tls.Config]
	last    string // fingerprint of the files current was loaded from
	refused atomic.Int64
	lastErr atomic.Pointer[error] // of the newest version, nil once one loads
}

// New loads the files; it fails if they do not make a usable pair and CA,
// so that a broken configuration fails at start.
func New(files Files, logger *slog.Logger) (*Server, error) {
	s := &Server{files: files, log: logger}
	// Fingerprint first: a change made while loading is seen by Run.
	s.last, _ = s.fingerprint()
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Config is the tls.Config to serve with: every handshake takes the
// current version of the files.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current.Load(), nil
		},
	}
}

// Run checks the files every interval until ctx is done and reloads them
// when they change. A version that does not load is logged once and kept
// out until the files change again (a certificate written before its key
// loads at the next check).
func (s *Server) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp, err := s.fingerprint()
		if fp == s.last {
			continue
		}
		s.last = fp
		if err == nil {
			err = s.reload()
		}
		if err != nil {
			s.refused.Add(1)
			s.lastErr.Store(&err)
			s.log.Error("extproc TLS files not reloaded; serving the previous certificate", "err", err)
		}
	}
}

// Health is why the newest version of the files was refused (the previous
// one still serves), or nil: for /healthz.
func (s *Server) Health() error {
	if err := s.lastErr.Load(); err != nil {
		return *err
	}
	return nil
}

// Refused counts the versions refused so far: for
// infergate_reload_errors_total.
func (s *Server) Refused() int64 { return s.refused.Load() }

// fingerprint summarises the three files (sizes and modification times,
// following links, as Kubernetes Secret volumes need).
func (s *Server) fingerprint() (string, error) {
	var parts []string
	var errs []error
	for _, path := range []string{s.files.Cert, s.files.Key, s.files.ClientCA} {
		fp, err := watch.Fingerprint(path, nil)
		parts = append(parts, fp)
		errs = append(errs, err)
	}
	return strings.Join(parts, ","), errors.Join(errs...)
}

func (s *Server) reload() error {
	cfg, leaf, err := load(s.files)
	if err != nil {
		return err
	}
	s.current.Store(cfg)
	s.lastErr.Store(nil)
	s.log.Info("extproc TLS certificate loaded", "subject", leaf.Subject.String(), "dns_names", leaf.DNSNames,
		"not_after", leaf.NotAfter.UTC().Format(time.RFC3339), "client_ca", s.files.ClientCA)
	return nil
}

// load reads the files into the config of one handshake.
func load(f Files) (*tls.Config, *x509.Certificate, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("extproc.tls certFile/keyFile: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("extproc.tls certFile: %w", err)
	}
	pem, err := os.ReadFile(f.ClientCA)
	if err != nil {
		return nil, nil, fmt.Errorf("extproc.tls clientCAFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("extproc.tls clientCAFile: %s holds no PEM certificate", f.ClientCA)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
		// gRPC over HTTP/2: Envoy's upstream TLS offers h2, and grpc-go
		// refuses a connection that negotiated no protocol.
		NextProtos: []string{"h2"},
	}, leaf, nil
}
