package loadgen

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/bench/result"
)

type sentBody struct {
	Model     string          `json:"model"`
	Messages  json.RawMessage `json:"messages"`
	MaxTokens int             `json:"max_tokens"`
	MinTokens int             `json:"min_tokens"`
	IgnoreEOS bool            `json:"ignore_eos"`
	Stream    bool            `json:"stream"`
	Options   *streamOptions  `json:"stream_options"`
}

func items(t *testing.T, w *Workload, n int) ([]*Request, []sentBody) {
	t.Helper()
	if err := w.validate(); err != nil {
		t.Fatal(err)
	}
	var reqs []*Request
	var bodies []sentBody
	for k := range n {
		r, err := w.Item(k)
		if err != nil {
			t.Fatal(err)
		}
		var b sentBody
		if err := json.Unmarshal(r.Body, &b); err != nil {
			t.Fatalf("item %d: %v: %s", k, err, r.Body)
		}
		reqs, bodies = append(reqs, r), append(bodies, b)
	}
	return reqs, bodies
}

func prompt(t *testing.T, b sentBody) string {
	t.Helper()
	var msgs []chatMessage
	if err := json.Unmarshal(b.Messages, &msgs); err != nil || len(msgs) != 1 {
		t.Fatalf("messages %s", b.Messages)
	}
	return msgs[0].Content
}

func TestWorkloadDeterministic(t *testing.T) {
	w := func(seed int64) *Workload {
		return &Workload{Models: []result.Weight{{Value: "m", Weight: 1}}, Input: result.Range{Min: 5, Max: 50, Dist: "uniform"},
			Output: fixed(8), Stream: true, Seed: seed}
	}
	a, _ := items(t, w(1), 20)
	b, _ := items(t, w(1), 20)
	c, _ := items(t, w(2), 20)
	same := 0
	for k := range a {
		if string(a[k].Body) != string(b[k].Body) {
			t.Fatalf("item %d differs with the same seed", k)
		}
		if string(a[k].Body) == string(c[k].Body) {
			same++
		}
	}
	if same > 1 || string(a[0].Body) == string(a[1].Body) {
		t.Errorf("items repeat across seeds (%d of 20) or within a run", same)
	}
}

func TestWorkloadLengths(t *testing.T) {
	w := &Workload{
		Models: []result.Weight{{Value: "m", Weight: 1}},
		Input:  result.Range{Min: 10, Max: 20, Dist: "uniform"},
		Output: result.Range{Min: 5, Max: 200, Dist: "normal", Mean: 40, StdDev: 30},
		Stream: true, Seed: 3,
	}
	reqs, bodies := items(t, w, 2000)
	var sum, sumSq float64
	clampedLow := 0
	for k, b := range bodies {
		words := len(strings.Fields(prompt(t, b)))
		if words < 10 || words > 20 || words != reqs[k].InputTokens {
			t.Fatalf("item %d: %d words, %d recorded; want 10..20", k, words, reqs[k].InputTokens)
		}
		if b.MaxTokens < 5 || b.MaxTokens > 200 || b.MinTokens != b.MaxTokens || !b.IgnoreEOS {
			t.Fatalf("item %d: max_tokens %d, min_tokens %d, ignore_eos %v", k, b.MaxTokens, b.MinTokens, b.IgnoreEOS)
		}
		if b.MaxTokens == 5 {
			clampedLow++
		}
		sum += float64(b.MaxTokens)
		sumSq += float64(b.MaxTokens * b.MaxTokens)
		if !b.Stream || b.Options == nil || !b.Options.IncludeUsage {
			t.Fatalf("item %d does not stream with usage: %+v", k, b)
		}
	}
	mean := sum / 2000
	sd := math.Sqrt(sumSq/2000 - mean*mean)
	// Clamping at 5 (P(N(40,30) < 5) ≈ 12%) lifts the mean a little.
	if mean < 39 || mean > 45 || sd < 24 || sd > 31 || clampedLow < 150 || clampedLow > 330 {
		t.Errorf("normal(40, 30) clamped to [5, 200]: mean %.1f, sd %.1f, %d at the floor", mean, sd, clampedLow)
	}

	w.NoHints, w.Stream = true, false
	_, bodies = items(t, w, 1)
	if b := bodies[0]; b.MinTokens != 0 || b.IgnoreEOS || b.Stream || b.Options != nil {
		t.Errorf("hints off, no streaming: %+v", b)
	}
}

func TestWorkloadMixes(t *testing.T) {
	w := &Workload{
		Models:  []result.Weight{{Value: "big", Weight: 1}, {Value: "small", Weight: 3}},
		Keys:    []Key{{Name: "acme", Key: "sk-a", Weight: 1}, {Name: "initech", Key: "sk-i", Weight: 1}},
		Headers: map[string]string{"x-fixed": "1", "Host": "gw.example"},
		Mixes:   []HeaderChoice{{"x-priority", "high", 1}, {"x-priority", "low", 9}},
		Input:   fixed(4), Output: fixed(4), Stream: true, Seed: 5,
	}
	reqs, bodies := items(t, w, 4000)
	count := map[string]int{}
	for k, r := range reqs {
		if r.Model != bodies[k].Model || r.Header.Get("x-fixed") != "1" || r.Host != "gw.example" {
			t.Fatalf("item %d: %+v", k, r)
		}
		wantKey := map[string]string{"acme": "Bearer sk-a", "initech": "Bearer sk-i"}[r.Tenant]
		if r.Header.Get("Authorization") != wantKey {
			t.Fatalf("item %d: tenant %q sent %q", k, r.Tenant, r.Header.Get("Authorization"))
		}
		count[r.Model]++
		count[r.Tenant]++
		count[r.Header.Get("x-priority")]++
	}
	near := func(name string, want float64) {
		if got := float64(count[name]) / 4000; math.Abs(got-want) > 0.03 {
			t.Errorf("%s drawn %.3f of the time, want %.3f", name, got, want)
		}
	}
	near("small", 0.75)
	near("acme", 0.5)
	near("high", 0.1)
}

func TestWorkloadSharedPrefix(t *testing.T) {
	w := &Workload{Models: []result.Weight{{Value: "m", Weight: 1}}, Input: fixed(30), Output: fixed(4),
		Prefix: result.Prefix{Share: 0.5, Tokens: 20}, Seed: 9}
	reqs, bodies := items(t, w, 1000)
	if len(strings.Fields(w.prefix)) != 20 {
		t.Fatalf("prefix %q, want 20 words", w.prefix)
	}
	shared := 0
	for k, b := range bodies {
		p := prompt(t, b)
		if len(strings.Fields(p)) != 30 || reqs[k].InputTokens != 30 {
			t.Fatalf("item %d: %d words, want 30 (prefix included)", k, len(strings.Fields(p)))
		}
		if strings.HasPrefix(p, w.prefix+" ") {
			shared++
		}
	}
	if shared < 450 || shared > 550 {
		t.Errorf("%d of 1000 requests start with the shared prefix, want about 500", shared)
	}
}

func TestDataset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	lines := `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"one two three"}],"max_tokens":7}

{"prompt":"hello there","model":"other"}
{"messages":[{"role":"user","content":[{"type":"text","text":"a b"}]}]}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := LoadDataset(path)
	if err != nil {
		t.Fatal(err)
	}
	w := &Workload{Models: []result.Weight{{Value: "m", Weight: 1}}, Input: fixed(1), Output: fixed(16), Dataset: ds, Stream: true}
	reqs, bodies := items(t, w, 4)
	for k, want := range []struct {
		model  string
		max    int
		words  int
		prompt string
	}{{"m", 7, 5, ""}, {"other", 16, 2, "hello there"}, {"m", 16, 2, ""}, {"m", 7, 5, ""}} {
		b := bodies[k]
		if b.Model != want.model || b.MaxTokens != want.max || reqs[k].InputTokens != want.words {
			t.Errorf("item %d: model %q, max_tokens %d, %d words; want %+v", k, b.Model, b.MaxTokens, reqs[k].InputTokens, want)
		}
		if want.prompt != "" && prompt(t, b) != want.prompt {
			t.Errorf("item %d: prompt %q", k, prompt(t, b))
		}
	}
	if string(bodies[0].Messages) != `[{"role":"system","content":"be brief"},{"role":"user","content":"one two three"}]` {
		t.Errorf("messages not passed through: %s", bodies[0].Messages)
	}

	for _, bad := range []string{`{"max_tokens":3}`, `{"messages":"hi"}`, `not json`, ``} {
		if err := os.WriteFile(path, []byte(bad+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadDataset(path); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseRange(t *testing.T) {
	for in, want := range map[string]result.Range{
		"32":                   {Min: 32, Max: 32, Dist: "uniform"},
		"10:20":                {Min: 10, Max: 20, Dist: "uniform"},
		"normal:100,20":        {Min: 1, Max: 220, Dist: "normal", Mean: 100, StdDev: 20},
		"normal:100,20,50,9":   {},
		"normal:100,20,50,150": {Min: 50, Max: 150, Dist: "normal", Mean: 100, StdDev: 20},
	} {
		got, err := ParseRange(in)
		if want == (result.Range{}) {
			if err == nil {
				t.Errorf("%q: no error", in)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: got %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "20:10", "x", "normal:1", "normal:a,b"} {
		if _, err := ParseRange(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseWeighted(t *testing.T) {
	got, err := ParseWeighted("llama:8b@3, gpt=x ,z@0.5")
	want := []result.Weight{{Value: "llama:8b", Weight: 3}, {Value: "gpt=x", Weight: 1}, {Value: "z", Weight: 0.5}}
	if err != nil || len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("got %+v, %v", got, err)
	}
	for _, bad := range []string{"", "a@0", "a@x", "@2"} {
		if _, err := ParseWeighted(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestWorkloadAPIs checks each API's request body and headers, with the
// first dataset line's system message.
func TestWorkloadAPIs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	line := `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}],"max_tokens":7}`
	if err := os.WriteFile(path, []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := LoadDataset(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[API]string{
		APIChat:        `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
		APICompletions: `{"model":"m","prompt":"be brief\none two","max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
		APIResponses:   `{"model":"m","input":[{"role":"system","content":"be brief"},{"role":"user","content":"one two"}],"max_output_tokens":7,"stream":true}`,
		APIMessages:    `{"model":"m","max_tokens":7,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}],"stream":true}`,
		APIEmbeddings:  `{"model":"m","input":"be brief\none two"}`,
	}
	for _, api := range APIs {
		w := &Workload{Models: []result.Weight{{Value: "m", Weight: 1}}, Input: fixed(1), Output: fixed(16), Dataset: ds,
			Stream: true, NoHints: true, API: api, Keys: []Key{{Name: "k", Key: "sk-1", Weight: 1}}}
		if err := w.validate(); err != nil {
			t.Fatal(err)
		}
		r, err := w.Item(0)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Body) != want[api] {
			t.Errorf("%s body\n got %s\nwant %s", api, r.Body, want[api])
		}
		if r.API != api || r.Stream != (api != APIEmbeddings) || (r.OutputTokens == 0) != (api == APIEmbeddings) || r.InputTokens != 4 {
			t.Errorf("%s request %+v", api, r)
		}
		anthropic := r.Header.Get("x-api-key") == "sk-1" && r.Header.Get("anthropic-version") != "" && r.Header.Get("Authorization") == ""
		if openAI := r.Header.Get("Authorization") == "Bearer sk-1"; anthropic != (api == APIMessages) || openAI == anthropic {
			t.Errorf("%s headers %v", api, r.Header)
		}
	}
	if err := (&Workload{Models: []result.Weight{{Value: "m", Weight: 1}}, Input: fixed(1), Output: fixed(1), API: "grpc"}).validate(); err == nil {
		t.Error("unknown API accepted")
	}
}
