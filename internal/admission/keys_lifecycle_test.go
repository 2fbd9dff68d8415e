package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
)

// The gate refuses an expired or revoked key, by its own clock, with 401
// invalid_api_key saying which and when; before then the key is admitted.
func TestExpiredAndRevokedKeys(t *testing.T) {
	c := newController(t)
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Reason: "ok"}}
	hash := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	path := filepath.Join(t.TempDir(), "keys.yaml")
	os.WriteFile(path, []byte("keys:\n"+
		"- {id: exp, sha256: "+hash("sk-exp")+", tenant: acme, expires: 2026-12-02T00:00:00Z}\n"+
		"- {id: rev, sha256: "+hash("sk-rev")+", tenant: acme, revoked: 2026-12-01T00:00:00Z}\n"), 0o600)
	keys, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	c.Keys.Store(keys)
	now := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	c.Now = func() time.Time { return now }
	ctx := context.Background()
	bearer := func(k string) map[string]string { return map[string]string{"authorization": "Bearer " + k} }
	if v := c.Decide(ctx, chat(bearer("sk-exp"))); v.Deny != nil || v.Principal != "exp" {
		t.Errorf("before its expiry: %+v", v.Deny)
	}
	for key, msg := range map[string]string{
		"sk-rev": "invalid API key: key rev was revoked at 2026-12-01T00:00:00Z",
		"sk-exp": "invalid API key: key exp expired at 2026-12-02T00:00:00Z",
	} {
		now = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
		for _, v := range []*openai.Error{c.Decide(ctx, chat(bearer(key))).Deny, c.Identify(ctx, chat(bearer(key))).Deny} {
			if v == nil || v.Status != 401 || v.Code != "invalid_api_key" || v.Message != msg {
				t.Errorf("%s: %+v, want 401 %q", key, v, msg)
			}
		}
	}
}
