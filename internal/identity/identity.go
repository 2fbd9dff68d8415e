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
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/price"
)

// Principal is an authenticated caller.
type Principal struct {
	ID     string            // key id or JWT subject: safe to log
	Type   string            // "api_key", "jwt" or "anonymous"
	Tenant string            // whose budget it spends
	Labels map[string]string // e.g. tier
	Claims map[string]any    // verified JWT claims
	// BudgetMonth is an API key's own monthly budget (its entry's
	// budgetMonth) in pico-units of the prices' currency; 0: none.
	BudgetMonth int64
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
//	  name: search backend     # optional, and so is the rest: what the key is for
//	  owner: alice@acme.example  # who holds it
//	  created: 2026-12-01T09:00:00Z
//	  expires: 2026-12-31T09:00:00Z  # refused from then on
//	  revoked: 2026-12-02T10:00:00Z  # refused from then on
//	  rotatedTo: acme-7f3a9c01       # the key that replaced this one
//	  budgetMonth: "500"             # the key's own budget per calendar month, in the prices' currency
//
// `infergate keys create|list|revoke|rotate` writes these entries.
type KeyFile struct {
	Keys []KeyEntry `yaml:"keys"`
}

// KeyEntry is one API key.
type KeyEntry struct {
	ID     string            `yaml:"id" json:"id"`
	SHA256 string            `yaml:"sha256" json:"-"`
	Tenant string            `yaml:"tenant" json:"tenant"`
	Labels map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	// Name says what the key is for and Owner who holds it: shown beside
	// the id (keys list, the spend page), at most MaxText bytes each.
	Name      string     `yaml:"name,omitempty" json:"name,omitempty"`
	Owner     string     `yaml:"owner,omitempty" json:"owner,omitempty"`
	Created   *time.Time `yaml:"created,omitempty" json:"created,omitempty"`
	Expires   *time.Time `yaml:"expires,omitempty" json:"expires,omitempty"`
	Revoked   *time.Time `yaml:"revoked,omitempty" json:"revoked,omitempty"`
	RotatedTo string     `yaml:"rotatedTo,omitempty" json:"rotatedTo,omitempty"`
	// BudgetMonth is the key's own budget per calendar month (UTC), a
	// decimal amount of the prices' currency ("500", "12.50"): the policy
	// reads it as input.principal.budget_month and may apply it.
	BudgetMonth string `yaml:"budgetMonth,omitempty" json:"budgetMonth,omitempty"`
}

// Keys is an immutable set of API keys by hash.
type Keys struct {
	byHash map[[sha256.Size]byte]*keyState
	byID   map[string]*keyState
}

// keyState is a loaded key: who it makes the caller, until when, and when
// it was last used.
type keyState struct {
	principal Principal
	entry     KeyEntry // SHA256 cleared
	// lastUsed is Unix seconds, 0 never (since this process started). A
	// reload hands the same counter to the key of the same id, so it
	// survives reloads; it is in memory only: see KeyStatus.
	lastUsed *atomic.Int64
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
	k := newKeys()
	ids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := k.add(f, b, ids); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func newKeys() *Keys {
	return &Keys{byHash: map[[sha256.Size]byte]*keyState{}, byID: map[string]*keyState{}}
}

// add checks and adds the keys of file f, its content b; ids are the
// files the ids seen so far came from.
func (k *Keys) add(f string, b []byte, ids map[string]string) error {
	kf, err := parseKeyFile(f, b)
	if err != nil {
		return err
	}
	for i, e := range kf.Keys {
		where := fmt.Sprintf("%s: keys[%d]", f, i)
		if e.ID == "" || e.Tenant == "" {
			return fmt.Errorf("%s: id and tenant are required", where)
		}
		raw, err := hex.DecodeString(e.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return fmt.Errorf("%s (%s): sha256 must be 64 hex digits", where, e.ID)
		}
		if err := checkText("name", e.Name); err != nil {
			return fmt.Errorf("%s (%s): %w", where, e.ID, err)
		}
		if err := checkText("owner", e.Owner); err != nil {
			return fmt.Errorf("%s (%s): %w", where, e.ID, err)
		}
		if prev, dup := ids[e.ID]; dup {
			return fmt.Errorf("%s: id %q already defined in %s", where, e.ID, prev)
		}
		ids[e.ID] = f
		var h [sha256.Size]byte
		copy(h[:], raw)
		if _, dup := k.byHash[h]; dup {
			return fmt.Errorf("%s (%s): the same key is listed twice", where, e.ID)
		}
		var budget int64
		if e.BudgetMonth != "" {
			if budget, err = price.ParseAmount(e.BudgetMonth); err != nil {
				return fmt.Errorf("%s (%s): budgetMonth: %w", where, e.ID, err)
			}
		}
		e.SHA256 = ""
		st := &keyState{principal: Principal{ID: e.ID, Type: "api_key", Tenant: e.Tenant, Labels: e.Labels, BudgetMonth: budget},
			entry: e, lastUsed: new(atomic.Int64)}
		k.byHash[h], k.byID[e.ID] = st, st
	}
	return nil
}

// MaxText bounds a key's name and owner, in bytes.
const MaxText = 128

// checkText refuses a name or owner a page or a table could not show as
// one line: longer than MaxText, invalid UTF-8, or with a control
// character.
func checkText(field, s string) error {
	switch {
	case len(s) > MaxText:
		return fmt.Errorf("%s: longer than %d bytes", field, MaxText)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s: not valid UTF-8", field)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%s: %q has a control character", field, s)
	}
	return nil
}

// CheckText is checkText for a command that writes a keys file: the
// error names the flag.
func CheckText(field, s string) error { return checkText(field, s) }

// parseKeyFile decodes a keys file strictly (an unknown field, such as a
// plaintext key, is an error that does not repeat it).
func parseKeyFile(f string, b []byte) (KeyFile, error) {
	var kf KeyFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&kf); err != nil && !errors.Is(err, io.EOF) {
		return kf, fmt.Errorf("%s: %w", f, err)
	}
	return kf, nil
}

// Len is the number of keys.
func (k *Keys) Len() int { return len(k.byHash) }

// Authenticate finds the principal of a presented key and refuses it from
// its expiry or revocation on, as read from now (the gate's clock), with
// an error wrapping ErrUnknown that says which and when (the caller holds
// the key, so naming its id tells them nothing new). Only the hash is
// compared, so lookup time does not depend on how much of a guess was
// right. An accepted key's last use is noted: one atomic store a second
// at most, never a write to a file or a store.
func (k *Keys) Authenticate(key string, now time.Time) (*Principal, error) {
	st, ok := k.byHash[sha256.Sum256([]byte(key))]
	if !ok {
		return nil, ErrUnknown
	}
	e := &st.entry
	switch {
	case e.Revoked != nil && !now.Before(*e.Revoked):
		return nil, fmt.Errorf("%w: key %s was revoked at %s", ErrUnknown, e.ID, stamp(*e.Revoked))
	case e.Expires != nil && !now.Before(*e.Expires) && e.RotatedTo != "":
		return nil, fmt.Errorf("%w: key %s expired at %s (rotated: its successor is key %s)", ErrUnknown, e.ID, stamp(*e.Expires), e.RotatedTo)
	case e.Expires != nil && !now.Before(*e.Expires):
		return nil, fmt.Errorf("%w: key %s expired at %s", ErrUnknown, e.ID, stamp(*e.Expires))
	}
	if sec := now.Unix(); st.lastUsed.Load() != sec { // no shared write per request
		st.lastUsed.Store(sec)
	}
	return &st.principal, nil
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// KeyStatus is what may be shown of a loaded key: never the key nor its
// hash.
type KeyStatus struct {
	KeyEntry
	// LastUsed is the last second this process accepted the key (nil:
	// not since it started). In memory only, so that a request never
	// writes: each replica knows its own, and `infergate keys list
	// --admin` takes the latest over the replicas it is given.
	LastUsed *time.Time `json:"lastUsed,omitempty"`
}

// Label is the label name of the key of id ("" when it has none, or no
// key has that id).
func (k *Keys) Label(id, name string) string {
	if st, ok := k.byID[id]; ok {
		return st.entry.Labels[name]
	}
	return ""
}

// Entry is the entry of the key of id (its hash cleared).
func (k *Keys) Entry(id string) (KeyEntry, bool) {
	if st, ok := k.byID[id]; ok {
		return st.entry, true
	}
	return KeyEntry{}, false
}

// Status lists the keys by id.
func (k *Keys) Status() []KeyStatus {
	out := make([]KeyStatus, 0, len(k.byID))
	for _, st := range k.byID {
		s := KeyStatus{KeyEntry: st.entry}
		if sec := st.lastUsed.Load(); sec != 0 {
			t := time.Unix(sec, 0).UTC()
			s.LastUsed = &t
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
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

// Store swaps in new keys. A key keeping its id keeps its last use: k
// takes the counters of the keys it replaces (the set stays bounded by the
// keys file; a removed id's is dropped).
func (s *KeySet) Store(k *Keys) {
	if old := s.p.Load(); old != nil {
		for id, st := range k.byID {
			if prev, ok := old.byID[id]; ok {
				st.lastUsed = prev.lastUsed
			}
		}
	}
	s.p.Store(k)
}

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
