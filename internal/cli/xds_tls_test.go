package cli

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// xds.tls serves the virtual-model routes over mTLS: a client with a
// certificate the CA signed gets them; one without, or in plaintext, does
// not.
func TestXDSOverMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "infergate test CA")
	server, client := ca.Server(t, "infergate"), ca.Client(t, "envoy")
	for name, b := range map[string][]byte{"tls.crt": server.CertPEM, "tls.key": server.KeyPEM, "ca.crt": ca.PEM} {
		testpki.WriteFile(t, filepath.Join(dir, name), b)
	}
	cfg, err := config.Parse([]byte(`
xds:
  listen: ":18000"
  tls: {certFile: ` + filepath.Join(dir, "tls.crt") + `, keyFile: ` + filepath.Join(dir, "tls.key") + `, clientCAFile: ` + filepath.Join(dir, "ca.crt") + `}
virtualModels:
- name: llama
  pools: [{cluster: pool-a}, {cluster: pool-b, priority: 1}]
`))
	if err != nil {
		t.Fatal(err)
	}
	_, _, xl := serveService(t, cfg, true)

	routes := func(creds credentials.TransportCredentials) (*discoveryv3.DiscoveryResponse, error) {
		conn, err := grpc.NewClient(xl.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := routeservice.NewRouteDiscoveryServiceClient(conn).StreamRoutes(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "test"},
			TypeUrl: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", ResourceNames: []string{cfg.XDS.RouteConfigName}}); err != nil {
			return nil, err
		}
		return stream.Recv()
	}
	trusted := &tls.Config{RootCAs: ca.Pool(), ServerName: "infergate", MinVersion: tls.VersionTLS12}
	withCert := trusted.Clone()
	withCert.Certificates = []tls.Certificate{client.TLS(t)}
	resp, err := routes(credentials.NewTLS(withCert))
	if err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("routes with a client certificate: %v, %v", resp, err)
	}
	if _, err := routes(credentials.NewTLS(trusted)); err == nil {
		t.Error("routes without a client certificate were served")
	}
	if _, err := routes(insecure.NewCredentials()); err == nil {
		t.Error("routes were served in plaintext")
	}
}

// serveService runs the Service of cfg on loopback listeners (an xDS one
// when xds) until the test ends; it returns the Service and its admin and
// xDS listeners.
func serveService(t *testing.T, cfg *config.Config, xds bool) (svc *Service, admin, xdsLis net.Listener) {
	t.Helper()
	ledgerInTemp(t, cfg)
	svc, err := NewService(cfg, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	extproc, admin := listen(), listen()
	if xds {
		xdsLis = listen()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, extproc, admin, xdsLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return svc, admin, xdsLis
}

// ledgerInTemp moves the embedded ledger of cfg, at its default path, to
// a file of the test's own (one process per file).
func ledgerInTemp(t *testing.T, cfg *config.Config) {
	t.Helper()
	if cfg.RateLimit.Embedded.Path == config.DefaultLedgerPath {
		cfg.RateLimit.Embedded.Path = filepath.Join(t.TempDir(), "ledger.db")
	}
}
