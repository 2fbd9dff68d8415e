// Package identity tells the gate who is calling: an API key looked up by
// its hash, or the claims of a JWT that Envoy's jwt_authn filter verified.
// Keys are never stored, logged or returned; only their SHA-256 is kept.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"gopkg.in/yaml.v3"
)

// Principal is an authenticated caller.
type Principal struct {
	ID     string            // key id or JWT subject: safe to log
	Type   string            // "api_key", "jwt" or "anonymous"
	Tenant string            // whose budget it spends
	Labels map[string]string // e.g. tier
	Claims map[string]any    // verified JWT claims
}

// Anonymous is the principal of a request without credentials.
var Anonymous = Principal{Type: "anonymous"}

// Errors the gate maps to 401.
var (
	ErrMissing = errors.New("no credentials: send Authorization: Bearer <key> or x-api-key")
	ErrUnknown = errors.New("invalid API key")
)

// KeyFile is the format of a keys file (YAML or JSON):
//
//	keys:
//	- id: acme-prod            # shown in logs and stamps instead of the key
//	  sha256: 9f86d08...       # hex SHA-256 of the key: `printf %s "$KEY" | sha256sum`
//	  tenant: acme
//	  labels: {tier: premium}
type KeyFile struct {
	Keys []KeyEntry `yaml:"keys"`
}

// KeyEntry is one API key.
type KeyEntry struct {
	ID     string            `yaml:"id"`
	SHA256 string            `yaml:"sha256"`
	Tenant string            `yaml:"tenant"`
	Labels map[string]string `yaml:"labels"`
}

// Keys is an immutable set of API keys by hash.
type Keys struct {
	byHash map[[sha256.Size]byte]*Principal
}

// LoadKeys reads a keys file, or every *.yaml, *.yml and *.json file in a
// directory (a Kubernetes Secret mounted as a volume).
func LoadKeys(path string) (*Keys, error) {
	files := []string{path}
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if st.IsDir() {
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			// Secret mounts hold ..data symlinks and dot-dirs; skip them.
			if strings.HasPrefix(e.Name(), ".") || e.IsDir() {
				continue
			}
			switch filepath.Ext(e.Name()) {
			case ".yaml", ".yml", ".json":
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
	}
	k := &Keys{byHash: map[[sha256.Size]byte]*Principal{}}
	ids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var kf KeyFile
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(&kf); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for i, e := range kf.Keys {
			where := fmt.Sprintf("%s: keys[%d]", f, i)
			if e.ID == "" || e.Tenant == "" {
				return nil, fmt.Errorf("%s: id and tenant are required", where)
			}
			raw, err := hex.DecodeString(e.SHA256)
			if err != nil || len(raw) != sha256.Size {
				return nil, fmt.Errorf("%s (%s): sha256 must be 64 hex digits", where, e.ID)
			}
			if prev, dup := ids[e.ID]; dup {
				return nil, fmt.Errorf("%s: id %q already defined in %s", where, e.ID, prev)
			}
			ids[e.ID] = f
			var h [sha256.Size]byte
			copy(h[:], raw)
			if _, dup := k.byHash[h]; dup {
				return nil, fmt.Errorf("%s (%s): the same key is listed twice", where, e.ID)
			}
			k.byHash[h] = &Principal{ID: e.ID, Type: "api_key", Tenant: e.Tenant, Labels: e.Labels}
		}
	}
	return k, nil
}

// Len is the number of keys.
func (k *Keys) Len() int { return len(k.byHash) }

// Lookup finds the principal of a presented key. Only the hash is compared,
// so lookup time does not depend on how much of a guess was right.
func (k *Keys) Lookup(key string) (*Principal, bool) {
	p, ok := k.byHash[sha256.Sum256([]byte(key))]
	return p, ok
}

// KeyFromHeaders extracts an API key from Authorization: Bearer or x-api-key.
func KeyFromHeaders(authorization, apiKey string) string {
	if apiKey != "" {
		return strings.TrimSpace(apiKey)
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if ok && strings.EqualFold(scheme, "bearer") {
		return strings.TrimSpace(token)
	}
	return ""
}

// KeySet is a reloadable *Keys.
type KeySet struct{ p atomic.Pointer[Keys] }

// Load returns the current keys.
func (s *KeySet) Load() *Keys { return s.p.Load() }

// Store swaps in new keys.
func (s *KeySet) Store(k *Keys) { s.p.Store(k) }

// JWTConfig says where the verified claims are and which ones matter.
type JWTConfig struct {
	Namespace   string   // dynamic metadata namespace, envoy.filters.http.jwt_authn
	PayloadKey  string   // jwt_authn's payload_in_metadata, e.g. jwt_payload
	TenantClaim string   // claim naming the tenant
	LabelClaims []string // claims copied into labels
}

// FromClaims builds a principal from verified JWT claims.
func FromClaims(c JWTConfig, claims map[string]any) Principal {
	p := Principal{Type: "jwt", Claims: claims, Labels: map[string]string{}}
	p.ID, _ = claims["sub"].(string)
	p.Tenant, _ = claims[c.TenantClaim].(string)
	for _, name := range c.LabelClaims {
		if v, ok := claims[name].(string); ok {
			p.Labels[name] = v
		}
	}
	return p
}
