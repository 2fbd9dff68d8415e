package policy

import (
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// vcache is a topdown.VirtualCache for one evaluation: the few virtual
// documents a decision computes are kept in a flat list per frame, pooled
// across evaluations, where OPA's default builds a tree of hash maps anew
// for every evaluation.
type vcache struct {
	entries []vcEntry
	frames  []int // start of each frame in entries
}

type vcEntry struct {
	ref       ast.Ref
	value     *ast.Term
	undefined bool
}

var vcaches = sync.Pool{New: func() any { return newVCache() }}

func newVCache() *vcache {
	c := &vcache{entries: make([]vcEntry, 0, 32), frames: make([]int, 0, 4)}
	c.Push()
	return c
}

// release resets c and returns it to the pool.
func (c *vcache) release() {
	if cap(c.entries) > 1024 { // an unusual policy: let the pool drop it
		return
	}
	clear(c.entries)
	c.entries = c.entries[:0]
	c.frames = append(c.frames[:0], 0)
	vcaches.Put(c)
}

func (c *vcache) Push() { c.frames = append(c.frames, len(c.entries)) }

func (c *vcache) Pop() {
	start := c.frames[len(c.frames)-1]
	clear(c.entries[start:])
	c.entries = c.entries[:start]
	c.frames = c.frames[:len(c.frames)-1]
}

func (c *vcache) find(ref ast.Ref) int {
	for i := c.frames[len(c.frames)-1]; i < len(c.entries); i++ {
		if refEqual(c.entries[i].ref, ref) {
			return i
		}
	}
	return -1
}

// refEqual is ast.Ref.Equal comparing from the end: the refs cached share
// their prefix (data.infergate.authz.), so they differ at the last term.
func refEqual(a, b ast.Ref) bool {
	if len(a) != len(b) {
		return false
	}
	for i := len(a) - 1; i >= 0; i-- {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// Get returns the cached value of ref; (nil, true) when ref is known to be
// undefined, (nil, false) when it is not cached.
func (c *vcache) Get(ref ast.Ref) (*ast.Term, bool) {
	if i := c.find(ref); i >= 0 {
		return c.entries[i].value, c.entries[i].undefined
	}
	return nil, false
}

// Put caches the value of ref; a nil value records that ref is undefined.
func (c *vcache) Put(ref ast.Ref, value *ast.Term) {
	if i := c.find(ref); i >= 0 {
		c.entries[i].value, c.entries[i].undefined = value, value == nil
		return
	}
	// The evaluator may reuse the slice behind ref.
	c.entries = append(c.entries, vcEntry{ref: slices.Clone(ref), value: value, undefined: value == nil})
}

// Keys returns the refs with a value in the current frame.
func (c *vcache) Keys() []ast.Ref {
	var keys []ast.Ref
	for _, e := range c.entries[c.frames[len(c.frames)-1]:] {
		if e.value != nil {
			keys = append(keys, e.ref)
		}
	}
	return keys
}

// dataCache is a read-only topdown.BaseCache holding all of data, converted
// to an OPA value once at load: reads of data.infergate.tenants and the
// like are lookups, shared by every evaluation, instead of storage reads
// cached per evaluation.
type dataCache struct{ data ast.Value }

// Get returns the value at ref (data.x.y...), or nil to read storage.
func (c dataCache) Get(ref ast.Ref) ast.Value {
	if len(ref) == 0 || !ref[0].Equal(ast.DefaultRootDocument) {
		return nil
	}
	v, err := c.data.Find(ref[1:])
	if err != nil {
		return nil
	}
	return v
}

// Put does nothing: everything in storage is in the cache already.
func (dataCache) Put(ast.Ref, ast.Value) {}
