package policy

// Loading a policy directory: parse, compile, and run the policy's own tests.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

// Load reads every *.rego, *.json, *.yaml and *.yml file under dir
// (recursively, skipping names that start with a dot), compiles the
// modules, runs the policies' own tests (test_* rules, as `opa test dir`
// does) and prepares the query that reads every answer (see buildQuery).
// Data files load as OPA loads them: a file at the top of dir is merged at
// the root of data, one in a sub-directory foo/ under data.foo. Any parse
// or compile error (with file:line), a failing or erroring policy test, or
// a directory without an infergate.authz.allow rule is an error. The
// input is type-checked against Input: a reference to a field that does
// not exist, such as input.request.max_token, is a compile error.
func Load(ctx context.Context, dir string) (*Engine, error) {
	res, err := loader.NewFileLoader().
		WithRegoVersion(ast.RegoV1).
		WithProcessAnnotation(true).
		Filtered([]string{dir}, skipFile)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", dir, err)
	}
	modules := res.ParsedModules()
	if len(modules) == 0 {
		return nil, fmt.Errorf("policy %s: no .rego files", dir)
	}

	compiler := ast.NewCompiler().
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(false).
		WithSchemas(inputSchemas)
	if compiler.Compile(modules); compiler.Failed() {
		return nil, fmt.Errorf("policy %s: %w", dir, compiler.Errors)
	}
	allow := ast.MustParseRef("data.infergate.authz.allow")
	if len(compiler.GetRulesExact(allow)) == 0 {
		return nil, fmt.Errorf("policy %s: no rule %s (package infergate.authz, rule allow)", dir, allow)
	}

	store := inmem.NewFromObjectWithOpts(res.Documents,
		inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	docs, err := ast.InterfaceToValue(res.Documents)
	if err != nil {
		return nil, fmt.Errorf("policy %s: data: %w", dir, err)
	}

	tests, err := runTests(ctx, modules, store)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", dir, err)
	}

	e := &Engine{modules: len(modules), tests: tests, compiler: compiler, store: store, data: dataCache{docs}}
	e.query, e.wrapped = buildQuery(compiler)
	if err := e.compileQuery(); err != nil {
		return nil, fmt.Errorf("policy %s: %w", dir, err)
	}
	return e, nil
}

// Validate loads dir as Load does (parse, compile, run the policy tests)
// and discards the result: for `infergate validate`.
func Validate(ctx context.Context, dir string) error {
	_, err := Load(ctx, dir)
	return err
}

// Tests is the number of policy tests that passed when e was loaded.
func (e *Engine) Tests() int { return e.tests }

// skipFile is the loader filter: it keeps directories and policy or data
// files, and skips names starting with a dot (editor files, and the
// ..data links of a mounted Kubernetes ConfigMap, whose files are also
// linked at the top).
func skipFile(_ string, info fs.FileInfo, depth int) bool {
	if depth == 0 {
		return false
	}
	name := info.Name()
	if strings.HasPrefix(name, ".") {
		return true
	}
	return !info.IsDir() && !isPolicyFile(name)
}

func isPolicyFile(name string) bool {
	for _, ext := range []string{".rego", ".json", ".yaml", ".yml"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// maxTestFailures bounds the failures listed in a load error.
const maxTestFailures = 10

// runTests runs the test_* rules of modules as `opa test` does, except
// that a built-in function error fails the test (Decide treats built-in
// errors as errors). It returns how many passed, or an error naming the
// tests that failed.
func runTests(ctx context.Context, modules map[string]*ast.Module, store storage.Store) (int, error) {
	ch, err := tester.NewRunner().
		SetStore(store).
		SetModules(modules).
		RaiseBuiltinErrors(true).
		SetTimeout(10*time.Second).
		RunTests(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("policy tests: %w", err)
	}
	passed := 0
	var failed []*tester.Result
	for r := range ch {
		switch {
		case r.Skip:
		case r.Pass():
			passed++
		default:
			failed = append(failed, r)
		}
	}
	if len(failed) == 0 {
		return passed, nil
	}
	slices.SortFunc(failed, func(a, b *tester.Result) int {
		if a.Location == nil || b.Location == nil {
			return strings.Compare(a.Name, b.Name)
		}
		return cmp.Or(strings.Compare(a.Location.File, b.Location.File), cmp.Compare(a.Location.Row, b.Location.Row))
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d policy tests failed:", len(failed), len(failed)+passed)
	for i, r := range failed {
		if i == maxTestFailures {
			fmt.Fprintf(&b, "\n  ... and %d more", len(failed)-i)
			break
		}
		fmt.Fprintf(&b, "\n  %s: %s.%s", r.Location, r.Package, r.Name)
		if r.Error != nil {
			fmt.Fprintf(&b, ": ERROR: %v", r.Error)
		} else {
			b.WriteString(": FAIL")
		}
		if out := strings.TrimSpace(string(r.Output)); out != "" {
			if len(out) > 500 {
				out = out[:500] + "..."
			}
			fmt.Fprintf(&b, " (printed: %s)", out)
		}
	}
	return 0, errors.New(b.String())
}
