package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// The example policies read these input fields, and no others: the key of
// their memoized decisions.
func TestMemoKeysOnWhatThePolicyReads(t *testing.T) {
	e := loadDefault(t)
	if !e.Memoize() {
		t.Fatal("the example policies are not memoized")
	}
	var got []string
	for _, p := range e.memo.paths {
		got = append(got, strings.Join(p, "."))
	}
	want := []string{"labels.team", "labels.tier", "principal.budget_month", "principal.id", "principal.type",
		"request.api", "request.max_tokens", "request.method", "request.model", "request.path", "tenant"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("memo keys on %q, want %q", got, want)
	}
}

// A memoized engine answers exactly what evaluating answers, for inputs
// that differ in every field, served from the memo or not.
func TestMemoMatchesEvaluation(t *testing.T) {
	plain, memoized := loadDefault(t), loadDefault(t)
	memoized.Memoize()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	var inputs []*Input
	for range 400 {
		in := chat(pick("acme", "globex", "initech", "playground", "vandelay", "soylent", "nobody"),
			pick("llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "mixtral-8x22b-instruct", "bge-m3", "", "gpt-x"))
		in.Principal.ID = pick("key-1", "key-2", "")
		in.Principal.Type = pick("api_key", "jwt", "anonymous")
		in.Labels = map[string]string{"team": pick("a", "search")}
		in.Principal.BudgetMonth = []int64{0, 500e12}[rng.IntN(2)]
		if rng.IntN(2) == 0 {
			in.Labels["tier"] = pick("free", "standard", "premium", "gold")
		}
		in.Request.Method = pick("POST", "GET")
		in.Request.Path = pick("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/messages/count_tokens")
		in.Request.API = pick("chat", "completions", "embeddings", "count_tokens", "")
		in.Request.PreviousResponseID = pick("", "resp_1")
		in.Request.Background, in.Request.Store = rng.IntN(2) == 0, rng.IntN(2) == 0
		in.Request.Conversation, in.Request.PromptID = pick("", "conv_1"), pick("", "pmpt_1")
		in.Request.MaxTokens = []int{0, 16, 1024, 5000, 20000}[rng.IntN(5)]
		in.Request.EstimatedPromptTokens = rng.IntN(3) * 100
		in.Request.Headers["x-request-id"] = fmt.Sprint(rng.Int())
		in.Usage.Requests = rng.Int64N(100)
		inputs = append(inputs, in)
	}
	// The plain engine's answers, evaluated once: the second round asks the
	// memoized one again, where every answer must be a hit.
	wants := make([]Decision, len(inputs))
	werrs := make([]error, len(inputs))
	for i, in := range inputs {
		wants[i], werrs[i] = plain.Decide(ctx, in)
	}
	for round := range 2 {
		for i, in := range inputs {
			want, werr := wants[i], werrs[i]
			got, gerr := memoized.Decide(ctx, in)
			if !reflect.DeepEqual(got, want) || (werr == nil) != (gerr == nil) {
				t.Fatalf("round %d, input %d %+v:\nmemoized %+v (%v)\nevaluated %+v (%v)", round, i, in, got, gerr, want, werr)
			}
		}
	}
	hits, misses := memoized.MemoStats()
	if hits < uint64(len(inputs)) || misses == 0 || misses > uint64(len(inputs)) {
		t.Errorf("%d hits, %d misses for %d inputs twice", hits, misses, len(inputs))
	}
	// A request id, usage or any other field the policy does not read
	// leaves the key alone.
	in := chat("acme", "llama-3.1-70b-instruct")
	memoized.Decide(ctx, in)
	h0, _ := memoized.MemoStats()
	in.Request.Headers["x-request-id"] = "other"
	in.Usage = Usage{Requests: 1e6}
	in.Labels["region"] = "other"
	in.Cost.Reservation.Cost = 1e9
	memoized.Decide(ctx, in)
	if h1, _ := memoized.MemoStats(); h1 != h0+1 {
		t.Error("a field the policy does not read missed the memo")
	}
}

// Decisions that do not depend on the input alone are never memoized, nor
// are those of a policy that reads the whole input.
func TestMemoRefused(t *testing.T) {
	for name, authz := range map[string]string{
		"time":        "allow if time.now_ns() > 0",
		"whole input": "allow if count(input) > 0",
		"with":        "allow if ok with input.tenant as \"acme\"\nok if input.tenant == \"acme\"",
		"in function": "allow if f(1)\nf(x) := true if { x == 1; rand.intn(\"k\", 10) >= 0 }",
	} {
		t.Run(name, func(t *testing.T) {
			e, err := Load(context.Background(), policyDir(t, map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\n" + authz + "\n"}))
			if err != nil {
				t.Fatal(err)
			}
			if e.Memoize() {
				t.Fatal("memoized")
			}
			if d, err := e.Decide(context.Background(), chat("acme", "m")); err != nil || !d.Allow {
				t.Fatalf("%+v, %v", d, err)
			}
		})
	}
}

// A policy reading input.usage keys on it; a whole map is read as a whole.
func TestMemoUsageAndMaps(t *testing.T) {
	e, err := Load(context.Background(), policyDir(t, map[string]string{
		"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if { input.usage.requests < 10; count(input.labels) < 3 }\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Memoize() {
		t.Fatal("not memoized")
	}
	ctx := context.Background()
	in := chat("acme", "m")
	one := map[string]string{"a": "1"}
	for _, tc := range []struct {
		requests int64
		labels   map[string]string
		allow    bool
		err      bool
	}{
		{3, one, true, false}, {30, one, false, false}, {3, map[string]string{"a": "1", "b": "2", "c": "3"}, false, false},
		{3, map[string]string{}, true, false},
		{3, nil, false, true}, // null, not {}: count fails, and errors are not memoized
	} {
		in.Usage.Requests, in.Labels = tc.requests, tc.labels
		for range 2 {
			if d, err := e.Decide(ctx, in); (err != nil) != tc.err || d.Allow != tc.allow {
				t.Fatalf("usage %d labels %v: %+v %v", tc.requests, tc.labels, d, err)
			}
		}
	}
}

// A policy reading the API and a response's previous_response_id is
// memoized, keyed on both.
func TestMemoAPIFields(t *testing.T) {
	e, err := Load(context.Background(), policyDir(t, map[string]string{
		"authz.rego": "package infergate.authz\n\ndefault allow := false\n\n" +
			"allow if { input.request.api == \"responses\"; input.request.previous_response_id == \"\" }\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Memoize() {
		t.Fatal("not memoized")
	}
	var got []string
	for _, p := range e.memo.paths {
		got = append(got, strings.Join(p, "."))
	}
	if want := []string{"request.api", "request.previous_response_id"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("memo keys on %q, want %q", got, want)
	}
	in := chat("acme", "m")
	for _, tc := range []struct {
		api, previous string
		allow         bool
	}{{"responses", "", true}, {"responses", "resp_1", false}, {"chat", "", false}, {"responses", "", true}} {
		in.Request.API, in.Request.PreviousResponseID = tc.api, tc.previous
		for range 2 {
			if d, err := e.Decide(context.Background(), in); err != nil || d.Allow != tc.allow {
				t.Fatalf("api %q previous %q: %+v %v", tc.api, tc.previous, d, err)
			}
		}
	}
	if hits, _ := e.MemoStats(); hits < 4 {
		t.Errorf("%d memo hits", hits)
	}
}

// A policy reading a response's background, conversation, prompt_id and
// store is memoized, keyed on each.
func TestMemoResponsesFields(t *testing.T) {
	e, err := Load(context.Background(), policyDir(t, map[string]string{
		"authz.rego": "package infergate.authz\n\ndefault allow := false\n\n" +
			"allow if { not input.request.background; input.request.conversation == \"\"; input.request.prompt_id == \"\"; input.request.store }\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Memoize() {
		t.Fatal("not memoized")
	}
	in := chat("acme", "m")
	for _, tc := range []struct {
		background, store      bool
		conversation, promptID string
		allow                  bool
	}{
		{false, true, "", "", true}, {true, true, "", "", false}, {false, false, "", "", false},
		{false, true, "c", "", false}, {false, true, "", "p", false}, {false, true, "", "", true},
	} {
		in.Request.Background, in.Request.Store, in.Request.Conversation, in.Request.PromptID = tc.background, tc.store, tc.conversation, tc.promptID
		for range 2 {
			if d, err := e.Decide(context.Background(), in); err != nil || d.Allow != tc.allow {
				t.Fatalf("%+v: %+v %v", tc, d, err)
			}
		}
	}
	if hits, _ := e.MemoStats(); hits < 6 {
		t.Errorf("%d memo hits", hits)
	}
}

// The memo keeps at most memoSize decisions.
func TestMemoBounded(t *testing.T) {
	e := loadDefault(t)
	e.Memoize()
	for i := range 3 * memoSize {
		in := chat("acme", "llama-3.1-70b-instruct")
		in.Request.EstimatedPromptTokens = i
		if _, err := e.Decide(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.memo.cur) + len(e.memo.old); n > memoSize {
		t.Fatalf("%d decisions kept", n)
	}
}

func BenchmarkDecideMemoized(b *testing.B) {
	e := loadDefault(b)
	e.Memoize()
	in := benchInput()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := e.Decide(ctx, in)
		if err != nil || !d.Allow {
			b.Fatal(d, err)
		}
	}
}
