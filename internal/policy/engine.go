package policy

// The Engine and its evaluation: Decide, memoization, and the topdown query run.

import (
	"context"
	"errors"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/topdown"
)

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

// errorDecision is what Decide answers with an error: a denial.
var errorDecision = Decision{Allow: false, Status: 500, Reason: "policy error"}

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
// limits, max_tokens cap, reserve and checks are returned (and validated)
// whether or not the request is allowed, for shadow mode. A decision may
// be a memoized one: its slices and Reserve are shared, never to be
// written to.
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
	d, err := e.evaluate(ctx, in)
	if err != nil {
		return errorDecision, err
	}
	if e.memo != nil {
		e.memo.put(in, d)
	}
	return d, nil
}

// evaluate runs the query for in.
func (e *Engine) evaluate(ctx context.Context, in *Input) (Decision, error) {
	// Cancel the evaluation with ctx, without the goroutine per evaluation
	// rego starts otherwise.
	cancel := topdown.NewCancel()
	stop := context.AfterFunc(ctx, cancel.Cancel)
	txn, err := e.store.NewTransaction(ctx)
	if err != nil {
		stop()
		return errorDecision, fmt.Errorf("policy: %w", err)
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
		return errorDecision, fmt.Errorf("policy: %w", err)
	}
	if results != 1 {
		// Only an answer bound directly can be undefined, and only if the
		// evaluation went wrong without an error.
		return errorDecision, fmt.Errorf("policy: query %q returned %d results", e.query, results)
	}
	d, err := e.decision(&b)
	if err != nil {
		return errorDecision, fmt.Errorf("policy: %w", err)
	}
	return d, nil
}
