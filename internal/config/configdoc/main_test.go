package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const root = "../../.."

// The reference in docs/ is what the config types say today.
func TestReferenceIsCurrent(t *testing.T) {
	path := filepath.Join(root, reference)
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := regenerate(root, doc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, want) {
		t.Fatalf("%s is stale: run `%s` from the module root and commit the result\nfirst difference:\n%s", reference, Command, firstDiff(doc, want))
	}
}

// Every key of the embedded defaults has its row: the walk of the types
// misses no section, and the types declare every key the defaults set.
func TestReferenceCoversTheDefaults(t *testing.T) {
	table, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, configDir, "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := prefix+n.Content[i].Value, n.Content[i+1]
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 {
				walk(v, k+".")
				continue
			}
			keys = append(keys, k)
		}
	}
	walk(n.Content[0], "")
	if len(keys) < 50 {
		t.Fatalf("read %d keys from default.yaml; want them all", len(keys))
	}
	for _, k := range keys {
		if !bytes.Contains(table, []byte("| `"+k+"` |")) {
			t.Errorf("default.yaml key %s has no row in the reference", k)
		}
	}
}

// A stale reference is told apart from a current one, and the hand-written
// prose around the markers is kept.
func TestSpliceReplacesOnlyTheGeneratedPart(t *testing.T) {
	doc := []byte("# Title\n\nprose\n\n" + beginMark + "\nold table\n" + endMark + "\n\nmore prose\n")
	got, err := splice(doc, []byte("new table\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nprose\n\n" + beginMark + "\nnew table\n" + endMark + "\n\nmore prose\n"
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := splice([]byte("no markers"), nil); err == nil {
		t.Fatal("a document without markers was accepted")
	}
}

// The walk follows the types: yaml names, "-" and inline tags, pointers,
// lists and maps of objects, types of another package of the module.
func TestGenerateFollowsTheTypes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n")
	write("internal/config/default.yaml", "a:\n  n: 3 # from the defaults\nlist: []\n")
	write("internal/config/config.go", `package config

import (
	"time"

	"example.com/m/other"
)

type Config struct {
	A    A              `+"`yaml:\"a\"`"+`
	List []*Item        `+"`yaml:\"list\"`"+`
	M    map[string]Obj `+"`yaml:\"m\"`"+`
}

// A is section a.
type A struct {
	N      int  `+"`yaml:\"n\"`"+`
	Hidden bool `+"`yaml:\"-\"`"+`
	Base   `+"`yaml:\",inline\"`"+`
}

type Base struct {
	// Wait is how long.
	Wait time.Duration `+"`yaml:\"wait\"`"+`
}

type Item struct {
	O other.Thing `+"`yaml:\"o\"`"+`
	P Alias       `+"`yaml:\"p\"`"+`
}

type Alias = other.Thing

type Obj struct{ Flag *bool }
`)
	write("other/other.go", "package other\n\n// Thing is from another package.\ntype Thing struct {\n\tX float64 `yaml:\"x\"` // an x\n}\n")
	got, err := generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### `a`\n\nA is section a.",
		"| `a.n` | integer | `3` | from the defaults |",
		"| `a.wait` | duration | — | Wait is how long. |",
		"| `list` | list of objects | `[]` |",
		"| `list[].o` | object | — | Thing is from another package. |",
		"| `list[].o.x` | number | — | an x |",
		"| `list[].p.x` | number | — | an x |",
		"| `m.NAME.flag` | bool | — | — |",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(string(got), "hidden") {
		t.Errorf("a yaml:\"-\" field has a row:\n%s", got)
	}
}

func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:", i+1) + "\n  file: " + x + "\n  want: " + y
		}
	}
	return ""
}
