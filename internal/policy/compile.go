package policy

// The query Decide evaluates: the answers it binds, built and compiled at load.

import (
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The answers Decide reads, in the order of the query's bindings.
var answers = [...]struct{ name, ref string }{
	{"allow", "data.infergate.authz.allow"},
	{"reason", "data.infergate.authz.reason"},
	{"status", "data.infergate.authz.status"},
	{"checks", "data.infergate.authz.checks"},
	{"max_tokens", "data.infergate.authz.max_tokens"},
	{"limits", "data.infergate.ratelimit.limits"},
	{"reserve", "data.infergate.ratelimit.reserve"},
	{"allow_unbounded", "data.infergate.authz.allow_unbounded"},
	{"fairness_id", "data.infergate.authz.fairness_id"},
	{"objective", "data.infergate.authz.objective"},
}

const (
	ansAllow = iota
	ansReason
	ansStatus
	ansChecks
	ansMaxTokens
	ansLimits
	ansReserve
	ansAllowUnbounded
	ansFairnessID
	ansObjective
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

// Query is the query Decide evaluates (see buildQuery).
func (e *Engine) Query() string { return e.query }
