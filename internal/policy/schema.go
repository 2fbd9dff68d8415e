package policy

import (
	"reflect"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputSchemas is the JSON schema of Input for OPA's type checker, derived
// from the Go type (docs/policy-input.schema.json documents the same
// structure, and a test keeps the two in step). With it the compiler
// rejects a reference to an input field that does not exist, e.g.
// input.request.max_token, at load instead of leaving it undefined.
var inputSchemas = func() *ast.SchemaSet {
	ss := ast.NewSchemaSet()
	ss.Put(ast.SchemaRootRef, typeSchema(reflect.TypeFor[Input]()))
	return ss
}()

func typeSchema(t reflect.Type) map[string]any {
	switch t.Kind() {
	case reflect.Struct:
		props := map[string]any{}
		var required []any
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			props[name] = typeSchema(f.Type)
			required = append(required, name)
		}
		return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
	case reflect.Map: // encoding/json writes a nil map as null
		s := map[string]any{"type": []any{"object", "null"}}
		if t.Elem().Kind() != reflect.Interface {
			s["additionalProperties"] = typeSchema(t.Elem())
		}
		return s
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64:
		return map[string]any{"type": "integer"}
	}
	panic("policy: no schema for " + t.String())
}
