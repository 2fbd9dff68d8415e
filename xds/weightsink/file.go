// Package weightsink moves the SLA controller's weights into the routing
// resources of gateways that do not take xDS from infergate:
//
//   - File: a Gateway API HTTPRoute in a file, the resource file Envoy
//     Gateway's standalone mode (file provider) watches and re-translates on
//     every change;
//   - HTTPRoute: the same HTTPRoute through the Kubernetes API (Envoy
//     Gateway in a cluster);
//   - VirtualService: an Istio VirtualService through the Kubernetes API.
//
// Each virtual model is the rule (or http route) that matches its
// x-infergate-model header; its pools are that rule's backends, by name.
//
// The HTTPRoute sinks also map what the meter sees back to pools: Envoy
// Gateway puts a rule's backends in one cluster as localities named
// "httproute/<namespace>/<name>/rule/<i>/backend/<j>", and the meter
// reports that locality when no cluster name is available.
package weightsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/infergate/infergate/internal/request"
	"gopkg.in/yaml.v3"
)

// File is an HTTPRoute in a YAML file (possibly one of several documents).
type File struct {
	Path      string
	Namespace string // "" matches the route's namespace whatever it is
	Name      string

	mu       sync.Mutex
	backends map[string]string // locality region → backendRef name
}

// Resolve returns the pool a locality region stands for, or the input
// unchanged when it is not one of this route's.
func (f *File) Resolve(pool string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name, ok := f.backends[pool]; ok {
		return name
	}
	return pool
}

// Load reads the file and learns the route's backends, without writing.
// The file is local: ctx is not consulted.
func (f *File) Load(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, _, err := f.read()
	return err
}

// Apply sets, for each virtual model, its rule's backendRef weights; pools
// not mentioned keep theirs. The file is replaced atomically, and only when
// something changed (every write makes Envoy Gateway re-translate).
func (f *File) Apply(_ context.Context, weights map[string]map[string]uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	docs, route, err := f.read()
	if err != nil {
		return err
	}
	changed, aliases, err := setWeights(route, f.Name, weights)
	if err != nil {
		return err
	}
	maps.Copy(f.backends, aliases)
	if !changed {
		return nil
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("httproute %s: %w", f.Path, err)
		}
	}
	if err := enc.Close(); err != nil {
		return err
	}
	return writeAtomic(f.Path, out.Bytes())
}

// setWeights sets each virtual model's rule's backendRef weights in an
// HTTPRoute (a YAML or JSON document); it reports whether anything changed.
// A pool names a backendRef by name, or by namespace/name (two
// InferencePools of one name in two namespaces); the ref's namespace is
// the route's unless it sets one. It also returns what each backend the
// weights reached is called elsewhere (its locality, namespace/name, and
// name when the ref is in the route's namespace), mapped to the pool.
func setWeights(route *yaml.Node, name string, weights map[string]map[string]uint32) (bool, map[string]string, error) {
	routeNS := scalar(mapGet(mapGet(route, "metadata"), "namespace"))
	if routeNS == "" {
		routeNS = "default"
	}
	changed := false
	aliases := map[string]string{}
	for vm, ws := range weights {
		i, rule := ruleFor(route, vm)
		if rule == nil {
			return false, nil, fmt.Errorf("httproute %s: no rule matches %s: %s", name, request.ModelHeader, vm)
		}
		matched := map[string]int{}
		for j, ref := range seq(mapGet(rule, "backendRefs")) {
			refName, ns := scalar(mapGet(ref, "name")), scalar(mapGet(ref, "namespace"))
			if ns == "" {
				ns = routeNS
			}
			pool := ns + "/" + refName
			w, ok := ws[pool]
			if !ok {
				pool = refName
				if w, ok = ws[pool]; !ok {
					continue
				}
			}
			matched[pool]++
			changed = setScalar(ref, "weight", strconv.FormatUint(uint64(w), 10)) || changed
			aliases[fmt.Sprintf("httproute/%s/%s/rule/%d/backend/%d", routeNS, name, i, j)] = pool
			aliases[ns+"/"+refName] = pool
			if ns == routeNS {
				aliases[refName] = pool
			}
		}
		for pool := range ws {
			switch matched[pool] {
			case 0:
				return false, nil, fmt.Errorf("httproute %s: the rule for %s has no backendRef %s", name, vm, pool)
			case 1:
			default:
				return false, nil, fmt.Errorf("httproute %s: the rule for %s has %d backendRefs named %s: name the pool namespace/name", name, vm, matched[pool], pool)
			}
		}
	}
	return changed, aliases, nil
}

// localities maps Envoy Gateway's locality names for route's backends to
// the backendRefs' names.
func localities(route *yaml.Node, ns, name string) map[string]string {
	out := map[string]string{}
	for i, rule := range seq(mapGet(mapGet(route, "spec"), "rules")) {
		for j, ref := range seq(mapGet(rule, "backendRefs")) {
			out[fmt.Sprintf("httproute/%s/%s/rule/%d/backend/%d", ns, name, i, j)] = scalar(mapGet(ref, "name"))
		}
	}
	return out
}

// read parses the file, finds the route and refreshes the locality map.
// Callers hold f.mu.
func (f *File) read() ([]*yaml.Node, *yaml.Node, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("httproute: %w", err)
	}
	var docs []*yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d yaml.Node
		if err := dec.Decode(&d); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, nil, fmt.Errorf("httproute: %s: %w", f.Path, err)
		}
		docs = append(docs, &d)
	}
	var route *yaml.Node
	ns := "default"
	for _, d := range docs {
		if len(d.Content) == 0 {
			continue
		}
		root := d.Content[0]
		md := mapGet(root, "metadata")
		if scalar(mapGet(root, "kind")) != "HTTPRoute" || scalar(mapGet(md, "name")) != f.Name {
			continue
		}
		if n := scalar(mapGet(md, "namespace")); n != "" {
			ns = n
		}
		if f.Namespace != "" && ns != f.Namespace {
			continue
		}
		route = root
		break
	}
	if route == nil {
		return nil, nil, fmt.Errorf("httproute: no HTTPRoute %q in %s", f.Name, f.Path)
	}
	f.backends = localities(route, ns, f.Name)
	return docs, route, nil
}

// ruleFor finds the rule whose matches select x-infergate-model: vm
// exactly, and its index.
func ruleFor(route *yaml.Node, vm string) (int, *yaml.Node) {
	for i, rule := range seq(mapGet(mapGet(route, "spec"), "rules")) {
		for _, m := range seq(mapGet(rule, "matches")) {
			for _, h := range seq(mapGet(m, "headers")) {
				typ := scalar(mapGet(h, "type"))
				if strings.EqualFold(scalar(mapGet(h, "name")), request.ModelHeader) && scalar(mapGet(h, "value")) == vm &&
					(typ == "" || typ == "Exact") {
					return i, rule
				}
			}
		}
	}
	return 0, nil
}

// YAML node helpers: mappings and sequences by key, tolerant of absence.

func mapGet(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func seq(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

// setScalar sets key to an integer value, adding it if absent; it reports
// whether anything changed.
func setScalar(m *yaml.Node, key, value string) bool {
	if v := mapGet(m, key); v != nil {
		if v.Value == value {
			return false
		}
		v.Kind, v.Tag, v.Value = yaml.ScalarNode, "!!int", value
		return true
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: value})
	return true
}

// writeAtomic replaces path with b: a reader (Envoy Gateway's watcher)
// never sees a half-written file. The temporary file's name does not end
// in .yaml, so a watcher of the directory does not load it.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("httproute: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("httproute: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("httproute: %w", err)
	}
	if info, err := os.Stat(path); err == nil {
		_ = os.Chmod(tmp.Name(), info.Mode())
	}
	return os.Rename(tmp.Name(), path)
}
