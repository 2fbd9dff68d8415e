package e2e

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// issuer is a test JWT issuer whose JWKS Envoy's jwt_authn trusts.
type issuer struct {
	key      *rsa.PrivateKey
	jwksPath string
}

var (
	issuerOnce sync.Once
	theIssuer  *issuer
	issuerErr  error
)

// testIssuer makes one RSA key per test binary and writes its JWKS.
func testIssuer(t *testing.T) *issuer {
	t.Helper()
	issuerOnce.Do(func() {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			issuerErr = err
			return
		}
		dir, err := os.MkdirTemp("", "infergate-jwks")
		if err != nil {
			issuerErr = err
			return
		}
		jwks, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{
			"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "test",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
		}}})
		path := filepath.Join(dir, "jwks.json")
		issuerErr = os.WriteFile(path, jwks, 0o644)
		theIssuer = &issuer{key: key, jwksPath: path}
	})
	if issuerErr != nil {
		t.Fatal(issuerErr)
	}
	return theIssuer
}

// sign returns an RS256 JWT for the demo provider (issuer and audience of
// envoy/demo.yaml) with the given extra claims.
func (i *issuer) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	all := map[string]any{
		"iss": "https://issuer.infergate.example", "aud": "infergate",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}
	for k, v := range claims {
		all[k] = v
	}
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "test"})
	payload, _ := json.Marshal(all)
	signing := b64(header) + "." + b64(payload)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, i.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + b64(sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
