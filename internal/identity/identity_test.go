package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	p, ok := keys.Lookup("sk-a")
	if !ok || p.ID != "a" || p.Tenant != "acme" || p.Labels["tier"] != "premium" || p.Type != "api_key" {
		t.Errorf("sk-a = %+v %v", p, ok)
	}
	if _, ok := keys.Lookup("sk-c"); ok {
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
