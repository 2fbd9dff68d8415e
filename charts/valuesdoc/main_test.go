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

const root = "../.."

// The chart's README holds the table values.yaml gives today.
func TestValuesTableIsCurrent(t *testing.T) {
	path := filepath.Join(root, chartDir, "README.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := regenerate(root, doc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, want) {
		t.Fatalf("%s/README.md's values table is stale: run `%s` from the module root and commit the result\nfirst difference:\n%s", chartDir, Command, firstDiff(doc, want))
	}
}

// Every leaf of values.yaml has its row.
func TestValuesTableCoversEveryValue(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	table, err := generate(b)
	if err != nil {
		t.Fatal(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	var leaves []string
	var walk func(m *yaml.Node, prefix string)
	walk = func(m *yaml.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := prefix+m.Content[i].Value, m.Content[i+1]
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 {
				walk(v, k+".")
				continue
			}
			leaves = append(leaves, k)
		}
	}
	walk(n.Content[0], "")
	if len(leaves) < 50 {
		t.Fatalf("read %d values; want them all", len(leaves))
	}
	for _, k := range leaves {
		if !bytes.Contains(table, []byte("| `"+k+"` |")) {
			t.Errorf("value %s has no row", k)
		}
	}
}

func TestGenerate(t *testing.T) {
	values := `# The file's own comment.

# -- How it runs.
#   serve: one process
mode: serve
image:
  repository: example/x
  # -- Defaults to the chart's appVersion.
  tag: ""
ports:
  admin: 9090 # HTTP: /metrics
# -- Off by default.
# More lines.
debug:
  enabled: false
  list: [a, "b|c"]
empty: {}
`
	got, err := generate([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `mode` | string | `serve` | How it runs. serve: one process |",
		"| `image.repository` | string | `example/x` | — |",
		"| `image.tag` | string | `\"\"` | Defaults to the chart's appVersion. |",
		"| `ports.admin` | int | `9090` | HTTP: /metrics |",
		"| `debug` | object | — | Off by default. More lines. |",
		"| `debug.enabled` | bool | `false` | — |",
		"| `debug.list` | list | `[a, \"b\\|c\"]` | — |",
		"| `empty` | object | `{}` | — |",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(string(got), "The file's own comment") {
		t.Errorf("a comment without -- was taken as documentation:\n%s", got)
	}
}

func TestSpliceKeepsTheProse(t *testing.T) {
	got, err := splice([]byte("a\n"+beginMark+"\nold\n"+endMark+"\nb\n"), []byte("new\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\n" + beginMark + "\nnew\n" + endMark + "\nb\n"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := splice([]byte("no markers"), nil); err == nil {
		t.Fatal("a README without markers was accepted")
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
			return fmt.Sprintf("line %d:\n  file: %s\n  want: %s", i+1, x, y)
		}
	}
	return ""
}
