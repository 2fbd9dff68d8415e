package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/infergate/infergate/internal/ratelimit"
)

// The answers Decide reads, in the order of the query's bindings.
var answers = [...]struct{ name, ref string }{
	{"allow", "data.infergate.authz.allow"},
	{"reason", "data.infergate.authz.reason"},
	{"status", "data.infergate.authz.status"},
	{"checks", "data.infergate.authz.checks"},
	{"limits", "data.infergate.ratelimit.limits"},
	{"reserve", "data.infergate.ratelimit.reserve"},
}

const (
	ansAllow = iota
	ansReason
	ansStatus
	ansChecks
	ansLimits
	ansReserve
)

// buildQuery returns the one query Decide evaluates, which binds every
// answer: a rule that is always defined (one with a default, or a set
// built with `contains`) directly, e.g. `allow := data.infergate.authz.allow`;
// any other collected into an array, empty when the policy leaves it
// undefined, e.g. `reason := [x | x := data.infergate.authz.reason]`, so
// that the query itself is always defined. wrapped says which is which.
func buildQuery(c *ast.Compiler) (query string, wrapped [len(answers)]bool) {
	lines := make([]string, len(answers))
	for i, a := range answers {
		if alwaysDefined(c.GetRulesExact(ast.MustParseRef(a.ref))) {
			lines[i] = a.name + " := " + a.ref
		} else {
			wrapped[i] = true
			lines[i] = a.name + " := [x | x := " + a.ref + "]"
		}
	}
	return strings.Join(lines, "\n"), wrapped
}

func alwaysDefined(rules []*ast.Rule) bool {
	if len(rules) == 0 {
		return false // perhaps a data document, perhaps nothing
	}
	multi := true
	for _, r := range rules {
		if r.Default {
			return true
		}
		multi = multi && r.Head.RuleKind() == ast.MultiValue
	}
	return multi
}

// Defaults for what a policy leaves undefined.
const (
	DefaultStatus      = 403
	DefaultDenyReason  = "denied by policy"
	DefaultAllowReason = "allowed by policy"
)

// errorDecision is what Decide answers with an error: a denial.
var errorDecision = Decision{Allow: false, Status: 500, Reason: "policy error"}

// Engine is one loaded, compiled and tested version of a policy directory.
// It is immutable and safe for concurrent use.
type Engine struct {
	modules int // number of .rego files
	tests   int // policy tests that passed at load
	query   string
	wrapped [len(answers)]bool
	// The compiled query, evaluated with topdown directly: rego's
	// PreparedEvalQuery would add an evaluation context, a result set and
	// a map of bindings per decision that Decide does not need.
	body     ast.Body
	qc       ast.QueryCompiler
	vars     [len(answers)]ast.Var // the variable that binds each answer
	compiler *ast.Compiler
	store    storage.Store
	data     dataCache
	memo     *memo // nil: every decision is evaluated (see Memoize)
}

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

// compileQuery compiles e.query as rego.PrepareForEval would, and finds
// the variable each answer is bound to (the compiler renames the
// variables a query declares with :=).
func (e *Engine) compileQuery() error {
	parsed, err := ast.ParseBodyWithOpts(e.query, ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		return err
	}
	e.qc = e.compiler.QueryCompiler().
		WithEnablePrintStatements(false).
		WithStrict(false)
	if e.body, err = e.qc.Compile(parsed); err != nil {
		return err
	}
	rewritten := e.qc.RewrittenVars()
	for i, a := range answers {
		e.vars[i] = ast.Var(a.name)
		for gen, orig := range rewritten {
			if string(orig) == a.name {
				e.vars[i] = gen
			}
		}
	}
	return nil
}

// Validate loads dir as Load does (parse, compile, run the policy tests)
// and discards the result: for `infergate validate`.
func Validate(ctx context.Context, dir string) error {
	_, err := Load(ctx, dir)
	return err
}

// Query is the query Decide evaluates (see buildQuery).
func (e *Engine) Query() string { return e.query }

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

// noMetrics spares every evaluation a metrics registry nobody reads.
var noMetrics = metrics.NoOp()

// Memoize makes Decide reuse the decisions of inputs that agree on every
// field the policy reads (see memo.go); call it before sharing e. It
// reports false, and leaves e as it was, for a policy whose decisions
// cannot be reused (one that reads the whole input, calls a
// non-deterministic built-in such as time.now_ns or http.send, or uses
// `with`).
func (e *Engine) Memoize() bool {
	e.memo = newMemo(e.compiler)
	return e.memo != nil
}

// MemoStats counts the decisions Decide served from the memo and those it
// evaluated; zero when not memoizing.
func (e *Engine) MemoStats() (hits, misses uint64) {
	if e.memo == nil {
		return 0, 0
	}
	return e.memo.hits.Load(), e.memo.misses.Load()
}

// Decide evaluates the policies for in. It never fails open: when the
// evaluation fails, infergate.authz.allow is undefined or not a boolean,
// or any answer is malformed (an unknown unit, a non-positive amount, a
// bad window, ...), it returns a denial (status 500, reason "policy
// error") and the error.
//
// A denial without status or reason gets 403 and "denied by policy". The
// limits, reserve and checks are returned (and validated) whether or not
// the request is allowed, for shadow mode.
func (e *Engine) Decide(ctx context.Context, in *Input) (Decision, error) {
	if in == nil {
		return errorDecision, errors.New("policy: nil input")
	}
	if err := ctx.Err(); err != nil {
		return errorDecision, fmt.Errorf("policy: %w", err)
	}
	if e.memo != nil {
		if d, ok := e.memo.get(in); ok {
			return d, nil
		}
	}
	d, r, err := e.evaluate(ctx, in)
	if err != nil {
		return errorDecision, err
	}
	if e.memo != nil {
		e.memo.put(in, d, r)
	}
	d.Reserve = r.cost(in)
	return d, nil
}

// evaluate runs the query for in: the decision, less its reservation, and
// what the policy said of the reservation.
func (e *Engine) evaluate(ctx context.Context, in *Input) (Decision, *reserveSpec, error) {
	// Cancel the evaluation with ctx, without the goroutine per evaluation
	// rego starts otherwise.
	cancel := topdown.NewCancel()
	stop := context.AfterFunc(ctx, cancel.Cancel)
	txn, err := e.store.NewTransaction(ctx)
	if err != nil {
		stop()
		return errorDecision, nil, fmt.Errorf("policy: %w", err)
	}
	vc := vcaches.Get().(*vcache)
	var (
		results int
		b       bindings
	)
	err = topdown.NewQuery(e.body).
		WithQueryCompiler(e.qc).
		WithCompiler(e.compiler).
		WithStore(e.store).
		WithTransaction(txn).
		WithInput(ast.NewTerm(in.Value())).
		WithStrictBuiltinErrors(true).
		WithCancel(cancel).
		WithMetrics(noMetrics).
		WithVirtualCache(vc).
		WithBaseCache(e.data).
		WithIndexing(true).
		WithEarlyExit(true).
		Iter(ctx, func(qr topdown.QueryResult) error {
			results++
			for i, v := range e.vars {
				b[i] = qr[v]
			}
			return nil
		})
	vc.release()
	e.store.Abort(ctx, txn)
	stop()
	if err != nil {
		return errorDecision, nil, fmt.Errorf("policy: %w", err)
	}
	if results != 1 {
		// Only an answer bound directly can be undefined, and only if the
		// evaluation went wrong without an error.
		return errorDecision, nil, fmt.Errorf("policy: query %q returned %d results", e.query, results)
	}
	d, r, err := e.decision(&b)
	if err != nil {
		return errorDecision, nil, fmt.Errorf("policy: %w", err)
	}
	return d, r, nil
}

// bindings are the answers of one evaluation, in the order of answers.
type bindings [len(answers)]*ast.Term

// answer returns the value of answer i, or nil when the policy left it
// undefined.
func (e *Engine) answer(b *bindings, i int) (ast.Value, error) {
	name := answers[i].name
	t := b[i]
	if t == nil {
		return nil, fmt.Errorf("query: no %s", name)
	}
	if !e.wrapped[i] {
		return t.Value, nil
	}
	arr, ok := t.Value.(*ast.Array)
	if !ok || arr.Len() > 1 {
		return nil, fmt.Errorf("query: %s: unexpected %v", name, t)
	}
	if arr.Len() == 0 {
		return nil, nil
	}
	return arr.Elem(0).Value, nil
}

func (e *Engine) decision(b *bindings) (Decision, *reserveSpec, error) {
	d, err := e.decisionAnswers(b)
	if err != nil {
		return d, nil, err
	}
	v, err := e.answer(b, ansReserve)
	if err != nil {
		return d, nil, err
	}
	r, err := parseReserve(v)
	return d, r, err
}

func (e *Engine) decisionAnswers(b *bindings) (Decision, error) {
	var d Decision
	v, err := e.answer(b, ansAllow)
	if err != nil {
		return d, err
	}
	if v == nil {
		return d, errors.New("infergate.authz.allow is undefined (declare `default allow := false`)")
	}
	allow, ok := v.(ast.Boolean)
	if !ok {
		return d, fmt.Errorf("infergate.authz.allow must be a boolean, got %v", v)
	}
	d.Allow = bool(allow)

	if v, err = e.answer(b, ansReason); err != nil {
		return d, err
	}
	switch s, ok := v.(ast.String); {
	case ok:
		d.Reason = string(s)
	case v != nil:
		return d, fmt.Errorf("infergate.authz.reason must be a string, got %v", v)
	case d.Allow:
		d.Reason = DefaultAllowReason
	default:
		d.Reason = DefaultDenyReason
	}

	if !d.Allow {
		if v, err = e.answer(b, ansStatus); err != nil {
			return d, err
		}
		d.Status = DefaultStatus
		if v != nil {
			n, ok := integer(v)
			if !ok || n < 400 || n > 599 {
				return d, fmt.Errorf("infergate.authz.status must be an HTTP error status (400-599), got %v", v)
			}
			d.Status = int(n)
		}
	}

	if v, err = e.answer(b, ansChecks); err != nil {
		return d, err
	}
	if d.Checks, err = parseChecks(v); err != nil {
		return d, err
	}
	if v, err = e.answer(b, ansLimits); err != nil {
		return d, err
	}
	if d.Limits, err = parseLimits(v); err != nil {
		return d, err
	}
	return d, nil
}

// elems returns the elements of a set or an array.
func elems(v ast.Value) ([]*ast.Term, bool) {
	switch v := v.(type) {
	case ast.Set:
		return v.Slice(), true
	case *ast.Array:
		out := make([]*ast.Term, v.Len())
		for i := range out {
			out[i] = v.Elem(i)
		}
		return out, true
	}
	return nil, false
}

func parseChecks(v ast.Value) ([]string, error) {
	if v == nil {
		return nil, nil
	}
	ts, ok := elems(v)
	if !ok {
		return nil, fmt.Errorf("infergate.authz.checks must be a set of strings, got %v", v)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		s, ok := t.Value.(ast.String)
		if !ok || s == "" {
			return nil, fmt.Errorf("infergate.authz.checks: want non-empty strings, got %v", t)
		}
		out = append(out, string(s))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Object keys of the answers.
var (
	keyName         = ast.StringTerm("name")
	keyKey          = ast.StringTerm("key")
	keyUnit         = ast.StringTerm("unit")
	keyAmount       = ast.StringTerm("amount")
	keyWindow       = ast.StringTerm("window")
	keyInputTokens  = ast.StringTerm("input_tokens")
	keyOutputTokens = ast.StringTerm("output_tokens")
)

// MinWindow is the shortest window a limit may have.
const MinWindow = time.Second

func parseLimits(v ast.Value) ([]ratelimit.Limit, error) {
	if v == nil {
		return nil, nil
	}
	ts, ok := elems(v)
	if !ok {
		return nil, fmt.Errorf("infergate.ratelimit.limits must be a set or array of objects, got %v", v)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	out := make([]ratelimit.Limit, 0, len(ts))
	for i, t := range ts {
		l, err := parseLimit(t.Value)
		if err != nil {
			return nil, fmt.Errorf("infergate.ratelimit.limits[%d] %v: %w", i, t, err)
		}
		for _, o := range out {
			if o.Key == l.Key && o.Unit == l.Unit && o.Window == l.Window {
				return nil, fmt.Errorf("infergate.ratelimit.limits: %q and %q share key %q, unit %s and window %s",
					o.Name, l.Name, l.Key, l.Unit, l.Window)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

func parseLimit(v ast.Value) (ratelimit.Limit, error) {
	var l ratelimit.Limit
	obj, ok := v.(ast.Object)
	if !ok {
		return l, errors.New("not an object")
	}
	if err := onlyKeys(obj, keyName, keyKey, keyUnit, keyAmount, keyWindow); err != nil {
		return l, err
	}
	var err error
	if l.Name, err = nonEmptyString(obj, keyName); err != nil {
		return l, err
	}
	if l.Key, err = nonEmptyString(obj, keyKey); err != nil {
		return l, err
	}
	unit, err := nonEmptyString(obj, keyUnit)
	if err != nil {
		return l, err
	}
	switch l.Unit = ratelimit.Unit(unit); l.Unit {
	case ratelimit.Requests, ratelimit.InputTokens, ratelimit.OutputTokens, ratelimit.TotalTokens:
	default:
		return l, fmt.Errorf("unknown unit %q (want requests, input_tokens, output_tokens or total_tokens)", unit)
	}
	amount := obj.Get(keyAmount)
	if amount == nil {
		return l, errors.New("no amount")
	}
	if n, ok := integer(amount.Value); !ok || n <= 0 {
		return l, fmt.Errorf("amount must be a positive integer, got %v", amount)
	} else {
		l.Amount = n
	}
	window, err := nonEmptyString(obj, keyWindow)
	if err != nil {
		return l, err
	}
	if l.Window, err = time.ParseDuration(window); err != nil {
		return l, fmt.Errorf("window: %w", err)
	}
	if l.Window < MinWindow {
		return l, fmt.Errorf("window %s is shorter than %s", window, MinWindow)
	}
	return l, nil
}

// reserveSpec is what infergate.ratelimit.reserve says; a field it leaves
// out (-1) keeps its default, taken from the input.
type reserveSpec struct{ input, output int64 }

// parseReserve reads {"input_tokens": n, "output_tokens": m}; nil when the
// policy leaves reserve undefined.
func parseReserve(v ast.Value) (*reserveSpec, error) {
	if v == nil {
		return nil, nil
	}
	obj, ok := v.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("infergate.ratelimit.reserve must be an object, got %v", v)
	}
	if err := onlyKeys(obj, keyInputTokens, keyOutputTokens); err != nil {
		return nil, fmt.Errorf("infergate.ratelimit.reserve: %w", err)
	}
	r := &reserveSpec{input: -1, output: -1}
	for _, f := range []struct {
		key *ast.Term
		dst *int64
	}{{keyInputTokens, &r.input}, {keyOutputTokens, &r.output}} {
		t := obj.Get(f.key)
		if t == nil {
			continue
		}
		n, ok := integer(t.Value)
		if !ok || n < 0 {
			return nil, fmt.Errorf("infergate.ratelimit.reserve.%s must be a non-negative integer, got %v", f.key.Value, t)
		}
		*f.dst = n
	}
	return r, nil
}

// cost is the reservation for in: the policy's numbers, the estimated
// prompt and max_tokens where it gave none; nil without a reserve.
func (r *reserveSpec) cost(in *Input) *ratelimit.Cost {
	if r == nil {
		return nil
	}
	c := &ratelimit.Cost{Requests: 1, InputTokens: r.input, OutputTokens: r.output}
	if r.input < 0 {
		c.InputTokens = int64(in.Request.EstimatedPromptTokens)
	}
	if r.output < 0 {
		c.OutputTokens = int64(in.Request.MaxTokens)
	}
	return c
}

func onlyKeys(obj ast.Object, keys ...*ast.Term) error {
	for _, k := range obj.Keys() {
		if !slices.ContainsFunc(keys, k.Equal) {
			return fmt.Errorf("unknown field %v", k)
		}
	}
	return nil
}

func nonEmptyString(obj ast.Object, key *ast.Term) (string, error) {
	t := obj.Get(key)
	if t == nil {
		return "", fmt.Errorf("no %v", key)
	}
	s, ok := t.Value.(ast.String)
	if !ok || s == "" {
		return "", fmt.Errorf("%v must be a non-empty string, got %v", key, t)
	}
	return string(s), nil
}

// integer returns v as an int64 if it is a whole number in range.
func integer(v ast.Value) (int64, bool) {
	n, ok := v.(ast.Number)
	if !ok {
		return 0, false
	}
	if i, ok := n.Int64(); ok {
		return i, true
	}
	f, ok := n.Float64()
	if !ok || f != math.Trunc(f) || math.Abs(f) >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}
