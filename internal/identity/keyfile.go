package identity

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// KeyPrefix starts every key `infergate keys` mints, so that a leaked one is
// recognisable (secret scanners, logs).
const KeyPrefix = "sk-ig-"

// NewKey mints a key: KeyPrefix and 32 random bytes (256 bits), base64url.
// It returns the key, to be shown once, and the hex SHA-256 to store.
func NewKey() (key, sha string) {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand panics instead)
	key = KeyPrefix + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(key))
	return key, hex.EncodeToString(sum[:])
}

// NewKeyID is a fresh id for a key of tenant: the tenant and 8 random hex
// digits.
func NewKeyID(tenant string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return tenant + "-" + hex.EncodeToString(b)
}

// KeyFileEdit is a keys file being edited as a YAML tree, so that its
// comments, order and layout survive (a whole entry rewritten loses only
// the comments inside it; fields are set in place).
type KeyFileEdit struct {
	name string      // for errors
	path string      // "" when not a file
	mode fs.FileMode // of the file
	doc  *yaml.Node  // the document node
	seq  *yaml.Node  // its keys: sequence
}

// OpenKeyFile reads a keys file to edit (a missing one is empty). A
// directory (a mounted Secret) or a JSON file is refused: the edit writes
// YAML to one file.
func OpenKeyFile(path string) (*KeyFileEdit, error) {
	if ext := filepath.Ext(path); ext == ".json" {
		return nil, fmt.Errorf("%s: keys files written by infergate are YAML; convert it (JSON is YAML) and rename it", path)
	}
	mode := fs.FileMode(0o600)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if st, err := os.Stat(path); err == nil {
			mode = st.Mode().Perm()
		}
	}
	f, err := ParseKeyFile(path, b)
	if err != nil {
		return nil, err
	}
	f.path, f.mode = path, mode
	return f, nil
}

// ParseKeyFile reads the content b of a keys file (empty: no keys) named
// name to edit.
func ParseKeyFile(name string, b []byte) (*KeyFileEdit, error) {
	f := &KeyFileEdit{name: name}
	if _, err := parseKeyFile(name, b); err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		f.doc = &doc
	} else {
		f.doc = &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	root := f.doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a mapping of keys", name)
	}
	if v := mapValue(root, "keys"); v != nil && v.Kind == yaml.SequenceNode {
		f.seq = v
	} else if v != nil && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return nil, fmt.Errorf("%s: keys: is not a list", name)
	} else {
		f.seq = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		setValue(root, "keys", f.seq)
	}
	f.seq.Style = 0 // block style, whatever it was, for the entries added
	return f, nil
}

// Entries are the file's keys.
func (f *KeyFileEdit) Entries() ([]KeyEntry, error) {
	out := make([]KeyEntry, len(f.seq.Content))
	for i, n := range f.seq.Content {
		if err := n.Decode(&out[i]); err != nil {
			return nil, fmt.Errorf("%s: keys[%d]: %w", f.name, i, err)
		}
	}
	return out, nil
}

// Find is the entry of id and its index; -1 when there is none.
func (f *KeyFileEdit) Find(id string) (KeyEntry, int, error) {
	entries, err := f.Entries()
	if err != nil {
		return KeyEntry{}, -1, err
	}
	for i, e := range entries {
		if e.ID == id {
			return e, i, nil
		}
	}
	return KeyEntry{}, -1, nil
}

// Append adds an entry.
func (f *KeyFileEdit) Append(e KeyEntry) error {
	var n yaml.Node
	if err := n.Encode(e); err != nil {
		return err
	}
	n.Style = 0
	f.seq.Content = append(f.seq.Content, &n)
	return nil
}

// SetTime sets field (expires, revoked, created) of entry i in place.
func (f *KeyFileEdit) SetTime(i int, field string, t time.Time) {
	setValue(f.seq.Content[i], field, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: t.UTC().Format(time.RFC3339Nano)})
}

// SetString sets field of entry i in place.
func (f *KeyFileEdit) SetString(i int, field, v string) {
	setValue(f.seq.Content[i], field, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v})
}

// Bytes is the edited file, checked as the gate will load it.
func (f *KeyFileEdit) Bytes() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f.doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	if err := newKeys().add(f.name, buf.Bytes(), map[string]string{}); err != nil {
		return nil, fmt.Errorf("the edited keys file would not load: %w", err)
	}
	return buf.Bytes(), nil
}

// Save writes the file OpenKeyFile read, checked (Bytes), atomically (a
// temporary file beside it, synced, then renamed), so the gate's reload
// sees the old file or the new one, never a part.
func (f *KeyFileEdit) Save() error {
	if f.path == "" {
		return errors.New("identity: Save of a keys file not opened from a file")
	}
	b, err := f.Bytes()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(f.mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}

// mapValue is the value of key in mapping m, nil when absent.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// setValue sets key of mapping m to v, in place when present.
func setValue(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v.LineComment = m.Content[i+1].LineComment
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// ParseExpiry reads a lifetime: a Go duration (90m, 12h) or whole days
// (30d); it must be positive.
func ParseExpiry(s string) (time.Duration, error) {
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		if _, err = fmt.Sscanf(days, "%d", &n); err == nil && fmt.Sprint(n) == days && n <= 100*366 {
			d = time.Duration(n) * 24 * time.Hour
		} else {
			err = fmt.Errorf("%q: want whole days, e.g. 30d", s)
		}
	} else {
		d, err = time.ParseDuration(s)
	}
	if err == nil && d <= 0 {
		err = fmt.Errorf("%q: must be positive", s)
	}
	return d, err
}
