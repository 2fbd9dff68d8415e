package cli

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// gatewayExtension serves Envoy Gateway's extension hooks on xds.listen,
// over its mTLS, in the single mode without virtual models (nothing else
// there needs the xDS listener).
func TestGatewayExtensionOnTheXDSListener(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "infergate test CA")
	server, client := ca.Server(t, "infergate"), ca.Client(t, "envoy-gateway")
	for name, b := range map[string][]byte{"tls.crt": server.CertPEM, "tls.key": server.KeyPEM, "ca.crt": ca.PEM} {
		testpki.WriteFile(t, filepath.Join(dir, name), b)
	}
	// The extension reads HTTPRoutes from the cluster KUBECONFIG names; this
	// test's hook reads none.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	cfg, err := config.Parse([]byte(`
xds:
  listen: ":18000"
  tls: {certFile: ` + filepath.Join(dir, "tls.crt") + `, keyFile: ` + filepath.Join(dir, "tls.key") + `, clientCAFile: ` + filepath.Join(dir, "ca.crt") + `}
gatewayExtension:
  enabled: true
  policy: {namespace: llm, name: infergate}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, _, xl := serveService(t, cfg, true)

	call := func(tc *tls.Config) (*pb.PostRouteModifyResponse, error) {
		conn, err := grpc.NewClient(xl.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pb.NewEnvoyGatewayExtensionClient(conn).PostRouteModify(ctx, &pb.PostRouteModifyRequest{Route: &routev3.Route{Name: "r"}})
	}
	trusted := &tls.Config{RootCAs: ca.Pool(), ServerName: "infergate", MinVersion: tls.VersionTLS12}
	withCert := trusted.Clone()
	withCert.Certificates = []tls.Certificate{client.TLS(t)}
	resp, err := call(withCert)
	if err != nil || resp.GetRoute().GetName() != "r" {
		t.Fatalf("PostRouteModify with a client certificate: %v, %v", resp, err)
	}
	if _, err := call(trusted); err == nil {
		t.Error("the extension answered a client without a certificate")
	}
}
