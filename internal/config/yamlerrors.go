package config

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/agnivade/levenshtein"
	"gopkg.in/yaml.v3"
)

// yaml.v3 reports a decoding mistake in Go's words ("field kyes not found
// in type config.Auth", "cannot unmarshal !!int `5` into time.Duration").
// tidyYAMLError says it in the file's words: the line, the key's dotted
// path, what the key wants, and for an unknown key the nearest known one.
func tidyYAMLError(err error, root *yaml.Node) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = tidyYAMLMessage(m, root)
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	yamlLine     = regexp.MustCompile(`^line (\d+): (.*)$`)
	unknownField = regexp.MustCompile("^field (\\S+) not found in type ")
	cannotDecode = regexp.MustCompile("^cannot unmarshal !!(\\w+) (?:`(.*)` )?into (.+)$")
)

func tidyYAMLMessage(m string, root *yaml.Node) string {
	sub := yamlLine.FindStringSubmatch(m)
	if sub == nil {
		return m
	}
	line, _ := strconv.Atoi(sub[1])
	rest := sub[2]
	f := unknownField.FindStringSubmatch(rest)
	name := ""
	if f != nil {
		name = f[1] // on a line of a flow mapping ({a: 1, b: 2}), the key itself
	}
	path := keyAt(root, line, name)
	if path == "" {
		return m
	}
	if f != nil {
		msg := fmt.Sprintf("line %d: %s: unknown key", line, path)
		if s := nearest(f[1], knownKeys(parentOf(path))); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", s)
		}
		return msg
	}
	if f = cannotDecode.FindStringSubmatch(rest); f != nil {
		got := f[2]
		if got == "" {
			got = map[string]string{"seq": "a list", "map": "a mapping"}[f[1]]
		}
		return fmt.Sprintf("line %d: %s: want %s, got %s", line, path, wanted(f[3]), cmp.Or(got, f[1]))
	}
	return fmt.Sprintf("line %d: %s: %s", line, path, rest)
}

// wanted names a Go type as a config file's reader knows it.
func wanted(goType string) string {
	switch {
	case goType == "time.Duration":
		return "a duration such as 30s, 5m or 1h"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping of keys to values"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "uint"):
		return "a whole number, 0 or more"
	case strings.HasPrefix(goType, "int"):
		return "a whole number"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	}
	return "a section (a mapping of keys)"
}

// keyAt finds the mapping key on line (named name, when given) in the
// document: its dotted path, list items by index.
func keyAt(root *yaml.Node, line int, name string) (path string) {
	var walk func(n *yaml.Node, prefix string) bool
	walk = func(n *yaml.Node, prefix string) bool {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if walk(c, prefix) {
					return true
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if walk(c, join(prefix, strconv.Itoa(i))) {
					return true
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if (name == "" || k.Value == name) && (k.Line == line || (v.Line == line && v.Kind == yaml.ScalarNode)) {
					path = join(prefix, k.Value)
					return true
				}
				if walk(v, join(prefix, k.Value)) {
					return true
				}
			}
		}
		return false
	}
	walk(root, "")
	return path
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

func parentOf(path string) string {
	i := strings.LastIndexByte(path, '.')
	if i < 0 {
		return ""
	}
	return path[:i]
}

// knownKeys lists the keys the section at path (dotted, list items by
// index) accepts, read from Config's yaml tags; nil when path leads out
// of the structs (a map's keys are the user's).
func knownKeys(path string) []string {
	t := reflect.TypeOf(Config{})
	for _, key := range strings.Split(path, ".") {
		if key == "" {
			break
		}
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if _, err := strconv.Atoi(key); err == nil {
			continue // a list item: its element type, unwrapped above
		}
		f, ok := fieldByKey(t, key)
		if !ok {
			return nil
		}
		t = f.Type
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var keys []string
	collectKeys(t, &keys)
	return keys
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	if t.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			if g, ok := fieldByKey(f.Type, key); ok {
				return g, true
			}
			continue
		}
		if name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func collectKeys(t reflect.Type, keys *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case strings.Contains(opts, "inline"):
			collectKeys(f.Type, keys)
		case name != "" && name != "-":
			*keys = append(*keys, name)
		}
	}
}

// nearest is the known key closest to key by edit distance, when close
// enough to be a typo (a transposition, or a third of its length).
func nearest(key string, known []string) string {
	best, bestD := "", 0
	for _, k := range known {
		d := levenshtein.ComputeDistance(strings.ToLower(key), strings.ToLower(k))
		if best == "" || d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" || bestD > max(2, len(key)/3) {
		return ""
	}
	return best
}
