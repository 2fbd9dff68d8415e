package policy

// Reading an evaluation's answers into a Decision, validating each answer.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// Defaults for what a policy leaves undefined.
const (
	DefaultStatus      = 403
	DefaultDenyReason  = "denied by policy"
	DefaultAllowReason = "allowed by policy"
)

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

func (e *Engine) decision(b *bindings) (Decision, error) {
	d, err := e.decisionAnswers(b)
	if err != nil {
		return d, err
	}
	v, err := e.answer(b, ansReserve)
	if err != nil {
		return d, err
	}
	d.Reserve, err = parseReserve(v)
	return d, err
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
	if v, err = e.answer(b, ansAllowUnbounded); err != nil {
		return d, err
	}
	if d.AllowUnbounded, err = parseAllowUnbounded(v); err != nil {
		return d, err
	}
	if v, err = e.answer(b, ansMaxTokens); err != nil {
		return d, err
	}
	if v != nil {
		// A client's max_tokens is at most MaxInt32 (internal/openai): so
		// is a cap, and a reservation of it times the choices stays far
		// from overflowing.
		n, ok := integer(v)
		if !ok || n < 1 || n > math.MaxInt32 {
			return d, fmt.Errorf("infergate.authz.max_tokens must be a positive integer up to %d, got %v", math.MaxInt32, v)
		}
		d.MaxTokens = int(n)
	}
	if v, err = e.answer(b, ansLimits); err != nil {
		return d, err
	}
	if d.Limits, err = parseLimits(v); err != nil {
		return d, err
	}
	if v, err = e.answer(b, ansFairnessID); err != nil {
		return d, err
	}
	if d.FairnessID, err = pickerString(v, "fairness_id", request.ValidFairnessID,
		fmt.Sprintf("1 to %d letters, digits or -._~:/@+", request.MaxFairnessIDBytes)); err != nil {
		return d, err
	}
	if v, err = e.answer(b, ansObjective); err != nil {
		return d, err
	}
	d.Objective, err = pickerString(v, "objective", request.ValidObjective,
		"an InferenceObjective's name (lower-case RFC 1123 subdomain)")
	return d, err
}

// pickerString reads an answer that goes to the Endpoint Picker as a
// header: a string that valid accepts, or undefined ("").
func pickerString(v ast.Value, name string, valid func(string) bool, want string) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(ast.String)
	if !ok || !valid(string(s)) {
		return "", fmt.Errorf("infergate.authz.%s must be %s, got %v", name, want, v)
	}
	return string(s), nil
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

// parseAllowUnbounded reads a set of UnboundedFields; a name the gate does
// not know is an error (a typo must not read as an opt-in to nothing, nor
// an opt-in to something else).
func parseAllowUnbounded(v ast.Value) ([]string, error) {
	if v == nil {
		return nil, nil
	}
	ts, ok := elems(v)
	if !ok {
		return nil, fmt.Errorf("infergate.authz.allow_unbounded must be a set of strings, got %v", v)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		s, ok := t.Value.(ast.String)
		if !ok || !slices.Contains(UnboundedFields, string(s)) {
			return nil, fmt.Errorf("infergate.authz.allow_unbounded: want one of %q, got %v", UnboundedFields, t)
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
					o.Name, l.Name, l.Key, l.Unit, ratelimit.WindowName(l.Window))
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
	case ratelimit.Requests, ratelimit.InputTokens, ratelimit.OutputTokens, ratelimit.TotalTokens, ratelimit.Money:
	default:
		return l, fmt.Errorf("unknown unit %q (want requests, input_tokens, output_tokens, total_tokens or money)", unit)
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
	if window == "month" {
		l.Window = ratelimit.Month // the calendar month, UTC: no duration
		return l, nil
	}
	if l.Window, err = time.ParseDuration(window); err != nil {
		return l, fmt.Errorf("window: %w", err)
	}
	if l.Window < MinWindow {
		return l, fmt.Errorf("window %s is shorter than %s", window, MinWindow)
	}
	return l, nil
}

// parseReserve reads {"input_tokens": n, "output_tokens": m}; nil when the
// policy leaves reserve undefined, Unset for a field it leaves out. The
// defaults are the gate's (internal/admission): the output default
// depends on its configuration, and leaving both to it keeps a memoized
// decision free of input fields the policy never read.
func parseReserve(v ast.Value) (*ratelimit.Cost, error) {
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
	r := &ratelimit.Cost{Requests: 1, InputTokens: Unset, OutputTokens: Unset}
	for _, f := range []struct {
		key *ast.Term
		dst *int64
	}{{keyInputTokens, &r.InputTokens}, {keyOutputTokens, &r.OutputTokens}} {
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
