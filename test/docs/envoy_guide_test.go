package docs

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil/envoytest"
)

const envoyGuide = "docs/deploy/envoy.md"

// guidePorts are the fixed ports docs/deploy/envoy.md names. The test's one
// substitution: each is moved, wherever it appears in the guide's commands
// as a whole number, to a free port of its own, so that the test runs
// beside the other tests.
var guidePorts = []string{"10000", "9901", "50051", "9090", "8001", "8002", "4317"}

// shBlock is a fenced sh block: the commands a reader pastes.
var shBlock = regexp.MustCompile("(?ms)^```sh\n(.*?)^```")

// The plain-Envoy guide works copy-paste: every sh block of
// docs/deploy/envoy.md, in order and as written, run in a fresh copy of the
// repository (its tracked and new files; no bin/, no .tools/), builds
// infergate, starts the mock pools, infergate and Envoy, and gets a streamed
// answer through Envoy. The Envoy is the tests' own, through ENVOY_BIN,
// which the guide names as the way to use your envoy.
func TestEnvoyGuideRuns(t *testing.T) {
	root := envoytest.RepoRoot
	guide, err := os.ReadFile(filepath.Join(root, envoyGuide))
	if err != nil {
		t.Fatal(err)
	}
	script, err := guideScript(string(guide), freePorts(t, len(guidePorts)))
	if err != nil {
		t.Fatal(err)
	}
	envoy := envoytest.Binary(t)
	dir := t.TempDir()
	copyCheckout(t, root, dir)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ENVOY_BIN="+envoy)
	// Its own process group: the guide starts processes in the background,
	// and a failed run must not leave them behind. Their output goes to
	// files, not pipes, which they would hold open after bash ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	logs := t.TempDir()
	stdout, stderr := createFile(t, filepath.Join(logs, "stdout")), createFile(t, filepath.Join(logs, "stderr"))
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Start()
	if runErr == nil {
		runErr = cmd.Wait()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // what the guide left running, if it failed
	}
	out, errOut := readFile(t, stdout.Name()), readFile(t, stderr.Name())
	if runErr != nil {
		t.Fatalf("the guide's commands failed: %v\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", runErr, script, out, tail(errOut, 60))
	}
	var content int
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "data: {") && strings.Contains(line, `"chat.completion.chunk"`) && strings.Contains(line, `"content":"`) {
			content++
		}
	}
	if content < 2 || !strings.Contains(out, "data: [DONE]") {
		t.Errorf("no streamed answer through Envoy (%d content chunks):\n%s\nstderr:\n%s", content, out, tail(errOut, 60))
	}
}

// guideScript is the guide's sh blocks, in order, with each of guidePorts
// replaced by its free port; every one must be there to replace.
func guideScript(guide string, ports []string) (string, error) {
	var blocks []string
	for _, m := range shBlock.FindAllStringSubmatch(guide, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) == 0 {
		return "", fmt.Errorf("%s: no sh block", envoyGuide)
	}
	script := strings.Join(blocks, "\n")
	for i, p := range guidePorts {
		re := regexp.MustCompile(`\b` + p + `\b`)
		if !re.MatchString(script) {
			return "", fmt.Errorf("%s: port %s is not in its commands (update guidePorts)", envoyGuide, p)
		}
		script = re.ReplaceAllLiteralString(script, ports[i])
	}
	return script, nil
}

func TestGuideScriptMovesEveryPort(t *testing.T) {
	guide := "text\n```sh\nserve --listen 127.0.0.1:10000 --admin 9901 # 100001 stays\n```\n```yaml\nport: 8001\n```\n" +
		"```sh\necho 50051 9090 8001 8002 4317\n```\n"
	got, err := guideScript(guide, []string{"1", "2", "3", "4", "5", "6", "7"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "serve --listen 127.0.0.1:1 --admin 2 # 100001 stays\n\necho 3 4 5 6 7\n"; got != want {
		t.Errorf("script:\n%q\nwant:\n%q", got, want)
	}
	if _, err := guideScript("```sh\necho 10000\n```\n", []string{"1", "2", "3", "4", "5", "6", "7"}); err == nil {
		t.Error("a guide that no longer names a port was accepted")
	}
}

func freePorts(t *testing.T, n int) []string {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close() // held until all are picked: n distinct ports
		_, p, _ := net.SplitHostPort(l.Addr().String())
		ports = append(ports, p)
	}
	return ports
}

// copyCheckout copies the repository's tracked and untracked-but-not-ignored
// files from root into dir: what a fresh clone of this tree holds.
func copyCheckout(t *testing.T, root, dir string) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		} else if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFile(src, dst, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func createFile(t *testing.T, path string) *os.File {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readFile(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
