package identity

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An edit keeps what it does not change: comments, entries written by
// hand (flow style too), and adds to an empty or missing file alike; what
// the gate would refuse is never written.
func TestKeyFileEdit(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"missing": "",
		"empty":   "keys:\n",
		"flow":    "# ours\nkeys: []\n",
		"entries": "# ours\nkeys:\n- {id: a, sha256: " + hash("sk-a") + ", tenant: t} # by hand\n",
	} {
		path := filepath.Join(dir, name+".yaml")
		if body != "" {
			os.WriteFile(path, []byte(body), 0o600)
		}
		f, err := OpenKeyFile(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		key, sum := NewKey()
		created := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
		if err := f.Append(KeyEntry{ID: "new", SHA256: sum, Tenant: "t", Labels: map[string]string{"tier": "free"}, Created: &created}); err != nil {
			t.Fatal(err)
		}
		if err := f.Save(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := os.ReadFile(path)
		for _, kept := range []string{"# ours", "# by hand"} {
			if strings.Contains(body, kept) && !strings.Contains(string(b), kept) {
				t.Errorf("%s: %q lost:\n%s", name, kept, b)
			}
		}
		keys, err := LoadKeys(path)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, b)
		}
		if p, err := keys.Authenticate(key, created); err != nil || p.Labels["tier"] != "free" {
			t.Errorf("%s: %+v %v\n%s", name, p, err, b)
		}
		// A duplicate id would not load: refused, the file unchanged.
		f.Append(KeyEntry{ID: "new", SHA256: hash("other"), Tenant: "t"})
		if err := f.Save(); err == nil {
			t.Errorf("%s: saved a file the gate refuses", name)
		}
		if after, _ := os.ReadFile(path); string(after) != string(b) {
			t.Errorf("%s: a refused save changed the file", name)
		}
	}
	for name, body := range map[string]string{"not a list": "keys: 3\n", "plaintext": "keys:\n- {id: a, key: sk-x, tenant: t}\n"} {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		if _, err := OpenKeyFile(path); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	if _, err := OpenKeyFile(filepath.Join(dir, "k.json")); err == nil {
		t.Error("a JSON file opened for a YAML edit")
	}
}

func TestParseExpiry(t *testing.T) {
	for s, want := range map[string]time.Duration{"30d": 30 * 24 * time.Hour, "12h": 12 * time.Hour, "1ms": time.Millisecond} {
		if d, err := ParseExpiry(s); err != nil || d != want {
			t.Errorf("%s: %v %v", s, d, err)
		}
	}
	for _, s := range []string{"", "0", "-1h", "1.5d", "d", "+3d", "99999999d"} {
		if _, err := ParseExpiry(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
