// Package docs checks the documentation: every relative link and #anchor
// of the README, docs/ and the chart's README resolves (anchors by GitHub's
// heading slugs), every page under docs/ is reachable from docs/README.md,
// the index, and the plain-Envoy guide's commands run as written.
package docs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// checked are the documents whose links must resolve, relative to the
// module root; every .md under docs/ is checked too.
var checked = []string{"README.md", "charts/infergate/README.md", "policies/README.md"}

const index = "docs/README.md"

func TestDocsLinksResolve(t *testing.T) {
	for _, p := range check("../..") {
		t.Error(p)
	}
}

// The checker finds each kind of broken link in a fixture made to hold
// one of each, and nothing else.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	got := check("testdata/broken")
	want := []string{
		"README.md: link docs/missing.md: no such file",
		"docs/README.md: link guide.md#no-such-heading: no heading or anchor \"no-such-heading\" in docs/guide.md",
		"docs/deep.md: not listed in docs/README.md",
		"docs/guide.md: link #gone: no heading or anchor \"gone\" in docs/guide.md",
		"docs/guide.md: link ../charts/x/README.md: no such file",
		"docs/guide.md: link : empty link",
		"docs/orphan.md: not reachable from docs/README.md",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlugs(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Two commands", "two-commands"},
		{"Securing the ext_proc port", "securing-the-ext_proc-port"},
		{"Under faults: `make chaos` and `make soak`", "under-faults-make-chaos-and-make-soak"},
		{"Tracing and `/debug/requests`", "tracing-and-debugrequests"},
		{"A pool's own credential", "a-pools-own-credential"},
		{"Kubernetes: the Helm chart", "kubernetes-the-helm-chart"},
		{"See [the chart](x.md) **now**", "see-the-chart-now"},
		{"`extproc`", "extproc"},
		{"Größe — und Ümlaut", "größe--und-ümlaut"},
	} {
		if got := slug(c.heading); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}

// doc is what one Markdown file offers and asks for.
type doc struct {
	anchors map[string]bool
	links   []string
}

// check returns the problems of the documents under root, sorted.
func check(root string) []string {
	files := slices.Clone(checked)
	filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	docs := map[string]*doc{}
	load := func(name string) (*doc, error) {
		if d, ok := docs[name]; ok {
			return d, nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		d := parse(string(b))
		docs[name] = d
		return d, nil
	}
	var problems []string
	for _, name := range files {
		d, err := load(name)
		if err != nil {
			if os.IsNotExist(err) {
				continue // an optional document of the list
			}
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		for _, link := range d.links {
			if p := resolve(root, name, link, load); p != "" {
				problems = append(problems, fmt.Sprintf("%s: link %s: %s", name, link, p))
			}
		}
	}
	// Reachability: follow the Markdown links from the index.
	seen := map[string]bool{index: true}
	queue := []string{index}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		d, err := load(name)
		if err != nil {
			continue
		}
		for _, link := range d.links {
			target, _, _ := strings.Cut(link, "#")
			if target == "" || external(target) || !strings.HasSuffix(target, ".md") {
				continue
			}
			t := path.Join(path.Dir(name), target)
			if !seen[t] && strings.HasPrefix(t, "docs/") {
				seen[t] = true
				queue = append(queue, t)
			}
		}
	}
	// Listed in the index itself, not only reachable through another page:
	// the index is where a reader looks for a page.
	listed := map[string]bool{}
	if d, err := load(index); err == nil {
		for _, link := range d.links {
			target, _, _ := strings.Cut(link, "#")
			listed[path.Join(path.Dir(index), target)] = true
		}
	}
	for _, name := range files {
		switch {
		case !strings.HasPrefix(name, "docs/") || name == index:
		case !seen[name]:
			problems = append(problems, name+": not reachable from "+index)
		case !listed[name]:
			problems = append(problems, name+": not listed in "+index)
		}
	}
	slices.Sort(problems)
	return problems
}

func external(target string) bool {
	return strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:")
}

// resolve checks one link of the document name; it returns what is wrong.
func resolve(root, name, link string, load func(string) (*doc, error)) string {
	if link == "" {
		return "empty link"
	}
	target, anchor, hasAnchor := strings.Cut(link, "#")
	if external(target) {
		return ""
	}
	target, _, _ = strings.Cut(target, "?")
	file := name
	if target != "" {
		file = path.Join(path.Dir(name), target)
		if strings.HasPrefix(file, "../") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil {
			return "no such file"
		}
	}
	if !hasAnchor || anchor == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return "" // a line anchor into source, say: GitHub's, not checked
	}
	d, err := load(file)
	if err != nil {
		return err.Error()
	}
	if !d.anchors[anchor] {
		return fmt.Sprintf("no heading or anchor %q in %s", anchor, file)
	}
	return ""
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// parse reads a document's headings (as GitHub's anchors) and links,
// outside fenced code and code spans.
func parse(text string) *doc {
	d := &doc{anchors: map[string]bool{}}
	count := map[string]int{}
	inFence := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\r\n")
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := count[s]; n > 0 {
				d.anchors[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				d.anchors[s] = true
			}
			count[s]++
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			d.links = append(d.links, m[1])
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			d.links = append(d.links, m[1])
		}
	}
	return d
}

// slug is GitHub's anchor for a heading: its text as rendered, lower-cased,
// without punctuation but hyphens and underscores, spaces made hyphens.
func slug(h string) string {
	h = mdLink.ReplaceAllString(h, "$1")
	h = htmlTag.ReplaceAllString(h, "")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
