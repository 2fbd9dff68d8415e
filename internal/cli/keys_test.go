package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/identity"
)

// keysCmd runs `infergate keys args...` at now and returns its stdout.
func keysCmd(t *testing.T, now time.Time, args ...string) (string, error) {
	t.Helper()
	keysNow = func() time.Time { return now }
	t.Cleanup(func() { keysNow = time.Now })
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), append([]string{"keys"}, args...), &stdout, &stderr)
	if err != nil {
		t.Logf("keys %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String(), err
}

func loadKeys(t *testing.T, path string) *identity.Keys {
	t.Helper()
	k, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// create, revoke and rotate edit an existing file in place: its entries
// and comments stay, the key is printed once and only its hash is
// written, and the gate's loader enforces what they wrote.
func TestKeysCreateRevokeRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" // sha256("test")
	os.WriteFile(path, []byte("# the platform team's keys\nkeys:\n- id: legacy # hand-made\n  sha256: "+sum+"\n  tenant: globex\n"), 0o640)
	t0 := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

	key, err := keysCmd(t, t0, "create", "--tenant", "acme", "--team", "search", "--tier", "premium", "--owner", "alice", "--expires", "30d", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	key = strings.TrimSpace(key)
	if !strings.HasPrefix(key, identity.KeyPrefix) || len(key) < len(identity.KeyPrefix)+43 {
		t.Fatalf("key %q", key)
	}
	b, _ := os.ReadFile(path)
	if bytes.Contains(b, []byte(key)) || !bytes.Contains(b, []byte("# the platform team's keys")) || !bytes.Contains(b, []byte("# hand-made")) {
		t.Fatalf("file after create:\n%s", b)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", st.Mode().Perm())
	}
	k := loadKeys(t, path)
	p, err := k.Authenticate(key, t0.Add(29*24*time.Hour))
	if err != nil || p.Tenant != "acme" || p.Labels["team"] != "search" || p.Labels["tier"] != "premium" {
		t.Fatalf("created key: %+v %v", p, err)
	}
	id := p.ID
	if _, err := k.Authenticate(key, t0.Add(30*24*time.Hour)); err == nil || !strings.Contains(err.Error(), "expired at 2027-01-01T07:00:00Z") {
		t.Errorf("after 30 days: %v", err)
	}
	if _, err := k.Authenticate("test", t0); err != nil {
		t.Errorf("the hand-made key: %v", err)
	}

	// rotate: a new key with the same attributes and lifetime; both valid
	// for the grace, then only the new one.
	t1 := t0.Add(time.Hour)
	newKey, err := keysCmd(t, t1, "rotate", id, "--grace", "2h", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	newKey = strings.TrimSpace(newKey)
	k = loadKeys(t, path)
	np, err := k.Authenticate(newKey, t1.Add(3*time.Hour))
	if err != nil || np.ID == id || np.Tenant != "acme" || np.Labels["team"] != "search" || np.Labels["tier"] != "premium" {
		t.Fatalf("rotated key: %+v %v", np, err)
	}
	if _, err := k.Authenticate(key, t1.Add(2*time.Hour-time.Second)); err != nil {
		t.Errorf("old key within the grace: %v", err)
	}
	if _, err := k.Authenticate(key, t1.Add(2*time.Hour)); err == nil || !strings.Contains(err.Error(), "successor is key "+np.ID) {
		t.Errorf("old key after the grace: %v", err)
	}
	if _, err := k.Authenticate(newKey, t1.Add(30*24*time.Hour)); err == nil {
		t.Error("the rotated key outlived the lifetime it inherited")
	}
	if _, err := keysCmd(t, t1, "rotate", id, "--file", path); err == nil {
		t.Error("a key was rotated twice")
	}

	// revoke: refused from then on; revoking again changes nothing.
	t2 := t1.Add(time.Minute)
	if _, err := keysCmd(t, t2, "revoke", np.ID, "--file", path); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	if _, err := keysCmd(t, t2.Add(time.Hour), "revoke", np.ID, "--file", path); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Errorf("a second revoke changed the file:\n%s", after)
	}
	k = loadKeys(t, path)
	if _, err := k.Authenticate(newKey, t2.Add(-time.Second)); err != nil {
		t.Errorf("before its revocation: %v", err)
	}
	if _, err := k.Authenticate(newKey, t2); err == nil || !strings.Contains(err.Error(), "revoked at 2026-12-02T08:01:00Z") {
		t.Errorf("revoked key: %v", err)
	}
	if _, err := keysCmd(t, t2, "revoke", "nope", "--file", path); err == nil {
		t.Error("revoked an unknown id")
	}
	if k.Len() != 3 {
		t.Errorf("%d keys", k.Len())
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".keys.yaml.*")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
}

// list shows ids, owners, expiry, revocation and the latest last use the
// replicas' admin ports report, and never a key or a hash.
func TestKeysList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	t0 := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	key, err := keysCmd(t, t0, "create", "--tenant", "acme", "--name", "search backend", "--owner", "alice", "--id", "acme-a", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	key = strings.TrimSpace(key)
	if _, err := keysCmd(t, t0, "create", "--tenant", "acme", "--id", "acme-a", "--file", path); err == nil {
		t.Error("an id was created twice")
	}
	// Two replicas: one used the key at t0+1m, the other at t0+2m.
	var admins []string
	for _, used := range []time.Duration{time.Minute, 2 * time.Minute} {
		var set identity.KeySet
		set.Store(loadKeys(t, path))
		if _, err := set.Load().Authenticate(key, t0.Add(used)); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(compose.KeysHandler(&set))
		t.Cleanup(srv.Close)
		admins = append(admins, "--admin", srv.URL)
	}
	out, err := keysCmd(t, t0, append([]string{"list", "--file", path, "--json"}, admins...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rows []identity.KeyStatus
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != "acme-a" || rows[0].Owner != "alice" || rows[0].Name != "search backend" || rows[0].LastUsed == nil || !rows[0].LastUsed.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("list --json: %s", out)
	}
	table, err := keysCmd(t, t0, "list", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, "acme-a") || !strings.Contains(table, "alice") || !strings.Contains(table, "search backend") {
		t.Errorf("list:\n%s", table)
	}
	b, _ := os.ReadFile(path)
	sum := loadSum(t, b)
	for _, o := range []string{out, table} {
		if strings.Contains(o, key) || strings.Contains(o, sum) {
			t.Errorf("list shows a key or a hash:\n%s", o)
		}
	}
}

func loadSum(t *testing.T, b []byte) string {
	_, rest, ok := strings.Cut(string(b), "sha256: ")
	if !ok {
		t.Fatalf("no hash in\n%s", b)
	}
	return strings.Fields(rest)[0]
}

func TestKeysUsageErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	for _, args := range [][]string{
		{},
		{"create", "--file", path},
		{"create", "--tenant", "a", "--expires", "-1h", "--file", path},
		{"create", "--tenant", "a", "--expires", "1.5d", "--file", path},
		{"create", "--tenant", "a", "--name", "a\x1b[2Jb", "--file", path},
		{"create", "--tenant", "a", "--owner", strings.Repeat("o", identity.MaxText+1), "--file", path},
		{"revoke", "--file", path},
		{"frobnicate"},
	} {
		if _, err := keysCmd(t, time.Now(), args...); !errors.Is(err, ErrUsage) {
			t.Errorf("keys %v: %v", args, err)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a refused command wrote the file")
	}
}

// create --budget-month (or its former name, --budget-usd-month) writes
// the key's monthly budget, which the gate's loader reads in pico-units
// and rotate carries over; a budget that is no amount is refused before
// anything is written.
func TestKeysCreateBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	t0 := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	key, err := keysCmd(t, t0, "create", "--tenant", "acme", "--budget-month", "500", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte(`budgetMonth: "500"`)) {
		t.Errorf("file after create:\n%s", b)
	}
	p, err := loadKeys(t, path).Authenticate(strings.TrimSpace(key), t0)
	if err != nil || p.BudgetMonth != 500_000_000_000_000 {
		t.Fatalf("created key: %+v %v", p, err)
	}
	newKey, err := keysCmd(t, t0, "rotate", p.ID, "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	if np, err := loadKeys(t, path).Authenticate(strings.TrimSpace(newKey), t0); err != nil || np.BudgetMonth != p.BudgetMonth {
		t.Errorf("rotated key: %+v %v", np, err)
	}
	for _, bad := range []string{"-5", "1e3", "five", "10000000"} {
		if _, err := keysCmd(t, t0, "create", "--tenant", "acme", "--budget-usd-month", bad, "--file", path); !errors.Is(err, ErrUsage) {
			t.Errorf("--budget-usd-month %s: %v, want a usage error", bad, err)
		}
	}
}

// revoke and rotate print their usage for --help, as the other
// subcommands do, and list refuses a keys file that is not there rather
// than printing an empty table.
func TestKeysHelpAndMissingFile(t *testing.T) {
	for _, sub := range []string{"revoke", "rotate", "create", "list"} {
		var stdout, stderr bytes.Buffer
		err := Run(context.Background(), []string{"keys", sub, "--help"}, &stdout, &stderr)
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "infergate keys "+sub) {
			t.Errorf("keys %s --help: %v\n%s", sub, err, stderr.String())
		}
	}
	typo := filepath.Join(t.TempDir(), "typo.yaml")
	if _, err := keysCmd(t, time.Now(), "list", "--file", typo); err == nil || !strings.Contains(err.Error(), "typo.yaml") {
		t.Errorf("keys list of a missing file: %v", err)
	}
	if _, err := os.Stat(typo); err == nil {
		t.Error("list created the file")
	}
}

// --config takes the keys file from the config's auth.keys, so that the
// file the gate reads is the one edited.
func TestKeysFromConfig(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "gate-keys.yaml")
	cfg := filepath.Join(dir, "infergate.yaml")
	os.WriteFile(cfg, fmt.Appendf(nil, "auth:\n  keys: %s\n", keys), 0o644)
	if _, err := keysCmd(t, time.Now(), "create", "--tenant", "acme", "--id", "k1", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	if loadKeys(t, keys).Len() != 1 {
		t.Error("the key is not in the config's auth.keys")
	}
	out, err := keysCmd(t, time.Now(), "list", "--config", cfg)
	if err != nil || !strings.Contains(out, "k1") {
		t.Errorf("list --config: %v\n%s", err, out)
	}
	if _, err := keysCmd(t, time.Now(), "list", "--config", cfg, "--file", keys); !errors.Is(err, ErrUsage) {
		t.Errorf("--config with --file: %v", err)
	}
	bare := filepath.Join(dir, "bare.yaml")
	os.WriteFile(bare, []byte("log:\n  level: info\n"), 0o644)
	if _, err := keysCmd(t, time.Now(), "list", "--config", bare); err == nil || !strings.Contains(err.Error(), "auth.keys") {
		t.Errorf("a config without auth.keys: %v", err)
	}
}
