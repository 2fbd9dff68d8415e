package policy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/internal/testutil/vtime"
	filewatch "github.com/infergate/infergate/internal/watch"
)

// syncBuffer is a log destination safe for the watcher's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The watcher's tests run in virtual time (testing/synctest): the files
// are real, the poll's ticker is the bubble's, so a change made between
// two polls is asserted right after the next one.

// pollEvery is the watcher's interval in the tests (virtual time).
const pollEvery = time.Second

// watch starts a watcher on dir, stopped when the test ends, and returns
// half an interval later: the test then acts between polls.
func watch(t *testing.T, dir string) (*Watcher, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	w, err := NewWatcher(ctx, dir, pollEvery, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	vtime.Advance(pollEvery / 2)
	return w, logs
}

// afterPoll lets the next poll run to its end, then checks cond: a change
// made since the last poll is served from the next one.
func afterPoll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	vtime.Advance(pollEvery)
	if !cond() {
		t.Fatalf("not after the next poll: %s", what)
	}
}

func allows(t *testing.T, w *Watcher, in *Input) bool {
	t.Helper()
	d, err := w.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return d.Allow
}

// replaceIn rewrites one file of dir, replacing old with new.
func replaceIn(t *testing.T, dir, name, old, new string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s does not contain %q", name, old)
	}
	writeFile(t, dir, name, strings.Replace(string(b), old, new, 1))
}

func TestWatcherReloadsAndKeepsServingOnErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := copyPolicies(t)
		w, logs := watch(t, dir)
		in := chat("umbrella", "llama-3.1-70b-instruct") // an unknown tenant: denied
		if allows(t, w, in) {
			t.Fatal("an unknown tenant was allowed")
		}
		if err := w.Health(); err != nil {
			t.Fatalf("Health = %v", err)
		}

		// A new version: a new premium tenant.
		replaceIn(t, dir, "data.yaml", "  tenants:\n", "  tenants:\n    umbrella:\n      tier: premium\n")
		afterPoll(t, "the new tenant applies", func() bool { return allows(t, w, in) })
		if ok, failed := w.Reloads(); ok != 1 || failed != 0 {
			t.Errorf("Reloads = %d ok, %d failed; want 1, 0", ok, failed)
		}

		// A broken version: the previous one keeps serving, and Health says why.
		good, err := os.ReadFile(filepath.Join(dir, "authz.rego"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "authz.rego", string(good)+"\nallow if {\n")
		afterPoll(t, "the broken version is reported", func() bool { return w.Health() != nil })
		if err := w.Health(); strings.Count(err.Error(), "policy "+dir+":") != 1 {
			t.Errorf("the error names the directory more or less than once: %v", err)
		}
		if err := w.Health(); !strings.Contains(err.Error(), "authz.rego:") {
			t.Errorf("Health = %v, want the file and line", err)
		}
		if !allows(t, w, in) {
			t.Error("the previous version no longer serves")
		}
		if _, failed := w.Reloads(); failed != 1 {
			t.Errorf("failed reloads = %d, want 1", failed)
		}
		if !strings.Contains(logs.String(), "policy reload failed") {
			t.Errorf("no reload failure in the log:\n%s", logs)
		}

		// Fixed again (back to the version with the new tenant): recovered.
		writeFile(t, dir, "authz.rego", string(good))
		afterPoll(t, "the fixed version loads", func() bool { return w.Health() == nil })
		if !allows(t, w, in) {
			t.Error("the fixed version denies")
		}
		if ok, failed := w.Reloads(); ok != 2 || failed != 1 {
			t.Errorf("Reloads = %d ok, %d failed; want 2, 1", ok, failed)
		}
	})
}

func TestWatcherKeepsServingWhenPolicyTestsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := copyPolicies(t)
		w, _ := watch(t, dir)
		in := chat("globex", "llama-3.1-70b-instruct")
		if !allows(t, w, in) {
			t.Fatal("standard tier denied")
		}
		// A change that compiles but breaks the policy's own tests: standard
		// loses its large model, in the data and in the tests' own fixture
		// (which test_standard_tier_models holds to it).
		replaceIn(t, dir, "data.yaml", "    - llama-3.1-70b-instruct\n", "")
		replaceIn(t, dir, "testdata_test.rego", "\t\t\t\t\"llama-3.1-70b-instruct\",\n", "")
		afterPoll(t, "the failing tests are reported", func() bool { return w.Health() != nil })
		if err := w.Health(); !strings.Contains(err.Error(), "test_standard_tier_models") {
			t.Errorf("Health = %v, want the failing test named", err)
		}
		if !allows(t, w, in) {
			t.Error("the version whose tests fail is serving")
		}
	})
}

func TestWatcherNewFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := copyPolicies(t)
		w, _ := watch(t, dir)
		in := chat("initech", "llama-3.1-8b-instruct")
		in.Labels = map[string]string{"team": "research"}
		d, err := w.Decide(context.Background(), in)
		if err != nil || d.Checks != nil {
			t.Fatalf("Decide = %+v, %v", d, err)
		}
		// A new policy file adds a check for one team's keys.
		writeFile(t, dir, "moderation.rego",
			"package infergate.authz\n\nchecks contains \"moderation\" if input.labels.team == \"research\"\n")
		afterPoll(t, "the new file applies", func() bool {
			d, err := w.Decide(context.Background(), in)
			return err == nil && len(d.Checks) == 1 && d.Checks[0] == "moderation"
		})
		// And removing it takes the check away again.
		if err := os.Remove(filepath.Join(dir, "moderation.rego")); err != nil {
			t.Fatal(err)
		}
		afterPoll(t, "the removal applies", func() bool {
			d, err := w.Decide(context.Background(), in)
			return err == nil && d.Checks == nil
		})
	})
}

func TestWatchFailsOnBrokenPolicy(t *testing.T) {
	dir := policyDir(t, map[string]string{"authz.rego": "package infergate.authz\n\nallow if {\n"})
	if _, err := NewWatcher(context.Background(), dir, time.Second, nil); err == nil {
		t.Fatal("Watch loaded a broken policy")
	}
	if _, err := NewWatcher(context.Background(), filepath.Join(dir, "missing"), time.Second, nil); err == nil {
		t.Fatal("Watch loaded a missing directory")
	}
}

func TestWatcherReportsMissingDirectory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "policies")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "authz.rego", allowAll)
		w, _ := watch(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		afterPoll(t, "the missing directory is reported", func() bool { return w.Health() != nil })
		if !allows(t, w, chat("acme", "m")) {
			t.Error("the previous version no longer serves")
		}
		// Reported once, not once per poll.
		vtime.Advance(10 * pollEvery)
		if _, failed := w.Reloads(); failed != 1 {
			t.Errorf("failed reloads = %d, want 1", failed)
		}
	})
}

func TestFingerprint(t *testing.T) {
	dir := copyPolicies(t)
	fp := func() string {
		t.Helper()
		h, err := filewatch.Fingerprint(dir, isPolicyFile)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a := fp()
	if b := fp(); a != b {
		t.Fatal("fingerprint of an unchanged directory changed")
	}
	writeFile(t, dir, "notes.txt", "not a policy file")
	writeFile(t, dir, ".hidden.rego", "not loaded")
	if b := fp(); a != b {
		t.Error("files Load skips changed the fingerprint")
	}
	writeFile(t, dir, "extra.json", "{}")
	if b := fp(); a == b {
		t.Error("a new data file did not change the fingerprint")
	}
	b := fp()
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "authz.rego"), future, future); err != nil {
		t.Fatal(err)
	}
	if c := fp(); b == c {
		t.Error("a new modification time did not change the fingerprint")
	}
}
