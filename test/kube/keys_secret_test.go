package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/internal/identity"
)

// `infergate keys --secret` (the binary) against the real API server: the keys land in
// the Secret the chart mounts (apiKeys.existingSecret), hashes only; two
// commands at once both land (optimistic writes, retried on the
// conflict); the gate's loader, reading the Secret's files as kubelet
// mounts them, accepts a created key, both keys of a rotation during the
// grace, and refuses a revoked one.
func TestKeysInSecret(t *testing.T) {
	c := startCluster(t)
	const ns, name = "keys", "infergate-api-keys"
	c.createNamespace(t, ns)
	bin := infergateBin(t)
	ref := ns + "/" + name
	keys := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		cmd := withEnv(exec.Command(bin, append([]string{"keys"}, append(args, "--secret", ref)...)...), "KUBECONFIG="+c.kubeconfig)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("keys %v: %w\n%s", args, err, stderr.String())
		}
		return strings.TrimSpace(stdout.String()), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := keys(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	first := must("create", "--tenant", "acme", "--tier", "premium", "--id", "acme-a")
	minted := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			id := fmt.Sprintf("globex-%d", i)
			key, err := keys("create", "--tenant", "globex", "--id", id)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			minted[id] = key
			mu.Unlock()
		})
	}
	wg.Wait()
	second := must("rotate", "acme-a", "--grace", "1h")
	must("revoke", "globex-0")

	// The Secret's files, as kubelet mounts them, read by the gate's loader.
	sec, err := c.kube.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for file, b := range sec.Data {
		for _, key := range []string{first, second, minted["globex-0"], minted["globex-1"]} {
			if bytes.Contains(b, []byte(key)) {
				t.Errorf("the Secret holds a key:\n%s", b)
			}
		}
		os.WriteFile(filepath.Join(dir, file), b, 0o600)
	}
	loaded, err := identity.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Len() != 4 {
		t.Fatalf("%d keys in the Secret, want 4: %s", loaded.Len(), sec.Data["keys.yaml"])
	}
	now := time.Now()
	for key, want := range map[string]string{
		first:              "",
		second:             "",
		minted["globex-1"]: "",
		minted["globex-0"]: "key globex-0 was revoked at ",
	} {
		p, err := loaded.Authenticate(key, now)
		switch {
		case want == "" && err != nil:
			t.Errorf("%v", err)
		case want == "" && p.Tenant == "acme" && p.Labels["tier"] != "premium":
			t.Errorf("%+v lost its tier", p)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%v, want %q", err, want)
		}
	}
	if _, err := loaded.Authenticate(first, now.Add(time.Hour+time.Minute)); err == nil {
		t.Error("the rotated key outlived its grace")
	}

	var rows []identity.KeyStatus
	out := must("list", "--json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 4 {
		t.Errorf("list: %v\n%s", err, out)
	}
	if strings.Contains(out, first) || strings.Contains(out, "sha256") {
		t.Errorf("list shows a key or a hash:\n%s", out)
	}
}
