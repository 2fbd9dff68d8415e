package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/cli"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/testutil"
)

// Keys made by `infergate keys` through the real Envoy: a created key
// works, a rotated key and its successor both work during the grace, a
// revoked key and an expired one are refused with 401 invalid_api_key
// saying why, each after the gate's reload of the file (waited for on its
// /debug/keys, the gate's own view), and the last use shows in keys list.
func TestKeysLifecycle(t *testing.T) {
	t.Parallel()
	keysPath := writeKeys(t)
	s := startStackWith(t, policyConfig(keysPath, filepath.Join(repoRoot, "policies"), "admin:\n  debug: {enabled: true}\n"), 1)
	admin := s.Gateway.AdminURL
	keys := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := cli.Run(context.Background(), append([]string{"keys"}, args...), &stdout, &stderr); err != nil {
			t.Fatalf("keys %v: %v\n%s", args, err, stderr.String())
		}
		return strings.TrimSpace(stdout.String())
	}
	// loaded waits until the gate has loaded the file in which ok holds.
	loaded := func(what string, ok func(map[string]identity.KeyStatus) bool) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() bool {
			resp, err := http.Get(admin + "/debug/keys")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st []identity.KeyStatus
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatal(err)
			}
			byID := map[string]identity.KeyStatus{}
			for _, k := range st {
				byID[k.ID] = k
			}
			return ok(byID)
		}, "the gate to load "+what)
	}
	list := func(admins ...string) map[string]identity.KeyStatus {
		t.Helper()
		var rows []identity.KeyStatus
		if err := json.Unmarshal([]byte(keys(append([]string{"list", "--file", keysPath, "--json"}, admins...)...)), &rows); err != nil {
			t.Fatal(err)
		}
		byID := map[string]identity.KeyStatus{}
		for _, r := range rows {
			byID[r.ID] = r
		}
		return byID
	}
	chat := func(key string) (int, openAIError) {
		t.Helper()
		resp, e := chatCall(key, "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL)
		return resp.StatusCode, e
	}
	refused := func(key, why string) {
		t.Helper()
		status, e := chat(key)
		if status != 401 || e.Error.Code != "invalid_api_key" || !strings.Contains(e.Error.Message, why) {
			t.Errorf("%s key: %d %+v, want 401 invalid_api_key %q", why, status, e.Error, why)
		}
	}

	const firstID = "globex-lifecycle"
	first := keys("create", "--tenant", "globex", "--team", "search", "--owner", "e2e", "--id", firstID, "--file", keysPath)
	loaded("the created key", func(k map[string]identity.KeyStatus) bool { _, ok := k[firstID]; return ok })
	if status, e := chat(first); status != 200 {
		t.Fatalf("created key: %d %+v", status, e.Error)
	}
	if r := list("--admin", admin)[firstID]; r.LastUsed == nil || r.Owner != "e2e" || r.Labels["team"] != "search" {
		t.Errorf("keys list after a use: %+v", r)
	}

	second := keys("rotate", firstID, "--grace", "1h", "--file", keysPath)
	secondID := list()[firstID].RotatedTo
	loaded("the rotation", func(k map[string]identity.KeyStatus) bool {
		_, ok := k[secondID]
		return ok && k[firstID].RotatedTo == secondID
	})
	for name, key := range map[string]string{"old key in its grace": first, "new key": second} {
		if status, e := chat(key); status != 200 {
			t.Errorf("%s: %d %+v", name, status, e.Error)
		}
	}

	keys("revoke", firstID, "--file", keysPath)
	loaded("the revocation", func(k map[string]identity.KeyStatus) bool { return k[firstID].Revoked != nil })
	refused(first, "key "+firstID+" was revoked at ")
	if status, e := chat(second); status != 200 {
		t.Errorf("the successor of a revoked key: %d %+v", status, e.Error)
	}

	const expiringID = "globex-expiring"
	expiring := keys("create", "--tenant", "globex", "--expires", "1ms", "--id", expiringID, "--file", keysPath)
	loaded("the expiring key", func(k map[string]identity.KeyStatus) bool { _, ok := k[expiringID]; return ok })
	refused(expiring, "key "+expiringID+" expired at ")
}
