package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// adapter is how Envoy reaches the gate and the meter.
type adapter string

const (
	extProc adapter = "ext_proc" // infergate serve beside Envoy (envoy/demo.yaml)
	module  adapter = "module"   // the dynamic module in Envoy's process (envoy/snippet-module.yaml)
)

// adapters are both, in the order the parity table runs them.
var adapters = []adapter{extProc, module}

// startAdapterStack starts Envoy in front of pools on adapter a, infergate
// configured by config (the YAML infergate serve reads; the module reads
// the same file): the same handles whichever adapter runs.
func startAdapterStack(t *testing.T, a adapter, config func(*stack) string) *stack {
	t.Helper()
	if a == module {
		return startModuleStackFor(t, config)
	}
	return startStackFor(t, "envoy/demo.yaml", config, 1)
}

// The module is built once per test binary (it takes as long as a test),
// with the test-only panic hook (tag infergate_panic_hook), into a
// directory Envoy searches (ENVOY_DYNAMIC_MODULES_SEARCH_PATH) that
// TestMain removes.
var builtModule struct {
	once sync.Once
	dir  string
	err  error
}

// moduleDir builds libinfergate.so, once, and returns its directory.
func moduleDir(t *testing.T) string {
	t.Helper()
	builtModule.once.Do(func() {
		dir, err := os.MkdirTemp("", "infergate-module-")
		if err != nil {
			builtModule.err = err
			return
		}
		builtModule.dir = dir
		cmd := exec.Command("go", "build", "-tags", "infergate_panic_hook", "-buildmode=c-shared",
			"-o", filepath.Join(dir, "libinfergate.so"), "./cmd/infergate-module")
		cmd.Dir, cmd.Env = repoRoot, append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			builtModule.err = fmt.Errorf("building the module: %w\n%s", err, out)
		}
	})
	if builtModule.err != nil {
		t.Fatal(builtModule.err)
	}
	return builtModule.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtModule.dir != "" {
		os.RemoveAll(builtModule.dir)
	}
	os.Exit(code)
}

// startModuleStackFor is the module's stack: the pinned Envoy loading the
// module, configured by envoy/snippet-module.yaml and a file holding
// config, in front of one mock pool (PoolA and PoolB both). The module's
// request log is Envoy's standard output.
func startModuleStackFor(t *testing.T, config func(*stack) string) *stack {
	t.Helper()
	dir := moduleDir(t)
	p := startPool(t, mock.Config{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond})
	requests := &testutil.Buffer{}
	// The module serves the admin port (metrics, /debug pages) from
	// Envoy's process, on the config's admin.listen (parityConfig).
	s := &stack{Adapter: module, PoolA: p, PoolB: p, Stamps: newStampLog(requests), TimedInEnvoy: true,
		AdminURL: "http://127.0.0.1:" + freePort(t)}
	cfgPath := filepath.Join(t.TempDir(), "infergate.yaml")
	if err := os.WriteFile(cfgPath, []byte(config(s)), 0o600); err != nil {
		t.Fatal(err)
	}
	rendered := renderEnvoy(t, "envoy/snippet-module.yaml", map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "POOL_A_PORT": port(t, p.Addr), "POOL_B_PORT": port(t, p.Addr), "INFERGATE_CONFIG": cfgPath,
	})
	s.Envoy = envoytest.StartWithEnv(t, []string{"GODEBUG=cgocheck=0", "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir}, requests, rendered)
	testutil.Eventually(t, 10*time.Second, func() bool { return testutil.HTTPReady(s.AdminURL+"/readyz")() == nil },
		"the module's admin port")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("module request log:\n%s", requests.String())
		}
	})
	return s
}
