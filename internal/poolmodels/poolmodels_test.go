package poolmodels

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestParse(t *testing.T) {
	vllm := `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1735689600,
		"owned_by":"vllm","root":"/models/llama","parent":null,"max_model_len":8192,"permission":[{"id":"modelperm-1"}]}]}`
	for _, c := range []struct {
		name, body string
		want       []string
		err        bool
	}{
		{"vLLM", vllm, []string{"meta-llama/Llama-3.1-8B-Instruct"}, false},
		{"empty list", `{"object":"list","data":[]}`, []string{}, false},
		{"no data", `{"object":"list"}`, nil, true},
		{"data not a list", `{"data":{"id":"m"}}`, nil, true},
		{"id not a string", `{"data":[{"id":7}]}`, nil, true},
		{"not JSON", `<html>502</html>`, nil, true},
		{"too long", `{"data":[{"id":"m"}],"pad":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(c.body))
			if (err != nil) != c.err || !slices.Equal(got, c.want) {
				t.Errorf("Parse = %q, %v; want %q, error %v", got, err, c.want, c.err)
			}
		})
	}
}

// What a pool sends is bounded before it is kept: invalid ids dropped,
// each id once, at most MaxModels.
func TestBound(t *testing.T) {
	many := make([]string, MaxModels+10)
	for i := range many {
		many[i] = fmt.Sprintf("m-%d", i)
	}
	for _, c := range []struct {
		name string
		in   []string
		want []string
		err  bool
	}{
		{"valid", []string{"llama3:8b", "org/model-v1.5", "modèle"}, []string{"llama3:8b", "org/model-v1.5", "modèle"}, false},
		{"none", []string{}, []string{}, false},
		{"duplicates", []string{"a", "b", "a"}, []string{"a", "b"}, false},
		{"invalid dropped", []string{"", "a b", "x\ny", "\x1b[31mred", "\xff", " a", strings.Repeat("m", MaxIDBytes+1), strings.Repeat("m", MaxIDBytes)},
			[]string{strings.Repeat("m", MaxIDBytes)}, false},
		{"only invalid", []string{"", "a\x00"}, nil, true},
		{"capped", many, many[:MaxModels], false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Bound(c.in)
			if (err != nil) != c.err || !slices.Equal(got, c.want) {
				t.Errorf("Bound = %d ids %.80q, %v; want %d, error %v", len(got), got, err, len(c.want), c.err)
			}
		})
	}
}

// Pools are merged in order, each id once, with every pool that lists it.
func TestMerge(t *testing.T) {
	pools := []Pool{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	l := merge(pools, [][]string{{"x", "y"}, nil, {"z", "x"}})
	if want := []string{"x", "y", "z"}; !slices.Equal(l.IDs, want) {
		t.Errorf("ids %q, want %q", l.IDs, want)
	}
	for id, want := range map[string][]string{"x": {"a", "c"}, "y": {"a"}, "z": {"c"}, "w": nil} {
		if got := l.Pools(id); !slices.Equal(got, want) {
			t.Errorf("Pools(%q) = %q, want %q", id, got, want)
		}
	}
}

// The pools together list at most MaxModels ids, the first pools' first.
func TestMergeBounded(t *testing.T) {
	lists := make([][]string, 3)
	for i := range lists {
		for j := range MaxModels {
			lists[i] = append(lists[i], fmt.Sprintf("p%d-%d", i, j))
		}
	}
	lists[2][0] = "p0-0" // already listed: its pool is still recorded
	l := merge([]Pool{{Name: "a"}, {Name: "b"}, {Name: "c"}}, lists)
	if len(l.IDs) != MaxModels || l.IDs[0] != "p0-0" || l.IDs[MaxModels-1] != lists[0][MaxModels-1] {
		t.Errorf("%d ids, from %q to %q; want pool a's %d", len(l.IDs), l.IDs[0], l.IDs[len(l.IDs)-1], MaxModels)
	}
	if got := l.Pools("p0-0"); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("p0-0 served by %q", got)
	}
}

// fakePools answers each pool's fetch from what the test set; a pool set
// to hang blocks until the fetch's deadline.
type fakePools struct {
	mu      sync.Mutex
	lists   map[string][]string
	fail    map[string]bool
	hang    map[string]bool
	fetches int
}

func (f *fakePools) fetch(ctx context.Context, p Pool) ([]string, error) {
	f.mu.Lock()
	f.fetches++
	ids, fail, hang := f.lists[p.Name], f.fail[p.Name], f.hang[p.Name]
	f.mu.Unlock()
	switch {
	case hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case fail:
		return nil, errors.New("connection refused")
	}
	return ids, nil
}

func (f *fakePools) set(fn func(f *fakePools)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func wantModels(t *testing.T, l *Lister, want ...string) {
	t.Helper()
	if got := l.Models(); !slices.Equal(got, want) {
		t.Errorf("at %s: models %q, want %q", time.Now().Format(time.TimeOnly), got, want)
	}
}

// In virtual time: lists are fetched at once and every interval; a pool
// that fails keeps its last list for KeepFor, then drops out, and comes
// back when it answers again.
func TestRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePools{lists: map[string][]string{"a": {"x", "y"}, "b": {"y", "z"}}, fail: map[string]bool{}, hang: map[string]bool{}}
		l := New(Options{Pools: []Pool{{Name: "a"}, {Name: "b"}}, Interval: 30 * time.Second, KeepFor: 2 * time.Minute, Fetch: f.fetch})
		wantModels(t, l) // before the first round: nothing, and not nil
		if l.Models() == nil {
			t.Error("Models is nil before the first round")
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go l.Run(ctx)
		<-l.Primed()
		wantModels(t, l, "x", "y", "z")
		if got := l.List().Pools("y"); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("y served by %q", got)
		}

		f.set(func(f *fakePools) { f.lists["a"] = []string{"x", "w"} })
		time.Sleep(30 * time.Second) // virtual: the next round
		synctest.Wait()
		wantModels(t, l, "x", "w", "y", "z")

		f.set(func(f *fakePools) { f.fail["b"] = true })
		for range 4 { // failing for 2 minutes: its list is kept
			time.Sleep(30 * time.Second)
			synctest.Wait()
			wantModels(t, l, "x", "w", "y", "z")
		}
		time.Sleep(30 * time.Second) // 2m30s since its last list: dropped
		synctest.Wait()
		wantModels(t, l, "x", "w")

		f.set(func(f *fakePools) { f.fail["b"] = false })
		time.Sleep(30 * time.Second)
		synctest.Wait()
		wantModels(t, l, "x", "w", "y", "z")

		cancel()
		synctest.Wait()
		f.mu.Lock()
		defer f.mu.Unlock()
		if want := 2 * 8; f.fetches != want {
			t.Errorf("%d fetches, want %d (two pools, eight rounds)", f.fetches, want)
		}
	})
}

// The first round ends when every pool has answered or timed out: a pool
// that hangs delays it by Timeout, no longer, and the others are listed.
func TestFirstRoundBoundedByTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePools{lists: map[string][]string{"a": {"x"}}, hang: map[string]bool{"b": true}}
		l := New(Options{Pools: []Pool{{Name: "a"}, {Name: "b"}}, Timeout: 5 * time.Second, Fetch: f.fetch})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		go l.Run(ctx)
		<-l.Primed()
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("first round took %s (virtual), want the 5s timeout", waited)
		}
		wantModels(t, l, "x")
	})
}

// A pool's bad answer is bounded before it is kept: what Fetch returns
// goes through Bound, and a list of no valid id is a failure (the last
// good list stays).
func TestRefreshBoundsWhatAPoolSends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePools{lists: map[string][]string{"a": {"x", "x", "bad id"}}}
		l := New(Options{Pools: []Pool{{Name: "a"}}, Interval: time.Minute, Fetch: f.fetch})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go l.Run(ctx)
		<-l.Primed()
		wantModels(t, l, "x")
		f.set(func(f *fakePools) { f.lists["a"] = []string{"\x00"} })
		time.Sleep(time.Minute)
		synctest.Wait()
		wantModels(t, l, "x")
	})
}

// The HTTP fetch: the key from its file as a bearer token, no redirect
// followed, a non-200 or a non-list is an error.
func TestFetcher(t *testing.T) {
	var gotAuth string
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("authorization")
		w.Write([]byte(`{"object":"list","data":[{"id":"m1"},{"id":"m2"}]}`))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/v1/models", http.StatusFound)
	})
	mux.HandleFunc("/down", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	keyFile := filepath.Join(t.TempDir(), "api-key")
	if err := os.WriteFile(keyFile, []byte("sk-pool\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	fetch := Fetcher(5 * time.Second)
	ids, err := fetch(t.Context(), Pool{Name: "a", URL: srv.URL + "/v1/models", APIKeyFile: keyFile})
	if err != nil || !slices.Equal(ids, []string{"m1", "m2"}) || gotAuth != "Bearer sk-pool" {
		t.Errorf("fetch = %q, %v; authorization %q", ids, err, gotAuth)
	}
	for _, path := range []string{"/moved", "/down", "/html"} {
		if ids, err := fetch(t.Context(), Pool{Name: "a", URL: srv.URL + path}); err == nil {
			t.Errorf("%s: %q, want an error", path, ids)
		}
	}
	if err := os.WriteFile(keyFile, []byte("two words"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fetch(t.Context(), Pool{Name: "a", URL: srv.URL + "/v1/models", APIKeyFile: keyFile}); err == nil {
		t.Error("a key file holding more than a token was sent")
	}
}
