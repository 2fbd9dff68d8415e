package policy

// Loading a policy directory: parse, compile, and run the policy's own tests.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"
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
	failedAt := explainFailures(ctx, modules, store, failed[:min(len(failed), maxTestFailures)])
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
			if at := failedAt[r.Package+"."+r.Name]; at != "" {
				b.WriteString(" at " + at)
			}
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

// maxShownValue bounds each value a failure line shows.
const maxShownValue = 200

// explainFailures runs the failed tests again, traced (only they pay for
// tracing, and only when a load fails), and says for each where it failed
// as `opa test` does: the expression that did not hold, with its file and
// line, and the values its variables had there. Keyed by package.name; a
// test whose trace says nothing is left out.
func explainFailures(ctx context.Context, modules map[string]*ast.Module, store storage.Store, failed []*tester.Result) map[string]string {
	names := make([]string, 0, len(failed))
	for _, r := range failed {
		if r.Error == nil {
			names = append(names, regexp.QuoteMeta(r.Package+"."+r.Name))
		}
	}
	if len(names) == 0 {
		return nil
	}
	ch, err := tester.NewRunner().
		SetStore(store).
		SetModules(modules).
		RaiseBuiltinErrors(true).
		EnableTracing(true).
		Filter("^("+strings.Join(names, "|")+")$").
		SetTimeout(10*time.Second).
		RunTests(ctx, nil)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for r := range ch {
		if i := failingEvent(r.Trace); i >= 0 {
			out[r.Package+"."+r.Name] = describeFailure(r.Trace[:i+1])
		}
	}
	return out
}

// failingEvent is the index of the last expression of a test's own
// queries that failed: where the test went wrong (an every's body is looked
// into, not the every); -1 if none.
func failingEvent(trace []*topdown.Event) int {
	for i, e := range slices.Backward(trace) {
		if e.Op != topdown.FailOp || e.Location == nil || e.QueryID == 0 {
			continue
		}
		if expr, ok := e.Node.(*ast.Expr); ok {
			if _, every := expr.Terms.(*ast.Every); every {
				continue
			}
		}
		return i
	}
	return -1
}

// describeFailure is the failed expression (trace's last event) as written
// (its with modifiers left out: the test's fixtures), at its file:line,
// then each variable, or rule of the policy, it reads with the value it
// had: one line.
func describeFailure(trace []*topdown.Event) string {
	e := trace[len(trace)-1]
	text := string(e.Location.Text)
	expr, ok := e.Node.(*ast.Expr)
	if ok && len(expr.With) > 0 && expr.With[0].Location != nil && expr.With[0].Location.File == e.Location.File {
		if cut := expr.With[0].Location.Offset - e.Location.Offset; cut > 0 && cut <= len(text) {
			text = text[:cut]
		}
	}
	text = strings.Join(strings.Fields(text), " ")
	if len(text) > maxShownValue {
		text = text[:maxShownValue] + "..."
	}
	s := fmt.Sprintf("%s:%d: %s", e.Location.File, e.Location.Row, text)
	if !ok || e.Locals == nil {
		return s
	}
	var vals []string
	seen := map[string]bool{}
	// The expression's own terms: not its with modifiers' values.
	walk := &ast.Expr{Terms: expr.Terms, Negated: expr.Negated}
	ast.WalkTerms(walk, func(t *ast.Term) bool {
		if t.Location == nil {
			return false
		}
		var v ast.Value
		switch x := t.Value.(type) {
		case ast.Var:
			v = e.Locals.Get(x)
		case ast.Ref:
			if x.HasPrefix(ast.DefaultRootRef) {
				v = ruleValue(trace, x)
			} else if head, ok := x[0].Value.(ast.Var); ok && len(x) > 1 {
				if base := e.Locals.Get(head); base != nil {
					v, _ = base.Find(x[1:])
				}
			}
		default:
			return false
		}
		name := strings.Join(strings.Fields(string(t.Location.Text)), " ")
		if v == nil || name == "" || seen[name] || strings.HasPrefix(name, "__") {
			return v != nil
		}
		seen[name] = true
		shown := v.String()
		if len(shown) > maxShownValue {
			shown = shown[:maxShownValue] + "..."
		}
		vals = append(vals, name+" = "+shown)
		return true
	})
	if len(vals) > 0 {
		s += " (" + strings.Join(vals, ", ") + ")"
	}
	return s
}

// ruleValue is what ref (data.pkg.rule, or a path into it) was in the
// trace's last evaluation of the rule: its value when the rule was last
// left. Only rules of one value (not functions, not sets or objects built
// by contains); nil when the trace does not say.
func ruleValue(trace []*topdown.Event, ref ast.Ref) ast.Value {
	for _, e := range slices.Backward(trace) {
		r, ok := e.Node.(*ast.Rule)
		if !ok || e.Op != topdown.ExitOp || len(r.Head.Args) > 0 || r.Head.RuleKind() != ast.SingleValue {
			continue
		}
		path := r.Path()
		if !ref.HasPrefix(path) {
			continue
		}
		var v ast.Value
		switch hv := r.Head.Value.Value.(type) {
		case ast.Var:
			v = e.Locals.Get(hv)
		default:
			if ast.IsConstant(hv) {
				v = hv
			}
		}
		if v == nil {
			return nil
		}
		v, _ = v.Find(ref[len(path):])
		return v
	}
	return nil
}
