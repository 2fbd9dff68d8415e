package policy

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/request"
)

const schemaFile = "../../docs/policy-input.schema.json"

type schemaNode struct {
	Description          string                 `json:"description"`
	Type                 any                    `json:"type"` // a string or a list of strings
	Properties           map[string]*schemaNode `json:"properties"`
	Required             []string               `json:"required"`
	AdditionalProperties any                    `json:"additionalProperties"`
}

func (n *schemaNode) types() []string {
	switch t := n.Type.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, e := range t {
			s, _ := e.(string)
			out = append(out, s)
		}
		slices.Sort(out)
		return out
	}
	return nil
}

// The schema documents exactly the fields of Input, with their JSON names
// and types, so the two cannot drift apart.
func TestSchemaMatchesInput(t *testing.T) {
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var root struct {
		Schema string `json:"$schema"`
		schemaNode
	}
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	if root.Schema != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %q, want draft 2020-12", root.Schema)
	}
	checkSchema(t, "input", reflect.TypeFor[Input](), &root.schemaNode)
}

func checkSchema(t *testing.T, path string, typ reflect.Type, n *schemaNode) {
	t.Helper()
	if n.Description == "" && path != "input" {
		t.Errorf("%s: no description", path)
	}
	switch typ.Kind() {
	case reflect.Struct:
		if got := n.types(); !slices.Equal(got, []string{"object"}) {
			t.Errorf("%s: type %v, want object", path, got)
		}
		if n.AdditionalProperties != false {
			t.Errorf("%s: additionalProperties should be false", path)
		}
		fields := map[string]reflect.StructField{}
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				t.Errorf("%s.%s: no JSON name", path, f.Name)
				continue
			}
			fields[name] = f
			prop, ok := n.Properties[name]
			if !ok {
				t.Errorf("%s.%s: field %s is not in the schema", path, name, f.Name)
				continue
			}
			checkSchema(t, path+"."+name, f.Type, prop)
		}
		for name := range n.Properties {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s.%s: in the schema but not a field of %s", path, name, typ)
			}
		}
		// json.Marshal writes every field (none is omitempty).
		required := slices.Sorted(func(yield func(string) bool) {
			for name := range fields {
				if !yield(name) {
					return
				}
			}
		})
		got := slices.Clone(n.Required)
		slices.Sort(got)
		if !slices.Equal(got, required) {
			t.Errorf("%s: required %v, want %v", path, got, required)
		}
	case reflect.Map:
		// encoding/json writes a nil map as null.
		if got := n.types(); !slices.Equal(got, []string{"null", "object"}) {
			t.Errorf("%s: type %v, want [object null]", path, got)
		}
	case reflect.String:
		if got := n.types(); !slices.Equal(got, []string{"string"}) {
			t.Errorf("%s: type %v, want string", path, got)
		}
	case reflect.Bool:
		if got := n.types(); !slices.Equal(got, []string{"boolean"}) {
			t.Errorf("%s: type %v, want boolean", path, got)
		}
	case reflect.Int, reflect.Int64:
		if got := n.types(); !slices.Equal(got, []string{"integer"}) {
			t.Errorf("%s: type %v, want integer", path, got)
		}
	default:
		t.Errorf("%s: Go type %s has no schema check; extend this test", path, typ)
	}
}

// The schema's bounds of the picker's answers are the gate's: a value
// either accepts, the other does too.
func TestSchemaPickerOutputsMatchTheGate(t *testing.T) {
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	type prop struct {
		MinLength, MaxLength int
		Pattern              string
	}
	var root struct {
		Defs struct {
			PickerOutputs struct {
				Properties map[string]prop `json:"properties"`
			} `json:"pickerOutputs"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	samples := []string{"", "a", "acme", "Acme", "a/b@c:d+e~f_g", "sheddable", "batch.low", "-x", "x-", "a b", "a,b",
		"a\r\nx: 1", "é", strings.Repeat("a", 128), strings.Repeat("a", 129), strings.Repeat("a", 253), strings.Repeat("a", 254)}
	for name, valid := range map[string]func(string) bool{"objective": request.ValidObjective, "fairness_id": request.ValidFairnessID} {
		p, ok := root.Defs.PickerOutputs.Properties[name]
		if !ok || p.Pattern == "" {
			t.Fatalf("$defs.pickerOutputs.%s: no pattern", name)
		}
		re := regexp.MustCompile(p.Pattern)
		for _, s := range samples {
			schema := re.MatchString(s) && len(s) >= p.MinLength && len(s) <= p.MaxLength
			if schema != valid(s) {
				t.Errorf("%s %q: the schema says %v, the gate %v", name, s, schema, valid(s))
			}
		}
	}
}
