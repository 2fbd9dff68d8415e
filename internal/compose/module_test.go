package compose

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/config"
)

// The module cannot read jwt_authn's payload (a Struct) through the
// SDK's metadata getters: a configuration asking for JWT callers is
// refused at start, not every such caller denied later.
func TestModuleRefusesJWT(t *testing.T) {
	cfg, err := config.Parse([]byte("auth:\n  jwt:\n    enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newModule(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "auth.jwt") {
		t.Errorf("newModule with auth.jwt: %v, want the refusal", err)
	}
}
