package charts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestEnvoyGatewayTranslateMTLS runs Envoy Gateway's translator on the Envoy
// Gateway variant with extproc.tls: the BackendTLSPolicy is accepted, and
// Envoy's clusters for the ext_proc Service (and only they) get TLS that
// checks infergate's certificate for the Service's name, sends that name as
// SNI and presents the Gateway's client certificate
// (spec.tls.backend.clientCertificateRef, as the chart's NOTES ask).
func TestEnvoyGatewayTranslateMTLS(t *testing.T) {
	vals := readValues(t, filepath.Join(chartDir, "ci", "envoygateway-values.yaml"))
	vals["extproc"] = map[string]any{"tls": map[string]any{"enabled": true, "secretName": "infergate-extproc-tls"}}
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	ca, caKey := testCA(t)
	leafPEM, keyPEM := testLeaf(t, ca, caKey, "envoy")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	gateway := "spec:\n  gatewayClassName: eg\n"
	input := string(egInput(t, r))
	if !strings.Contains(input, gateway) {
		t.Fatal("egctl-fixture.yaml: Gateway spec not found")
	}
	input = strings.Replace(input, gateway, gateway+"  tls:\n    backend:\n      clientCertificateRef: {name: envoy-client}\n", 1)
	input += "\n---\n" + tlsSecret("llm", "infergate-extproc-tls", map[string][]byte{"ca.crt": caPEM, "tls.crt": leafPEM, "tls.key": keyPEM}) +
		"\n---\n" + tlsSecret("envoy-gateway-system", "envoy-client", map[string][]byte{"tls.crt": leafPEM, "tls.key": keyPEM})

	var status map[string]any
	if err := json.Unmarshal(runEgctl(t, []byte(input), "--to", "gateway-api", "-o", "json"), &status); err != nil {
		t.Fatal(err)
	}
	walk(status, func(m map[string]any) {
		conds, _ := m["conditions"].([]any)
		for _, c := range conds {
			c := c.(map[string]any)
			if c["status"] != "True" {
				t.Errorf("condition %v=%v: %v (%v)", c["type"], c["status"], c["message"], c["reason"])
			}
		}
	})
	if items, _ := status["backendTLSPolicies"].([]any); len(items) != 1 {
		t.Errorf("egctl reports %d backendTLSPolicies (keys: %v)", len(items), keys(status))
	}

	xdsJSON, err := yaml.YAMLToJSON(runEgctl(t, []byte(input), "--to", "xds", "-t", "cluster", "-o", "yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var xds any
	if err := json.Unmarshal(xdsJSON, &xds); err != nil {
		t.Fatal(err)
	}
	fqdn := releaseName + "." + namespace + ".svc.cluster.local"
	var tlsClusters []string
	walk(xds, func(m map[string]any) {
		if m["@type"] != "type.googleapis.com/envoy.config.cluster.v3.Cluster" {
			return
		}
		// Envoy Gateway puts the TLS socket in transportSocketMatches (its
		// endpoints carry the match), with a placeholder as the default.
		var sockets []map[string]any
		walk(m, func(n map[string]any) {
			if tc, ok := n["typedConfig"].(map[string]any); ok && n["name"] == "envoy.transport_sockets.tls" {
				sockets = append(sockets, tc)
			}
		})
		if len(sockets) == 0 {
			return
		}
		tlsClusters = append(tlsClusters, fmt.Sprint(m["name"]))
		b, _ := json.Marshal(sockets[0])
		ctx := string(b)
		for _, want := range []string{`"sni":"` + fqdn + `"`, `"exact":"` + fqdn + `"`, `"tlsCertificateSdsSecretConfigs":[{`,
			`"tlsMinimumProtocolVersion":"TLSv1_2"`} {
			if !strings.Contains(ctx, want) {
				t.Errorf("cluster %v: UpstreamTlsContext lacks %s:\n%s", m["name"], want, ctx)
			}
		}
	})
	// One cluster per filter (the gate's and the meter's); the pools stay
	// as they were.
	slices.Sort(tlsClusters)
	if len(tlsClusters) != 2 || !strings.HasSuffix(tlsClusters[0], "/extproc/0") || !strings.HasSuffix(tlsClusters[1], "/extproc/1") {
		t.Errorf("clusters with TLS: %v, want the two ext_proc ones alone", tlsClusters)
	}
}

func tlsSecret(ns, name string, data map[string][]byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Secret\nmetadata: {name: %s, namespace: %s}\ntype: kubernetes.io/tls\ndata:\n", name, ns)
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if v, ok := data[k]; ok {
			fmt.Fprintf(&b, "  %s: %s\n", k, base64.StdEncoding.EncodeToString(v))
		}
	}
	return b.String()
}

func testCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return ca, key
}

func testLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k})
}
