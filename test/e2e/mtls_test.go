package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// infergateName is the name envoy/snippet-mtls.yaml sends as SNI and
// expects in infergate's certificate.
const infergateName = "infergate.infergate.svc.cluster.local"

// snippetTLSDir is where envoy/snippet-mtls.yaml reads Envoy's files.
const snippetTLSDir = "/etc/envoy/infergate-tls/"

// mtlsFiles are infergate's (server) and Envoy's (client) files.
type mtlsFiles struct {
	ca                  *testpki.CA
	cert, key, clientCA string // infergate's extproc.tls
	envoyDir            string // tls.crt, tls.key, ca.crt for the snippet
}

func newMTLSFiles(t *testing.T) *mtlsFiles {
	dir := t.TempDir()
	f := &mtlsFiles{ca: testpki.NewCA(t, "infergate test CA"), cert: filepath.Join(dir, "tls.crt"),
		key: filepath.Join(dir, "tls.key"), clientCA: filepath.Join(dir, "ca.crt"), envoyDir: filepath.Join(dir, "envoy")}
	f.rotateServer(t)
	testpki.WriteFile(t, f.clientCA, f.ca.PEM)
	if err := os.Mkdir(f.envoyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	envoy := f.ca.Client(t, "envoy")
	testpki.WriteFile(t, filepath.Join(f.envoyDir, "tls.crt"), envoy.CertPEM)
	testpki.WriteFile(t, filepath.Join(f.envoyDir, "tls.key"), envoy.KeyPEM)
	testpki.WriteFile(t, filepath.Join(f.envoyDir, "ca.crt"), f.ca.PEM)
	return f
}

// rotateServer writes a new certificate and key for infergate and returns
// the certificate's serial.
func (f *mtlsFiles) rotateServer(t *testing.T) *big.Int {
	leaf := f.ca.Server(t, infergateName)
	testpki.WriteFile(t, f.cert, leaf.CertPEM)
	testpki.WriteFile(t, f.key, leaf.KeyPEM)
	return leaf.Cert.SerialNumber
}

func (f *mtlsFiles) config() string {
	return testConfig + fmt.Sprintf("extproc:\n  tls: {certFile: %q, keyFile: %q, clientCAFile: %q}\npolicy:\n  reloadInterval: 100ms\n",
		f.cert, f.key, f.clientCA)
}

// With extproc.tls, Envoy running envoy/snippet-mtls.yaml's cluster streams
// through the gate and the meter as before; a client without a certificate
// from the CA is refused at the handshake and records nothing; a rotated
// server certificate is what the next handshake sees.
func TestExtProcMTLS(t *testing.T) {
	t.Parallel()
	files := newMTLSFiles(t)
	s := startStackFor(t, "", func(*stack) string { return files.config() }, 1)
	s.Envoy = envoytest.Start(t, mtlsBootstrap(t, s, files.envoyDir))

	// Through Envoy: byte-exact and stamped.
	got := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 8, true, ""), nil)
	if got.Status != 200 {
		t.Fatalf("status %d through Envoy over mTLS: %s", got.Status, got.Body)
	}
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
		chatBody("pool-a", 8, true, `,"stream_options":{"include_usage":true}`), nil))
	if !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("body through the gateway differs from the direct body\n got: %q\nwant: %q", got.Body, want.Body)
	}
	if st := s.Gateway.stamp(t, got.RequestID); st.Pool != "pool-a" || !st.Complete || st.Decision != "allow" || st.CompletionTokens != 8 {
		t.Errorf("stamp over mTLS = %+v", st)
	}
	// Envoy did reach infergate over TLS (not some plaintext fallback).
	stats := get(t, s.Envoy.AdminURL+"/stats?filter=^cluster\\.infergate\\.ssl\\.(handshake|connection_error)$")
	if !strings.Contains(stats, "cluster.infergate.ssl.handshake: ") || strings.Contains(stats, "cluster.infergate.ssl.handshake: 0") ||
		!strings.Contains(stats, "cluster.infergate.ssl.connection_error: 0") {
		t.Errorf("Envoy's TLS stats for the infergate cluster:\n%s", stats)
	}

	// Straight at the port: only the CA's client certificate gets in. A
	// TLS 1.2 client ends its handshake after the server's check, so gRPC
	// reports the alert; a TLS 1.3 one ends first and gRPC may hit the
	// closed connection before it reads the alert, which a client reading
	// first (rawAlert) then sees.
	addr := s.Gateway.ExtProcAddr
	refused := map[string]*tls.Certificate{
		"no client certificate": nil,
		"another CA's client":   ptrTo(testpki.NewCA(t, "rogue CA").Client(t, "envoy").TLS(t)),
	}
	for name, cert := range refused {
		for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			id := fmt.Sprintf("forged-%s-%x", strings.ReplaceAll(name, " ", "-"), v)
			err := forgeMeterStream(t, addr, files.ca, cert, v, id)
			msg := fmt.Sprint(err)
			handshake := strings.Contains(msg, "authentication handshake failed: remote error: tls: ")
			if v == tls.VersionTLS13 {
				handshake = strings.Contains(msg, "remote error: tls: ") || strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset")
				if alert := rawAlert(addr, files.ca, cert); !strings.Contains(alert, "remote error: tls: ") {
					t.Errorf("%s, TLS 1.3 without gRPC: %s, want the server's TLS alert", name, alert)
				}
			}
			if status.Code(err) != codes.Unavailable || !handshake {
				t.Errorf("%s, TLS %x: %v, want Unavailable with the handshake refused", name, v, err)
			}
			t.Logf("%s, TLS %x: %v", name, v, err)
		}
	}
	// The control: the same forged stream with a good certificate is
	// stamped, so a refused one would have been.
	good := files.ca.Client(t, "envoy").TLS(t)
	if err := forgeMeterStream(t, addr, files.ca, &good, tls.VersionTLS13, "forged-admitted"); err != nil {
		t.Fatalf("forged stream with the CA's client certificate: %v", err)
	}
	s.Gateway.stamp(t, "forged-admitted")
	for _, st := range s.Gateway.stamps() {
		if strings.HasPrefix(st.RequestID, "forged-") && st.RequestID != "forged-admitted" {
			t.Errorf("a refused client's stream was stamped: %+v", st)
		}
	}

	// Rotation: the next handshake presents the new certificate, and Envoy
	// keeps streaming.
	first := serverSerial(t, addr, files.ca, good)
	second := files.rotateServer(t)
	if first.Cmp(second) == 0 {
		t.Fatal("rotation kept the serial")
	}
	deadline := time.Now().Add(5 * time.Second)
	for serverSerial(t, addr, files.ca, good).Cmp(second) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("new handshakes still see certificate %v after rotating to %v", first, second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-b", 4, true, ""), nil); r.Status != 200 {
		t.Errorf("after rotation: status %d: %s", r.Status, r.Body)
	}
}

// mtlsBootstrap is envoy/demo.yaml with envoy/snippet-mtls.yaml's infergate
// cluster (its endpoint and type from demo.yaml, its files in dir).
func mtlsBootstrap(t *testing.T, s *stack, dir string) string {
	t.Helper()
	rendered := renderEnvoy(t, "envoy/demo.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0",
		"EXTPROC_PORT": port(t, s.Gateway.ExtProcAddr), "POOL_A_PORT": port(t, s.PoolA.Addr), "POOL_B_PORT": port(t, s.PoolB.Addr),
		"JWKS_FILE": testIssuer(t).jwksPath, "XDS_PORT": port(t, s.Gateway.XDSAddr), "OTLP_PORT": otlpPort(t),
	})
	var boot map[string]any
	if err := yaml.Unmarshal([]byte(rendered), &boot); err != nil {
		t.Fatal(err)
	}
	mtls := snippetMTLSCluster(t)
	clusters := boot["static_resources"].(map[string]any)["clusters"].([]any)
	for i, c := range clusters {
		if c := c.(map[string]any); c["name"] == "infergate" {
			mtls["type"], mtls["load_assignment"] = c["type"], c["load_assignment"]
			clusters[i] = mtls
		}
	}
	out, err := yaml.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(out), snippetTLSDir, dir+"/")
}

func snippetMTLSCluster(t *testing.T) map[string]any {
	t.Helper()
	var snippet struct {
		Clusters []map[string]any `yaml:"clusters"`
	}
	readYAML(t, "envoy/snippet-mtls.yaml", &snippet)
	if len(snippet.Clusters) != 1 {
		t.Fatalf("envoy/snippet-mtls.yaml has %d clusters, want the infergate cluster", len(snippet.Clusters))
	}
	return snippet.Clusters[0]
}

// envoy/snippet-mtls.yaml is envoy/snippet.yaml's cluster plus TLS, and its
// names and files are the ones the test above runs.
func TestSnippetMTLSMatchesSnippet(t *testing.T) {
	t.Parallel()
	var plain struct {
		Clusters []map[string]any `yaml:"clusters"`
	}
	readYAML(t, "envoy/snippet.yaml", &plain)
	mtls := snippetMTLSCluster(t)
	ts, ok := mtls["transport_socket"].(map[string]any)
	if !ok || ts["name"] != "envoy.transport_sockets.tls" {
		t.Fatalf("transport_socket = %v", mtls["transport_socket"])
	}
	delete(mtls, "transport_socket")
	// Where each points differs: the plain snippet's infergate is on
	// loopback, the mTLS one's across the network, a Service by name.
	want := clusterNamed(plain.Clusters, "infergate")
	for _, c := range []map[string]any{mtls, want} {
		delete(c, "type")
		delete(c, "load_assignment")
	}
	if !reflect.DeepEqual(mtls, want) {
		t.Errorf("envoy/snippet-mtls.yaml's cluster differs from envoy/snippet.yaml's beyond transport_socket and address:\n%v\n%v", mtls, want)
	}
	b, _ := yaml.Marshal(ts)
	for _, want := range []string{"sni: " + infergateName, "exact: " + infergateName, "- h2", "TLSv1_2",
		snippetTLSDir + "tls.crt", snippetTLSDir + "tls.key", snippetTLSDir + "ca.crt"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("envoy/snippet-mtls.yaml's transport_socket lacks %q", want)
		}
	}
}

// forgeMeterStream dials the ext_proc port as a meter would and sends a
// whole forged response; nil means infergate took it.
func forgeMeterStream(t *testing.T, addr string, roots *testpki.CA, cert *tls.Certificate, version uint16, requestID string) error {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots.Pool(), ServerName: infergateName, MinVersion: version, MaxVersion: version}
	if cert != nil {
		// Sent whatever CAs the server asks for (Go's client would
		// otherwise keep a certificate of another CA to itself).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, request.RoleHeader, "meter")
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return err
	}
	headers := func(kv ...string) *corev3.HeaderMap {
		hm := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return hm
	}
	chunk := `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"forged"},"finish_reason":null}]}` + "\n\ndata: [DONE]\n\n"
	for _, msg := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headers(":path", "/v1/chat/completions", "x-request-id", requestID, request.ModelHeader, "pool-a")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headers(":status", "200", "content-type", "text/event-stream")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: true}}},
	} {
		msg.ObservabilityMode = true
		if err := stream.Send(msg); err != nil {
			_, err = stream.Recv() // the stream's real error
			return err
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	// An observability-mode stream gets no answer: it ends when the meter
	// has read everything.
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// rawAlert handshakes over TLS 1.3 and reads: what the server's refusal
// says, or "admitted".
func rawAlert(addr string, roots *testpki.CA, cert *tls.Certificate) string {
	cfg := &tls.Config{RootCAs: roots.Pool(), ServerName: infergateName, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err.Error()
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return err.Error()
	}
	return "admitted"
}

// serverSerial is the serial of the certificate a new handshake sees.
func serverSerial(t *testing.T, addr string, roots *testpki.CA, client tls.Certificate) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots.Pool(), ServerName: infergateName,
		Certificates: []tls.Certificate{client}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

func ptrTo[T any](v T) *T { return &v }
