// Package envoytest runs the project's pinned Envoy for tests: found the one
// way the project finds it (scripts/install-envoy.sh, which honours
// ENVOY_BIN), on random ports, with its log shown only when a test fails.
package envoytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// RepoRoot is the repository's top directory.
var RepoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}()

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the Envoy to run, installing the pinned one if needed.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := exec.Command(filepath.Join(RepoRoot, "scripts", "install-envoy.sh")).Output()
		if err != nil {
			binErr = fmt.Errorf("scripts/install-envoy.sh: %w", err)
			return
		}
		binPath = strings.TrimSpace(string(out))
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// Render fills the ${NAME} placeholders of a config under envoy/, as
// scripts/render-envoy.sh does; an unknown placeholder fails the test.
func Render(t testing.TB, rel string, vars map[string]string) string {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join(RepoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return os.Expand(string(tmpl), func(k string) string {
		v, ok := vars[k]
		if !ok {
			t.Fatalf("%s: unknown placeholder ${%s}", rel, k)
		}
		return v
	})
}

// Envoy is a running Envoy.
type Envoy struct {
	URL      string // its first listener
	AdminURL string
	Pid      int

	stop func() // kills the process and waits for it (idempotent)
}

// Kill ends Envoy at once (SIGKILL) and waits for it to exit; killing it
// again does nothing. Tests that restart Envoy drain the old one first.
func (e *Envoy) Kill() { e.stop() }

// Start runs Envoy on a rendered config whose listener and admin ports are
// 0 (or fixed): it waits until Envoy is ready and has bound its listener,
// and stops it when the test ends. args are more command-line flags.
func Start(t testing.TB, config string, args ...string) *Envoy {
	t.Helper()
	return start(t, nil, nil, config, args...)
}

// StartWithEnv is Start with env (KEY=value) added to Envoy's environment
// and its standard output written to stdout (when not nil): an Envoy that
// loads a dynamic module (GODEBUG, ENVOY_DYNAMIC_MODULES_SEARCH_PATH) whose
// request log is its standard output.
func StartWithEnv(t testing.TB, env []string, stdout io.Writer, config string, args ...string) *Envoy {
	t.Helper()
	return start(t, nil, func(cmd *exec.Cmd) {
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout = stdout
	}, config, args...)
}

// StartWithHosts is Start with more names in Envoy's /etc/hosts (name ->
// IP; none is Start), as a cluster's DNS would resolve them: Envoy runs in a mount
// namespace of its own (needs root) where a copy of /etc/hosts with them
// is bind-mounted over the file, so a STRICT_DNS cluster resolves a
// Service's name through the real resolver.
func StartWithHosts(t testing.TB, hosts map[string]string, config string, args ...string) *Envoy {
	t.Helper()
	return start(t, hosts, nil, config, args...)
}

func start(t testing.TB, hosts map[string]string, edit func(*exec.Cmd), config string, args ...string) *Envoy {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "envoy.yaml")
	adminPath := filepath.Join(dir, "admin-address")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Binary(t), append([]string{"-c", cfgPath, "--disable-hot-restart", "--admin-address-path", adminPath,
		"-l", "warning", "--concurrency", "2"}, args...)...)
	if len(hosts) > 0 {
		etc, err := os.ReadFile("/etc/hosts")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range slices.Sorted(maps.Keys(hosts)) {
			etc = fmt.Appendf(etc, "\n%s %s\n", hosts[name], name)
		}
		hostsPath := filepath.Join(dir, "hosts")
		if err := os.WriteFile(hostsPath, etc, 0o644); err != nil {
			t.Fatal(err)
		}
		// unshare and sh exec: the process is Envoy's own pid.
		cmd = exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$0" /etc/hosts && exec "$@"`, hostsPath}, cmd.Args...)...)
	}
	if edit != nil {
		edit(cmd)
	}
	p := testutil.StartProc(t, cmd, testutil.ProcOptions{Name: "envoy"})
	e := &Envoy{Pid: p.Pid(), stop: p.Kill}
	err := p.WaitReady(30*time.Second, func() error {
		if b, err := os.ReadFile(adminPath); err == nil && len(b) > 0 && e.AdminURL == "" {
			e.AdminURL = "http://" + strings.TrimSpace(string(b))
		}
		if e.AdminURL != "" && e.URL == "" {
			if addr := listenerAddr(e.AdminURL); addr != "" {
				e.URL = "http://" + addr
			}
		}
		if e.URL == "" || !ok(e.AdminURL+"/ready") {
			return errors.New("no listener bound, or not /ready")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func ok(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// listenerAddr asks Envoy's admin for the port its first listener bound.
func listenerAddr(adminURL string) string {
	resp, err := http.Get(adminURL + "/listeners?format=json")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		ListenerStatuses []struct {
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.ListenerStatuses) == 0 {
		return ""
	}
	sa := out.ListenerStatuses[0].LocalAddress.SocketAddress
	if sa.PortValue == 0 {
		return ""
	}
	return net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue))
}
