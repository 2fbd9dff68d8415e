// Package layout keeps the import graph pointing one way: the contract at
// the bottom, the Envoy adapter and the control plane on it, the command
// line on top (docs/architecture.md draws it). A change that makes a
// package import "upward" fails here, naming the import.
package layout

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/infergate/infergate"

// rule forbids the packages matching from to import the packages matching
// to (patterns are module-relative; "x/..." is x and everything below it),
// except imports by allowFrom or of allowTo.
type rule struct {
	why                string
	from, to           []string
	allowFrom, allowTo []string
}

var rules = []rule{
	{why: "the contract is a leaf: it imports nothing of the project but internal/openai",
		from: []string{"internal/request"}, to: []string{"..."}, allowTo: []string{"internal/openai"}},
	{why: "internal/stats and internal/openai are leaves",
		from: []string{"internal/stats", "internal/openai"}, to: []string{"..."}},
	{why: "the controller is pure logic: no I/O, no configuration, no Envoy",
		from: []string{"xds/controller"}, to: []string{"..."}, allowTo: []string{"internal/stats"}},
	{why: "the Envoy adapter is imported only by the composition root",
		from: []string{"..."}, to: []string{"extproc"}, allowFrom: []string{"internal/cli"}},
	{why: "the Envoy adapter is configured through its own Options, not the configuration file's types",
		from: []string{"extproc"}, to: []string{"internal/config", "internal/cli", "xds/..."}},
	{why: "only the composition root reads the configuration file's types: the domain packages take options of their own",
		from: []string{"..."}, to: []string{"internal/config"}, allowFrom: []string{"internal/cli", "internal/compose", "cmd/...", "internal/config/..."}},
	{why: "nothing imports the command line but main",
		from: []string{"..."}, to: []string{"internal/cli"}, allowFrom: []string{"cmd/infergate"}},
	{why: "the parts both composition roots build alike are imported by those roots only",
		from: []string{"..."}, to: []string{"internal/compose"}, allowFrom: []string{"internal/cli", "cmd/infergate-module"}},
	{why: "what the module links stays lean: no ext_proc adapter, no command line, no control plane but the feed it publishes to",
		from: []string{"internal/compose"}, to: []string{"extproc", "internal/cli", "xds/..."}, allowTo: []string{"xds/feed"}},
	{why: "the dynamic-module adapter is imported only by the composition root",
		from: []string{"..."}, to: []string{"module"}, allowFrom: []string{"internal/compose", "cmd/infergate-module"}},
	{why: "the dynamic-module adapter is configured through its own Options, and is not the ext_proc adapter",
		from: []string{"module"}, to: []string{"internal/config", "internal/cli", "xds/...", "extproc"}},
	{why: "the product does not depend on the lab (bench/, a module and binary of its own: infergate-bench)",
		from: []string{"extproc/...", "module/...", "xds/...", "internal/...", "cmd/..."}, to: []string{"bench/..."}},
	{why: "the control plane does not reach into the request path's policy side",
		from: []string{"xds/..."}, to: []string{"internal/admission", "internal/policy", "internal/ratelimit", "internal/identity", "internal/requestlog"}},
	{why: "test helpers stay in tests (and the overhead harness, a lab program of its own, which runs processes as they do)",
		from: []string{"extproc/...", "xds/...", "internal/...", "bench/...", "cmd/..."}, to: []string{"internal/testutil/..."},
		allowFrom: []string{"internal/testutil/...", "bench/overhead"}},
}

// The cores a second adapter (a dynamic module inside Envoy) calls as the
// ext_proc adapter does: no Envoy, gRPC or protobuf types, not even
// through what they import.
var (
	cores     = []string{"internal/gate", "internal/meter", "internal/tally", "internal/request"}
	transport = []string{"github.com/envoyproxy/go-control-plane", "google.golang.org/grpc", "google.golang.org/protobuf"}
)

// transportDeps lists the dependencies of a core (full import paths) that
// are Envoy's or gRPC's types.
func transportDeps(deps []string) []string {
	var out []string
	for _, d := range deps {
		for _, t := range transport {
			if d == t || strings.HasPrefix(d, t+"/") {
				out = append(out, d)
			}
		}
	}
	return out
}

func match(pkg string, patterns []string) bool {
	for _, p := range patterns {
		switch {
		case p == "...":
			return true
		case strings.HasSuffix(p, "/..."):
			base := strings.TrimSuffix(p, "/...")
			if pkg == base || strings.HasPrefix(pkg, base+"/") {
				return true
			}
		case pkg == p:
			return true
		}
	}
	return false
}

// violations lists the imports (of module-relative package names) that
// break a rule.
func violations(imports map[string][]string) []string {
	var out []string
	for from, deps := range imports {
		for _, to := range deps {
			for _, r := range rules {
				if from == to || !match(from, r.from) || !match(to, r.to) || match(from, r.allowFrom) || match(to, r.allowTo) {
					continue
				}
				out = append(out, from+" imports "+to+": "+r.why)
			}
		}
	}
	return out
}

// projectImports reads the non-test imports of every package of the
// product's module and of the lab's (bench/go.mod).
func projectImports(t *testing.T) map[string][]string {
	t.Helper()
	var out []byte
	for _, m := range []struct{ dir, pattern string }{{"../..", module + "/..."}, {"../../bench", module + "/bench/..."}} {
		cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, m.pattern)
		cmd.Dir = m.dir
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", m.pattern, err)
		}
		out = append(out, b...)
	}
	rel := func(p string) (string, bool) {
		if p == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		from, _ := rel(fields[0])
		if strings.HasPrefix(from, "test/") {
			continue // test suites may reach anything
		}
		imports[from] = []string{}
		for _, imp := range fields[1:] {
			if to, ok := rel(imp); ok {
				imports[from] = append(imports[from], to)
			}
		}
	}
	return imports
}

func TestImportsPointOneWay(t *testing.T) {
	imports := projectImports(t)
	for _, must := range []string{"internal/request", "extproc", "xds/controller", "xds/routing", "internal/cli", "bench/command", "bench/cmd/infergate-bench"} {
		if _, ok := imports[must]; !ok {
			t.Errorf("package %s not found: update the rules with the layout", must)
		}
	}
	for _, v := range violations(imports) {
		t.Error(v)
	}
}

func TestCoresHaveNoTransport(t *testing.T) {
	for _, c := range cores {
		cmd := exec.Command("go", "list", "-deps", module+"/"+c)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c, err)
		}
		if bad := transportDeps(strings.Fields(string(out))); len(bad) > 0 {
			t.Errorf("%s depends on %v: the cores take no Envoy, gRPC or protobuf types (the adapters decode them)", c, bad)
		}
	}
	if got := transportDeps([]string{"fmt", "google.golang.org/protobuf/types/known/structpb", "github.com/envoyproxy/go-control-plane/envoy/config/core/v3",
		"google.golang.org/grpc", "google.golang.org/grpcx"}); len(got) != 3 {
		t.Errorf("transportDeps caught %v, want the protobuf, go-control-plane and grpc packages", got)
	}
}

// The dynamic module is linked into Envoy's process: it carries no
// ext_proc or xDS server, no Kubernetes client and no command line, not
// even through what it imports (an 85 MB library when it did).
func TestModuleLinksNoServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", module+"/cmd/infergate-module")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps cmd/infergate-module: %v", err)
	}
	for _, d := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/envoyproxy/go-control-plane", "k8s.io/client-go", module + "/extproc", module + "/internal/cli",
			module + "/xds/server", module + "/xds/routing", module + "/xds/weightsink", module + "/xds/gatewayext", module + "/xds/poolpods"} {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("cmd/infergate-module depends on %s", d)
			}
		}
	}
}

// The rules catch what they are for.
func TestRulesCatchUpwardImports(t *testing.T) {
	for _, bad := range [][2]string{
		{"internal/request", "extproc"},
		{"internal/request", "internal/config"},
		{"xds/controller", "internal/config"},
		{"internal/admission", "extproc"},
		{"xds/routing", "internal/cli"},
		{"xds/routing", "bench/loadgen"},
		{"internal/cli", "bench/command"},
		{"extproc", "internal/config"},
		{"internal/requestlog", "internal/testutil"},
		{"internal/admission", "internal/config"},
		{"internal/telemetry", "internal/config"},
		{"xds/routing", "internal/config"},
		{"bench/command", "internal/config"},
		{"bench/command", "internal/testutil"},
		{"cmd/infergate-module", "internal/cli"},
		{"internal/compose", "extproc"},
		{"internal/compose", "xds/routing"},
		{"internal/cli", "module"},
	} {
		if v := violations(map[string][]string{bad[0]: {bad[1]}}); len(v) == 0 {
			t.Errorf("%s importing %s is not caught", bad[0], bad[1])
		}
	}
	for _, ok := range [][2]string{
		{"internal/request", "internal/openai"},
		{"xds/controller", "internal/stats"},
		{"internal/cli", "extproc"},
		{"cmd/infergate", "internal/cli"},
		{"xds/routing", "internal/request"},
		{"internal/testutil/envoytest", "internal/testutil"},
		{"internal/cli", "internal/config"},
		{"cmd/infergate", "internal/config"},
		{"internal/config/configdoc", "internal/config"},
		{"bench/overhead", "internal/testutil"},
		{"internal/compose", "internal/config"},
		{"internal/compose", "xds/feed"},
		{"internal/compose", "module"},
		{"cmd/infergate-module", "internal/compose"},
		{"internal/cli", "internal/compose"},
	} {
		if v := violations(map[string][]string{ok[0]: {ok[1]}}); len(v) > 0 {
			t.Errorf("%s importing %s is refused: %v", ok[0], ok[1], v)
		}
	}
}

// docs/architecture.md walks every package: one that is not named there
// (its module-relative path, or for a nested helper its last element, in a
// code span) is a package a newcomer cannot place.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(b), -1) {
		for _, f := range strings.FieldsFunc(m[1], func(r rune) bool { return r == ' ' || r == ',' || r == '(' || r == ')' }) {
			named[strings.TrimSuffix(strings.TrimSuffix(f, "/"), "/...")] = true
		}
	}
	for pkg := range projectImports(t) {
		if pkg == "." || named[pkg] || named[path.Base(pkg)] {
			continue
		}
		t.Errorf("docs/architecture.md does not name package %s", pkg)
	}
}
