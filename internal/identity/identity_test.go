package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func TestLoadKeysFileAndSecretMount(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("keys:\n- {id: a, sha256: "+hash("sk-a")+", tenant: acme, labels: {tier: premium}}\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "b.json"), []byte(`{"keys":[{"id":"b","sha256":"`+hash("sk-b")+`","tenant":"globex"}]}`), 0o600)
	os.MkdirAll(filepath.Join(dir, "..data"), 0o700) // what a Secret mount looks like
	os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte("not: [valid"), 0o600)
	keys, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if keys.Len() != 2 {
		t.Fatalf("%d keys", keys.Len())
	}
	p, err := keys.Authenticate("sk-a", time.Now())
	if err != nil || p.ID != "a" || p.Tenant != "acme" || p.Labels["tier"] != "premium" || p.Type != "api_key" {
		t.Errorf("sk-a = %+v %v", p, err)
	}
	if _, err := keys.Authenticate("sk-c", time.Now()); !errors.Is(err, ErrUnknown) {
		t.Error("an unknown key was found")
	}
	single, err := LoadKeys(filepath.Join(dir, "b.json"))
	if err != nil || single.Len() != 1 {
		t.Errorf("single file: %v %v", single, err)
	}
}

func TestLoadKeysErrors(t *testing.T) {
	for name, body := range map[string]string{
		"bad hash":      "keys:\n- {id: a, sha256: abc, tenant: t}\n",
		"no tenant":     "keys:\n- {id: a, sha256: " + hash("k") + "}\n",
		"duplicate id":  "keys:\n- {id: a, sha256: " + hash("k1") + ", tenant: t}\n- {id: a, sha256: " + hash("k2") + ", tenant: t}\n",
		"duplicate key": "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t}\n- {id: b, sha256: " + hash("k") + ", tenant: t}\n",
		"unknown field": "keys:\n- {id: a, key: sk-plaintext, tenant: t}\n",
		"long name":     "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t, name: " + strings.Repeat("n", MaxText+1) + "}\n",
		"long owner":    "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t, owner: " + strings.Repeat("o", MaxText+1) + "}\n",
		"control name":  "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t, name: \"a\\u001b[31mb\"}\n",
		"newline owner": "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t, owner: \"a\\nb\"}\n",
		"C1 name":       "keys:\n- {id: a, sha256: " + hash("k") + ", tenant: t, name: \"a\\u0085b\"}\n",
	} {
		path := filepath.Join(t.TempDir(), "keys.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		_, err := LoadKeys(path)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if strings.Contains(err.Error(), "sk-plaintext") {
			t.Errorf("%s: error repeats a key: %v", name, err)
		}
	}
}

func TestKeyFromHeaders(t *testing.T) {
	for _, c := range []struct{ auth, apiKey, want string }{
		{"Bearer sk-1", "", "sk-1"},
		{"bearer  sk-1 ", "", "sk-1"},
		{"Basic sk-1", "", ""},
		{"", "sk-2", "sk-2"},
		{"Bearer sk-1", "sk-2", "sk-2"},
		{"", "", ""},
	} {
		if got := KeyFromHeaders(c.auth, c.apiKey); got != c.want {
			t.Errorf("KeyFromHeaders(%q, %q) = %q, want %q", c.auth, c.apiKey, got, c.want)
		}
	}
}

func TestFromClaims(t *testing.T) {
	p := FromClaims(JWTConfig{TenantClaim: "org", LabelClaims: []string{"tier"}},
		map[string]any{"sub": "alice", "org": "acme", "tier": "free", "n": 1.0})
	if p.ID != "alice" || p.Tenant != "acme" || p.Labels["tier"] != "free" || p.Type != "jwt" || p.Claims["n"] != 1.0 {
		t.Errorf("%+v", p)
	}
}

// A key is refused from its expiry or revocation on, read from the clock
// the gate is given, with a 401 message saying which; a file without the
// lifecycle fields (an old one) loads as before, and so does JSON.
func TestKeyLifecycle(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.yaml")
	os.WriteFile(path, []byte("keys:\n"+
		"- {id: old, sha256: "+hash("sk-old")+", tenant: acme}\n"+
		"- {id: exp, sha256: "+hash("sk-exp")+", tenant: acme, created: 2026-12-01T00:00:00Z, expires: 2026-12-02T00:00:00Z}\n"+
		"- {id: rev, sha256: "+hash("sk-rev")+", tenant: acme, revoked: 2026-12-01T12:00:00Z}\n"+
		"- {id: rot, sha256: "+hash("sk-rot")+", tenant: acme, expires: 2026-12-02T00:00:00Z, rotatedTo: acme-new}\n"), 0o600)
	keys, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		key, now, err string // err "": accepted
	}{
		{"sk-old", "2099-01-01T00:00:00Z", ""},
		{"sk-exp", "2026-12-01T23:59:59Z", ""},
		{"sk-exp", "2026-12-02T00:00:00Z", "invalid API key: key exp expired at 2026-12-02T00:00:00Z"},
		{"sk-rev", "2026-12-01T11:59:59Z", ""},
		{"sk-rev", "2026-12-01T12:00:00Z", "invalid API key: key rev was revoked at 2026-12-01T12:00:00Z"},
		{"sk-rot", "2026-12-01T23:00:00Z", ""},
		{"sk-rot", "2026-12-02T01:00:00Z", "invalid API key: key rot expired at 2026-12-02T00:00:00Z (rotated: its successor is key acme-new)"},
	} {
		p, err := keys.Authenticate(c.key, at(c.now))
		switch {
		case c.err == "" && (err != nil || p.Tenant != "acme"):
			t.Errorf("%s at %s: %v %+v", c.key, c.now, err, p)
		case c.err != "" && (err == nil || err.Error() != c.err || !errors.Is(err, ErrUnknown)):
			t.Errorf("%s at %s: %v, want %s", c.key, c.now, err, c.err)
		}
	}
	js := filepath.Join(dir, "k.json")
	os.WriteFile(js, []byte(`{"keys":[{"id":"j","sha256":"`+hash("sk-j")+`","tenant":"t","expires":"2026-12-02T00:00:00Z"}]}`), 0o600)
	if k, err := LoadKeys(js); err != nil {
		t.Error(err)
	} else if _, err := k.Authenticate("sk-j", at("2026-12-03T00:00:00Z")); err == nil {
		t.Error("an expired key of a JSON file was accepted")
	}
}

// Last use is noted in memory on an accepted key (not a refused one),
// survives a reload for the same id, and is shown without the hash.
func TestLastUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	write := func(body string) *Keys {
		os.WriteFile(path, []byte(body), 0o600)
		k, err := LoadKeys(path)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	var set KeySet
	set.Store(write("keys:\n- {id: a, sha256: " + hash("sk-a") + ", tenant: t}\n- {id: r, sha256: " + hash("sk-r") + ", tenant: t, revoked: 2000-01-01T00:00:00Z}\n"))
	used := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	set.Load().Authenticate("sk-a", used)
	set.Load().Authenticate("sk-r", used)
	set.Store(write("keys:\n- {id: a, sha256: " + hash("sk-a") + ", tenant: t, owner: bob}\n- {id: r, sha256: " + hash("sk-r") + ", tenant: t, revoked: 2000-01-01T00:00:00Z}\n"))
	st := set.Load().Status()
	if len(st) != 2 || st[0].ID != "a" || st[0].Owner != "bob" || st[0].LastUsed == nil || !st[0].LastUsed.Equal(used) ||
		st[1].LastUsed != nil || st[0].SHA256 != "" || st[1].SHA256 != "" {
		t.Errorf("status after a reload: %+v", st)
	}
}

// A key's name and owner load as written, up to MaxText bytes, and Entry
// gives them by id (the spend page shows them beside the id).
func TestKeyNameAndOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	owner := strings.Repeat("é", MaxText/2)
	os.WriteFile(path, []byte("keys:\n- {id: a, sha256: "+hash("k")+", tenant: t, name: search backend, owner: "+owner+"}\n"), 0o600)
	keys, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := keys.Entry("a"); !ok || e.Name != "search backend" || e.Owner != owner || e.SHA256 != "" {
		t.Errorf("Entry(a) = %+v, %v", e, ok)
	}
	if _, ok := keys.Entry("b"); ok {
		t.Error("Entry(b) of no key")
	}
}
