// Package testpki issues throwaway certificates for tests: a CA, server and
// client certificates signed by it, as PEM files or tls.Certificates.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"testing"
	"time"
)

// CA is a certificate authority valid for a day.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte
	key  *ecdsa.PrivateKey
}

// Leaf is a certificate the CA signed, with its key.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, PEM: pemBlock("CERTIFICATE", der), key: key}
}

// Server issues a server certificate for the DNS names (the first is also
// its common name).
func (ca *CA) Server(t testing.TB, dnsNames ...string) Leaf {
	t.Helper()
	return ca.issue(t, dnsNames, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate named name.
func (ca *CA) Client(t testing.TB, name string) Leaf {
	t.Helper()
	return ca.issue(t, []string{name}, x509.ExtKeyUsageClientAuth)
}

// Workload issues a certificate as a service mesh issues a workload's: its
// identity as the one URI SAN (a SPIFFE ID), for both ends of mutual TLS,
// with the DNS names a client may verify it by.
func (ca *CA) Workload(t testing.TB, spiffeID string, dnsNames ...string) Leaf {
	t.Helper()
	id, err := url.Parse(spiffeID)
	if err != nil || id.Scheme != "spiffe" {
		t.Fatalf("testpki: %q is not a SPIFFE ID", spiffeID)
	}
	return ca.sign(t, dnsNames, func(c *x509.Certificate) {
		c.URIs = []*url.URL{id}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	})
}

// Pool is a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func (ca *CA) issue(t testing.TB, names []string, usage x509.ExtKeyUsage) Leaf {
	return ca.sign(t, names, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{usage} })
}

// sign issues a leaf for the DNS names (the first, if any, is also its
// common name), as set adjusts it.
func (ca *CA) sign(t testing.TB, names []string, set func(*x509.Certificate)) Leaf {
	key := newKey(t)
	cn := ""
	if len(names) > 0 {
		cn = names[0]
	}
	tmpl := template(t, cn)
	tmpl.DNSNames, tmpl.KeyUsage = names, x509.KeyUsageDigitalSignature
	set(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("EC PRIVATE KEY", k)}
}

// TLS is the leaf as a tls.Certificate.
func (l Leaf) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteFile replaces path the way a Secret update or an editor does: a new
// file renamed over the old one, with a later modification time so that a
// poller sees the change even within the file system's time resolution.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(tmp, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func template(t testing.TB, name string) *x509.Certificate {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatal(err)
	}
	return &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
