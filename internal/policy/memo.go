package policy

import (
	"encoding/binary"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"
)

// Decision memo.
//
// A decision is a pure function of the input and the policy version (its
// modules and data never change; a reload is a new Engine), unless the
// policy calls a non-deterministic built-in (time.now_ns, http.send,
// rand.intn, ...). And a policy reads only a few input fields: the example
// policies read the tenant, the principal, the tier label, the path, the
// API, the method, the model and max_tokens — never the request id or the
// usage counters. So decisions are memoized per
// policy version, keyed by exactly the input fields the rules the query
// reaches refer to (found by walking them once at load). Requests that
// agree on those fields get the same decision without an evaluation.
//
// A policy that reads the whole input, calls a non-deterministic built-in
// or rewrites the input with `with` is never memoized.

// memoSize bounds the decisions kept per policy version (two generations
// of memoSize/2: the older is dropped when the newer fills up), and
// maxMemoKey the size of one key: the fields a policy reads may include
// headers a client controls, so an input with a longer key is evaluated
// every time instead of kept. Keys and decisions together stay within a
// few MiB whatever clients send (a decision's reason is bounded by the
// stamp, its strings by what the policy writes).
const (
	memoSize   = 4096
	maxMemoKey = 1024
)

// memo holds one policy version's decisions.
type memo struct {
	paths [][]string // input paths the policy reads, sorted

	mu       sync.Mutex
	cur, old map[string]*memoEntry

	hits, misses atomic.Uint64
}

// memoEntry is a decision. It holds nothing computed from input the key
// may not hold: the reservation defaults are the gate's (see parseReserve).
type memoEntry struct {
	d Decision
}

var keyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// get returns the memoized decision for in.
func (m *memo) get(in *Input) (Decision, bool) {
	bp := keyBufs.Get().(*[]byte)
	key := appendKey((*bp)[:0], in, m.paths)
	m.mu.Lock()
	e := m.cur[string(key)] // no allocation: the conversion is only a lookup
	if e == nil {
		if e = m.old[string(key)]; e != nil {
			m.insert(string(key), e)
		}
	}
	m.mu.Unlock()
	*bp = key
	keyBufs.Put(bp)
	if e == nil {
		m.misses.Add(1)
		return Decision{}, false
	}
	m.hits.Add(1)
	return e.d, true // the slices are shared, and never written to
}

// put memoizes a decision evaluated for in.
func (m *memo) put(in *Input, d Decision) {
	b := appendKey(nil, in, m.paths)
	if len(b) > maxMemoKey {
		return
	}
	if len(d.Reason) > maxMemoKey {
		return // a reason quoting a client's input: not kept either
	}
	key := string(b)
	m.mu.Lock()
	m.insert(key, &memoEntry{d: d})
	m.mu.Unlock()
}

func (m *memo) insert(key string, e *memoEntry) {
	if len(m.cur) >= memoSize/2 {
		m.old, m.cur = m.cur, make(map[string]*memoEntry, memoSize/2)
	}
	m.cur[key] = e
}

// newMemo analyses the rules the query can reach; nil when the policy's
// decisions cannot be memoized.
func newMemo(c *ast.Compiler) *memo {
	var roots []*ast.Rule
	for _, a := range answers {
		roots = append(roots, c.GetRulesDynamicWithOpts(ast.MustParseRef(a.ref), ast.RulesOptions{})...)
	}
	if len(roots) == 0 {
		return nil
	}
	seen := map[*ast.Rule]bool{}
	queue := roots
	paths := map[string][]string{}
	ok := true
	for len(queue) > 0 && ok {
		r := queue[0]
		queue = queue[1:]
		for ; r != nil; r = r.Else {
			if seen[r] {
				continue
			}
			seen[r] = true
			ok = ok && readsOf(r, paths)
			if c.Graph != nil {
				for dep := range c.Graph.Dependencies(util.T(r)) {
					if d, isRule := dep.(*ast.Rule); isRule && !seen[d] {
						queue = append(queue, d)
					}
				}
			}
		}
	}
	if !ok || c.Graph == nil {
		return nil
	}
	m := &memo{cur: map[string]*memoEntry{}}
	for _, p := range paths {
		m.paths = append(m.paths, p)
	}
	slices.SortFunc(m.paths, func(a, b []string) int { return slices.Compare(a, b) })
	// A path under another one adds nothing to the key.
	m.paths = slices.CompactFunc(m.paths, func(a, b []string) bool { return len(b) > len(a) && slices.Equal(b[:len(a)], a) })
	for _, p := range m.paths {
		if !readable(p) {
			return nil
		}
	}
	return m
}

// readsOf adds the input paths r refers to (the longest constant prefix of
// each input reference) to paths; false when r defeats memoizing.
func readsOf(r *ast.Rule, paths map[string][]string) bool {
	ok := true
	ast.WalkRefs(r, func(ref ast.Ref) bool {
		if !ref[0].Equal(ast.InputRootDocument) {
			return false
		}
		var p []string
		for _, t := range ref[1:] {
			s, isString := t.Value.(ast.String)
			if !isString {
				break
			}
			p = append(p, string(s))
		}
		if len(p) == 0 {
			ok = false // the whole input
		}
		paths[strings.Join(p, "\x00")] = p
		return false
	})
	ast.WalkExprs(r, func(e *ast.Expr) bool {
		if len(e.With) > 0 {
			ok = false
		}
		if e.IsCall() {
			if b := ast.BuiltinMap[e.Operator().String()]; b != nil && b.Nondeterministic {
				ok = false
			}
		}
		return false
	})
	return ok
}

// readable reports whether appendKey can key on input path p.
func readable(p []string) bool {
	switch p[0] {
	case "tenant":
		return len(p) == 1
	case "labels", "usage", "cost":
		return true
	case "principal":
		return len(p) == 1 || slices.Contains([]string{"id", "type", "claims", "budget_month"}, p[1])
	case "request":
		return len(p) == 1 || slices.Contains([]string{"method", "path", "api", "headers", "model", "virtual_model",
			"stream", "max_tokens", "choices", "estimated_prompt_tokens", "previous_response_id",
			"background", "conversation", "prompt_id", "store"}, p[1])
	}
	return false
}

// appendKey appends the values of in at paths, unambiguously: each value
// is length-prefixed, an absent map key is marked as such.
func appendKey(b []byte, in *Input, paths [][]string) []byte {
	str := func(s string) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	num := func(n int64) { b = binary.AppendVarint(b, n) }
	strMap := func(m map[string]string, rest []string) {
		if len(rest) > 0 {
			v, found := m[rest[0]]
			b = append(b, boolByte(found))
			str(v)
			return
		}
		if m == nil { // null, unlike {}
			num(-1)
			return
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		num(int64(len(keys)))
		for _, k := range keys {
			str(k)
			str(m[k])
		}
	}
	for _, p := range paths {
		switch p[0] {
		case "tenant":
			str(in.Tenant)
		case "labels":
			strMap(in.Labels, p[1:])
		case "usage":
			if len(p) == 1 || p[1] == "requests" {
				num(in.Usage.Requests)
			}
			if len(p) == 1 || p[1] == "tokens" {
				num(in.Usage.Tokens)
			}
		case "principal":
			pr := &in.Principal
			if len(p) == 1 || p[1] == "id" {
				str(pr.ID)
			}
			if len(p) == 1 || p[1] == "type" {
				str(pr.Type)
			}
			if len(p) == 1 || p[1] == "claims" {
				var v any = pr.Claims
				if len(p) > 2 && pr.Claims != nil {
					v = pr.Claims[p[2]] // the whole claim: deeper paths are within it
				}
				j, _ := json.Marshal(v) // map keys sorted: deterministic
				str(string(j))
			}
			if len(p) == 1 || p[1] == "budget_month" {
				num(pr.BudgetMonth)
			}
		case "cost":
			// The whole of it, whatever part was read: a few numbers.
			c := &in.Cost
			str(c.Currency)
			b = append(b, boolByte(c.Priced))
			num(c.Price.Input)
			num(c.Price.CachedInput)
			num(c.Price.CacheWriteInput)
			num(c.Price.Output)
			num(c.Reservation.InputTokens)
			num(c.Reservation.OutputTokens)
			num(c.Reservation.Cost)
		case "request":
			r := &in.Request
			all := len(p) == 1
			field := ""
			if !all {
				field = p[1]
			}
			if all || field == "method" {
				str(r.Method)
			}
			if all || field == "path" {
				str(r.Path)
			}
			if all || field == "api" {
				str(r.API)
			}
			if all || field == "headers" {
				if all {
					strMap(r.Headers, nil)
				} else {
					strMap(r.Headers, p[2:])
				}
			}
			if all || field == "model" {
				str(r.Model)
			}
			if all || field == "virtual_model" {
				str(r.VirtualModel)
			}
			if all || field == "stream" {
				b = append(b, boolByte(r.Stream))
			}
			if all || field == "max_tokens" {
				num(int64(r.MaxTokens))
			}
			if all || field == "choices" {
				num(int64(r.Choices))
			}
			if all || field == "estimated_prompt_tokens" {
				num(int64(r.EstimatedPromptTokens))
			}
			if all || field == "previous_response_id" {
				str(r.PreviousResponseID)
			}
			if all || field == "background" {
				b = append(b, boolByte(r.Background))
			}
			if all || field == "conversation" {
				str(r.Conversation)
			}
			if all || field == "prompt_id" {
				str(r.PromptID)
			}
			if all || field == "store" {
				b = append(b, boolByte(r.Store))
			}
		}
	}
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
