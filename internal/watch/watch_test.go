package watch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPollReloadsOnChange(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "keys.yaml")
	os.WriteFile(f, []byte("a"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reloads := make(chan struct{}, 10)
	last, _ := Fingerprint(dir, nil)
	go Poll(ctx, dir, nil, last, 10*time.Millisecond, func() error { reloads <- struct{}{}; return nil }, func(error) {})
	select {
	case <-reloads:
		t.Fatal("reloaded without a change")
	case <-time.After(50 * time.Millisecond):
	}
	os.WriteFile(f, []byte("ab"), 0o600)
	select {
	case <-reloads:
	case <-time.After(2 * time.Second):
		t.Fatal("no reload after a change")
	}
}
