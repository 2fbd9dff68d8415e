package policy

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/ratelimit"
)

// policiesDir holds the default policies shipped with infergate.
const policiesDir = "../../policies"

// copyPolicies copies the default policies into a fresh directory.
func copyPolicies(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(policiesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(policiesDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, e.Name(), string(b))
	}
	return dir
}

// writeFile replaces a file atomically, as a deployment (or a ConfigMap
// update) does: a watcher polling meanwhile never reads half a file.
func writeFile(t testing.TB, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// policyDir writes files (name → content) into a fresh directory.
func policyDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		writeFile(t, dir, name, content)
	}
	return dir
}

// chat is a realistic streaming chat completion from an API key.
func chat(tenant, model string) *Input {
	return &Input{
		Principal: Principal{ID: "key-1", Type: "api_key", Claims: map[string]any{}},
		Tenant:    tenant,
		Labels:    map[string]string{"team": "search"},
		Request: Request{
			Method:                "POST",
			Path:                  "/v1/chat/completions",
			API:                   "chat",
			Headers:               map[string]string{"user-agent": "openai-python/1.50.0", "x-request-id": "4f1c2a"},
			Model:                 model,
			Stream:                true,
			MaxTokens:             256,
			EstimatedPromptTokens: 40,
		},
		Usage: Usage{Requests: 3, Tokens: 1200},
	}
}

func limits(tenant, principal, model string, rpm, tpm, otph int64) []ratelimit.Limit {
	ls := []ratelimit.Limit{
		{Name: "requests-per-minute", Key: "tenant=" + tenant + "/principal=" + principal, Unit: ratelimit.Requests, Amount: rpm, Window: time.Minute},
		{Name: "tenant-tokens-per-minute", Key: "tenant=" + tenant, Unit: ratelimit.TotalTokens, Amount: tpm, Window: time.Minute},
	}
	if model != "" {
		ls = append(ls, ratelimit.Limit{Name: "model-output-tokens-per-hour", Key: "tenant=" + tenant + "/model=" + model,
			Unit: ratelimit.OutputTokens, Amount: otph, Window: time.Hour})
	}
	return ls
}

func sortLimits(ls []ratelimit.Limit) []ratelimit.Limit {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b ratelimit.Limit) int { return strings.Compare(a.Name, b.Name) })
	return ls
}

func loadDefault(t testing.TB) *Engine {
	t.Helper()
	e, err := Load(context.Background(), policiesDir)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLoadRunsPolicyTests(t *testing.T) {
	e := loadDefault(t)
	if e.Tests() < 30 {
		t.Errorf("ran %d policy tests, want the default policies' tests", e.Tests())
	}
}

// The query the README shows is the one the default policies get.
func TestQueryForDefaultPolicies(t *testing.T) {
	want := `allow := data.infergate.authz.allow
reason := [x | x := data.infergate.authz.reason]
status := [x | x := data.infergate.authz.status]
checks := data.infergate.authz.checks
max_tokens := [x | x := data.infergate.authz.max_tokens]
limits := data.infergate.ratelimit.limits
reserve := [x | x := data.infergate.ratelimit.reserve]
allow_unbounded := data.infergate.authz.allow_unbounded
fairness_id := [x | x := data.infergate.authz.fairness_id]
objective := [x | x := data.infergate.authz.objective]`
	if got := loadDefault(t).Query(); got != want {
		t.Errorf("query:\n%s\nwant:\n%s", got, want)
	}
	readme, err := os.ReadFile(filepath.Join(policiesDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), want) {
		t.Error("policies/README.md does not show the query")
	}
}

func TestDecideDefaultPolicies(t *testing.T) {
	e := loadDefault(t)
	with := func(in *Input, f func(*Input)) *Input { f(in); return in }
	tests := []struct {
		name   string
		in     *Input
		want   Decision
		limits []ratelimit.Limit // checked when allowed
	}{
		{
			name:   "premium any model",
			in:     chat("acme", "llama-3.1-70b-instruct"),
			want:   Decision{Allow: true, Reason: "allowed on the premium tier"},
			limits: limits("acme", "key-1", "llama-3.1-70b-instruct", 600, 2000000, 20000000),
		},
		{
			name:   "standard large model",
			in:     chat("globex", "mixtral-8x22b-instruct"),
			want:   Decision{Allow: true, Reason: "allowed on the standard tier"},
			limits: limits("globex", "key-1", "mixtral-8x22b-instruct", 120, 200000, 2000000),
		},
		{
			name:   "free small model",
			in:     chat("initech", "qwen2.5-7b-instruct"),
			want:   Decision{Allow: true, Reason: "allowed on the free tier"},
			limits: limits("initech", "key-1", "qwen2.5-7b-instruct", 20, 20000, 100000),
		},
		{
			name: "free large model",
			in:   chat("initech", "llama-3.1-70b-instruct"),
			want: Decision{Status: 403, Reason: `model "llama-3.1-70b-instruct" is not available on the free tier`},
		},
		{
			name: "standard unknown model",
			in:   chat("globex", "unlisted-model"),
			want: Decision{Status: 403, Reason: `model "unlisted-model" is not available on the standard tier`},
		},
		{
			name: "anonymous",
			in:   with(chat("acme", "llama-3.1-8b-instruct"), func(in *Input) { in.Principal = Principal{Type: "anonymous"} }),
			want: Decision{Status: 401, Reason: "missing credentials"},
		},
		{
			name: "anonymous where the tenant allows it",
			in: with(chat("playground", "llama-3.1-8b-instruct"), func(in *Input) {
				in.Principal = Principal{Type: "anonymous"}
				in.Labels = nil
			}),
			want:   Decision{Allow: true, Reason: "allowed on the free tier"},
			limits: limits("playground", "", "llama-3.1-8b-instruct", 20, 20000, 100000),
		},
		{
			name: "jwt",
			in: with(chat("globex", "llama-3.1-8b-instruct"), func(in *Input) {
				in.Principal = Principal{ID: "alice", Type: "jwt", Claims: map[string]any{"sub": "alice", "exp": 1.9e9}}
			}),
			want:   Decision{Allow: true, Reason: "allowed on the standard tier"},
			limits: limits("globex", "alice", "llama-3.1-8b-instruct", 120, 200000, 2000000),
		},
		{
			name: "unknown tenant",
			in:   chat("hooli", "llama-3.1-8b-instruct"),
			want: Decision{Status: 403, Reason: `unknown tenant "hooli"`},
		},
		{
			name: "unknown path",
			in:   with(chat("acme", "llama-3.1-8b-instruct"), func(in *Input) { in.Request.Path = "/v1/audio/speech" }),
			want: Decision{Status: 404, Reason: "no route for POST /v1/audio/speech"},
		},
		{
			name: "wrong method",
			in:   with(chat("acme", "llama-3.1-8b-instruct"), func(in *Input) { in.Request.Method = "PUT" }),
			want: Decision{Status: 404, Reason: "no route for PUT /v1/chat/completions"},
		},
		{
			name: "model listing",
			in: with(chat("initech", ""), func(in *Input) {
				in.Request = Request{Method: "GET", Path: "/v1/models"}
			}),
			want:   Decision{Allow: true, Reason: "allowed on the free tier"},
			limits: limits("initech", "key-1", "", 20, 20000, 0),
		},
		{
			name: "max_tokens above the free cap",
			in:   with(chat("initech", "llama-3.1-8b-instruct"), func(in *Input) { in.Request.MaxTokens = 2048 }),
			want: Decision{Status: 400, Reason: "max_tokens 2048 exceeds the free tier's limit of 1024"},
		},
		{
			name:   "max_tokens at the premium cap",
			in:     with(chat("acme", "llama-3.1-8b-instruct"), func(in *Input) { in.Request.MaxTokens = 16384 }),
			want:   Decision{Allow: true, Reason: "allowed on the premium tier"},
			limits: limits("acme", "key-1", "llama-3.1-8b-instruct", 600, 2000000, 20000000),
		},
		{
			name: "tier label lowers the tier",
			in: with(chat("acme", "llama-3.1-70b-instruct"), func(in *Input) {
				in.Labels = map[string]string{"tier": "free"}
			}),
			want: Decision{Status: 403, Reason: `model "llama-3.1-70b-instruct" is not available on the free tier`},
		},
		{
			name: "a response, capped like a chat",
			in: with(chat("initech", "llama-3.1-8b-instruct"), func(in *Input) {
				in.Request.Path, in.Request.API, in.Request.MaxTokens, in.Request.PreviousResponseID = "/v1/responses", "responses", 2048, "resp_1"
			}),
			want: Decision{Status: 400, Reason: "max_tokens 2048 exceeds the free tier's limit of 1024"},
		},
		{
			name: "embeddings on the search tier",
			in: with(chat("vandelay", "bge-m3"), func(in *Input) {
				in.Request.Path, in.Request.API, in.Request.Stream, in.Request.MaxTokens = "/v1/embeddings", "embeddings", false, 0
			}),
			want:   Decision{Allow: true, Reason: "allowed on the search tier"},
			limits: limits("vandelay", "key-1", "", 600, 1000000, 0),
		},
		{
			name: "no chat on the search tier",
			in:   chat("vandelay", "bge-m3"),
			want: Decision{Status: 403, Reason: "the chat API is not available on the search tier"},
		},
		{
			name: "tier label cannot raise the tier",
			in: with(chat("initech", "llama-3.1-8b-instruct"), func(in *Input) {
				in.Labels = map[string]string{"tier": "premium"}
			}),
			want: Decision{Status: 403, Reason: `tier label "premium" is not allowed for this tenant`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(context.Background(), tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allow != tt.want.Allow || got.Status != tt.want.Status || got.Reason != tt.want.Reason {
				t.Errorf("got allow=%v status=%d reason=%q, want allow=%v status=%d reason=%q",
					got.Allow, got.Status, got.Reason, tt.want.Allow, tt.want.Status, tt.want.Reason)
			}
			if got.Checks != nil {
				t.Errorf("checks = %q, want none", got.Checks)
			}
			if tt.want.Allow {
				if g, w := sortLimits(got.Limits), sortLimits(tt.limits); !slices.Equal(g, w) {
					t.Errorf("limits:\n got %+v\nwant %+v", g, w)
				}
				if got.Reserve != nil {
					t.Errorf("reserve = %+v, want the default", got.Reserve)
				}
			}
		})
	}
}

// The shipped policies name each tier's cap, with or without a client
// max_tokens, and leave the reservation to the gate's default (which
// reserves the cap when max_tokens is unset).
func TestDecideNamesTierCap(t *testing.T) {
	e := loadDefault(t)
	for _, tc := range []struct {
		tenant    string
		maxTokens int
		want      int
	}{{"globex", 0, 4096}, {"globex", 256, 4096}, {"initech", 0, 1024}, {"acme", 0, 16384}} {
		in := chat(tc.tenant, "llama-3.1-8b-instruct")
		in.Request.MaxTokens = tc.maxTokens
		d, err := e.Decide(context.Background(), in)
		if err != nil || !d.Allow {
			t.Fatalf("Decide = %+v, %v", d, err)
		}
		if d.MaxTokens != tc.want || d.Reserve != nil {
			t.Errorf("%s, max_tokens %d: cap %d, reserve %+v; want cap %d, the default reserve", tc.tenant, tc.maxTokens, d.MaxTokens, d.Reserve, tc.want)
		}
	}
	in := chat("initech", "")
	in.Request.Method, in.Request.Path, in.Request.MaxTokens = "GET", "/v1/models", 0
	if d, err := e.Decide(context.Background(), in); err != nil || !d.Allow || d.MaxTokens != 0 {
		t.Errorf("model listing: %+v, %v; want no cap", d, err)
	}
}

// allow_unbounded names, per tier of the default policies, the costs the
// gate cannot bound that a request may carry; a policy's own set is read
// sorted, without duplicates.
func TestDecideAllowUnbounded(t *testing.T) {
	e := loadDefault(t)
	for tenant, want := range map[string][]string{
		"initech": nil,
		"globex":  {"previous_response_id"},
		"acme":    {"conversation", "previous_response_id", "prompt"},
	} {
		d, err := e.Decide(context.Background(), chat(tenant, "llama-3.1-8b-instruct"))
		if err != nil || !d.Allow || !slices.Equal(d.AllowUnbounded, want) {
			t.Errorf("%s: %+v, %v; want allow_unbounded %q", tenant, d, err, want)
		}
	}
	e, err := Load(context.Background(), policyDir(t, map[string]string{"authz.rego": allowAll +
		"allow_unbounded := [\"background\", \"prompt\", \"background\"]\n"}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Decide(context.Background(), chat("acme", "m"))
	if err != nil || !slices.Equal(d.AllowUnbounded, []string{"background", "prompt"}) {
		t.Errorf("Decide = %+v, %v", d, err)
	}
}

// objective and fairness_id, for an Endpoint Picker: the default policies
// name each tier's objective and leave the fairness id to the gate (the
// tenant); a policy's own are read as they are.
func TestDecidePickerIdentity(t *testing.T) {
	e := loadDefault(t)
	for tenant, want := range map[string]string{"initech": "sheddable", "globex": "standard", "acme": "critical"} {
		d, err := e.Decide(context.Background(), chat(tenant, "llama-3.1-8b-instruct"))
		if err != nil || !d.Allow || d.Objective != want || d.FairnessID != "" {
			t.Errorf("%s: %+v, %v; want objective %q and no fairness id", tenant, d, err, want)
		}
	}
	if d, err := e.Decide(context.Background(), chat("initech", "llama-3.1-70b-instruct")); err != nil || d.Allow || d.Objective != "" {
		t.Errorf("denied: %+v, %v; want no objective", d, err)
	}
	e, err := Load(context.Background(), policyDir(t, map[string]string{"authz.rego": allowAll +
		"fairness_id := concat(\"/\", [input.tenant, input.principal.id])\nobjective := \"batch.low\"\n"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"key-1", "key-2", "key-1"} { // memoized on what the answers read
		in := chat("acme", "m")
		in.Principal.ID = id
		d, err := e.Decide(context.Background(), in)
		if err != nil || d.FairnessID != "acme/"+id || d.Objective != "batch.low" {
			t.Errorf("principal %s: Decide = %+v, %v", id, d, err)
		}
	}
}

func TestDecideChecks(t *testing.T) {
	dir := copyPolicies(t)
	data, err := os.ReadFile(filepath.Join(dir, "data.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The free tier is the first with checks: [].
	writeFile(t, dir, "data.yaml", strings.Replace(string(data), "checks: []", "checks: [moderation, pii]", 1))
	e, err := Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Decide(context.Background(), chat("initech", "llama-3.1-8b-instruct"))
	if err != nil || !d.Allow {
		t.Fatalf("Decide = %+v, %v", d, err)
	}
	if !slices.Equal(d.Checks, []string{"moderation", "pii"}) {
		t.Errorf("checks = %q", d.Checks)
	}
	d, err = e.Decide(context.Background(), chat("acme", "llama-3.1-8b-instruct"))
	if err != nil || d.Checks != nil {
		t.Errorf("premium: checks = %q, %v", d.Checks, err)
	}
}

// A minimal authz package for policies under test.
const allowAll = "package infergate.authz\n\nallow := true\n"

func TestDecideReserveOverride(t *testing.T) {
	tests := []struct {
		reserve string
		want    ratelimit.Cost
	}{
		{`{"input_tokens": 7, "output_tokens": 9}`, ratelimit.Cost{Requests: 1, InputTokens: 7, OutputTokens: 9}},
		{`{"output_tokens": 5}`, ratelimit.Cost{Requests: 1, InputTokens: Unset, OutputTokens: 5}},
		{`{"input_tokens": input.request.estimated_prompt_tokens * 2}`, ratelimit.Cost{Requests: 1, InputTokens: 80, OutputTokens: Unset}},
		{`{}`, ratelimit.Cost{Requests: 1, InputTokens: Unset, OutputTokens: Unset}},
	}
	for _, tt := range tests {
		t.Run(tt.reserve, func(t *testing.T) {
			dir := policyDir(t, map[string]string{
				"authz.rego":     allowAll,
				"ratelimit.rego": "package infergate.ratelimit\n\nreserve := " + tt.reserve + "\n",
			})
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), chat("acme", "m"))
			if err != nil {
				t.Fatal(err)
			}
			if d.Reserve == nil || *d.Reserve != tt.want {
				t.Errorf("reserve = %+v, want %+v", d.Reserve, tt.want)
			}
		})
	}
}

// Limits and checks may be sets, arrays, complete rules with or without a
// default, or data.
func TestDecideAnswerForms(t *testing.T) {
	lim := `{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": "30s"}`
	want := []ratelimit.Limit{{Name: "n", Key: "k", Unit: ratelimit.Requests, Amount: 10, Window: 30 * time.Second}}
	tests := map[string]map[string]string{
		"set":              {"ratelimit.rego": "package infergate.ratelimit\n\nlimits contains " + lim + "\n"},
		"array":            {"ratelimit.rego": "package infergate.ratelimit\n\nlimits := [" + lim + "]\n"},
		"array or default": {"ratelimit.rego": "package infergate.ratelimit\n\ndefault limits := []\n\nlimits := [" + lim + "] if input.tenant == \"acme\"\n"},
		"data":             {"data.json": `{"infergate": {"ratelimit": {"limits": [` + lim + `]}}}`},
	}
	for name, files := range tests {
		t.Run(name, func(t *testing.T) {
			files["authz.rego"] = "package infergate.authz\n\nallow := true\n\nchecks := [\"b\", \"a\", \"b\"]\n"
			e, err := Load(context.Background(), policyDir(t, files))
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), chat("acme", "m"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.Limits, want) || !slices.Equal(d.Checks, []string{"a", "b"}) {
				t.Errorf("limits %+v, checks %q", d.Limits, d.Checks)
			}
			d, err = e.Decide(context.Background(), chat("globex", "m"))
			if name == "array or default" && (err != nil || d.Limits != nil) {
				t.Errorf("default: limits %+v, %v", d.Limits, err)
			}
		})
	}
}

func TestDecideDefaults(t *testing.T) {
	tests := []struct {
		authz string
		want  Decision
	}{
		{"default allow := false", Decision{Status: 403, Reason: "denied by policy"}},
		{"allow := true", Decision{Allow: true, Reason: "allowed by policy"}},
		{"default allow := false\nstatus := 429\nreason := \"slow down\"", Decision{Status: 429, Reason: "slow down"}},
		// status and reason of an allowed request: status is for denials only
		{"allow := true\ndefault status := 403\nreason := \"ok\"", Decision{Allow: true, Reason: "ok"}},
		{"default allow := false\nallow if input.tenant == \"acme\"", Decision{Allow: true, Reason: "allowed by policy"}},
		// a policy may set status as a float; 404.0 is 404
		{"default allow := false\nstatus := 808 / 2", Decision{Status: 404, Reason: "denied by policy"}},
	}
	for _, tt := range tests {
		t.Run(tt.authz, func(t *testing.T) {
			dir := policyDir(t, map[string]string{"authz.rego": "package infergate.authz\n\n" + tt.authz + "\n"})
			e, err := Load(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), chat("acme", "m"))
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != tt.want.Allow || d.Status != tt.want.Status || d.Reason != tt.want.Reason ||
				d.Limits != nil || d.Reserve != nil || d.Checks != nil || d.MaxTokens != 0 {
				t.Errorf("got %+v, want %+v", d, tt.want)
			}
		})
	}
}

// Every malformed answer is an error and a denial: never fail open.
func TestDecideFailsClosed(t *testing.T) {
	limit := func(fields string) string {
		return "package infergate.ratelimit\n\nlimits contains " + fields + "\n"
	}
	ok := `{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": "1m"}`
	tests := []struct {
		name, authz, ratelimit, wantErr string
	}{
		{"allow undefined", "allow if input.tenant == \"nobody\"", "", "allow is undefined"},
		{"allow not boolean", "allow := \"yes\"", "", "allow must be a boolean"},
		{"allow conflict", "allow := true\nallow := false if input.tenant == \"acme\"", "", "conflict"},
		{"reason not string", "allow := true\nreason := 1", "", "reason must be a string"},
		{"status not error", "default allow := false\nstatus := 200", "", "status must be an HTTP error status"},
		{"status not number", "default allow := false\nstatus := \"403\"", "", "status must be an HTTP error status"},
		{"checks not strings", "allow := true\nchecks := {1}", "", "checks: want non-empty strings"},
		{"checks not set", "allow := true\nchecks := \"moderation\"", "", "checks must be a set"},
		{"built-in error", "allow if to_number(input.tenant) > 1", "", "to_number"},
		{"limits not set", allowAll, "package infergate.ratelimit\n\nlimits := 3\n", "limits must be a set or array"},
		{"limit not object", allowAll, limit(`"x"`), "not an object"},
		{"unknown unit", allowAll, limit(`{"name": "n", "key": "k", "unit": "tokens", "amount": 10, "window": "1m"}`), `unknown unit "tokens"`},
		{"zero amount", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 0, "window": "1m"}`), "amount must be a positive integer"},
		{"negative amount", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": -5, "window": "1m"}`), "amount must be a positive integer"},
		{"fractional amount", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 1.5, "window": "1m"}`), "amount must be a positive integer"},
		{"amount string", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": "10", "window": "1m"}`), "amount must be a positive integer"},
		{"bad window", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": "1 minute"}`), "window"},
		{"short window", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": "10ms"}`), "shorter than 1s"},
		{"window number", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": 60}`), `"window" must be a non-empty string`},
		{"no key", allowAll, limit(`{"name": "n", "unit": "requests", "amount": 10, "window": "1m"}`), `no "key"`},
		{"empty key", allowAll, limit(`{"name": "n", "key": "", "unit": "requests", "amount": 10, "window": "1m"}`), "key\" must be a non-empty string"},
		{"no name", allowAll, limit(`{"key": "k", "unit": "requests", "amount": 10, "window": "1m"}`), `no "name"`},
		{"unknown field", allowAll, limit(`{"name": "n", "key": "k", "unit": "requests", "amount": 10, "window": "1m", "burst": 5}`), `unknown field "burst"`},
		{"same counter twice", allowAll, limit(ok) + "\nlimits contains " + strings.Replace(ok, `"amount": 10`, `"amount": 20`, 1), "share key"},
		{"reserve not object", allowAll, "package infergate.ratelimit\n\nreserve := 5\n", "reserve must be an object"},
		{"reserve negative", allowAll, "package infergate.ratelimit\n\nreserve := {\"input_tokens\": -1}\n", "non-negative integer"},
		{"reserve unknown field", allowAll, "package infergate.ratelimit\n\nreserve := {\"tokens\": 1}\n", `unknown field "tokens"`},
		{"max_tokens zero", "allow := true\nmax_tokens := 0", "", "max_tokens must be a positive integer"},
		{"max_tokens fractional", "allow := true\nmax_tokens := 10.5", "", "max_tokens must be a positive integer"},
		{"max_tokens string", "allow := true\nmax_tokens := \"1024\"", "", "max_tokens must be a positive integer"},
		{"max_tokens too large", "allow := true\nmax_tokens := 4294967296", "", "max_tokens must be a positive integer"},
		{"allow_unbounded unknown field", "allow := true\nallow_unbounded := {\"previous_response\"}", "", "allow_unbounded: want one of"},
		{"allow_unbounded not strings", "allow := true\nallow_unbounded := {true}", "", "allow_unbounded: want one of"},
		{"allow_unbounded not set", "allow := true\nallow_unbounded := \"background\"", "", "allow_unbounded must be a set"},
		{"objective not a name", "allow := true\nobjective := \"Critical\"", "", "objective must be an InferenceObjective's name"},
		{"objective a header", "allow := true\nobjective := \"critical\\r\\nx-evil: 1\"", "", "objective must be"},
		{"objective not string", "allow := true\nobjective := 10", "", "objective must be"},
		{"fairness_id empty", "allow := true\nfairness_id := \"\"", "", "fairness_id must be 1 to 128"},
		{"fairness_id a list", "allow := true\nfairness_id := \"a,b\"", "", "fairness_id must be"},
		{"fairness_id too long", "allow := true\nfairness_id := concat(\"\", [\"a\" | some _ in numbers.range(0, 128)])", "", "fairness_id must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{"authz.rego": tt.authz}
			if !strings.HasPrefix(tt.authz, "package") {
				files["authz.rego"] = "package infergate.authz\n\n" + tt.authz + "\n"
			}
			if tt.ratelimit != "" {
				files["ratelimit.rego"] = tt.ratelimit
			}
			e, err := Load(context.Background(), policyDir(t, files))
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), chat("acme", "m"))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
			if d.Allow || d.Status != 500 || d.Limits != nil || d.Reserve != nil || d.Checks != nil || d.MaxTokens != 0 ||
				d.FairnessID != "" || d.Objective != "" {
				t.Errorf("decision = %+v, want a bare denial", d)
			}
		})
	}
}

func TestDecideCancelledContextDenies(t *testing.T) {
	e := loadDefault(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := e.Decide(ctx, chat("acme", "llama-3.1-8b-instruct"))
	if err == nil || d.Allow {
		t.Errorf("Decide with a cancelled context = %+v, %v; want an error and a denial", d, err)
	}
	if d, err := e.Decide(context.Background(), nil); err == nil || d.Allow {
		t.Errorf("Decide(nil) = %+v, %v", d, err)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		wantErr []string
	}{
		{
			name: "syntax error",
			files: map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if {\n\tinput.tenant ==\n}\n",
			},
			wantErr: []string{"authz.rego:7", "rego_parse_error"},
		},
		{
			name: "compile error",
			files: map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if undefined_function(input.tenant)\n",
			},
			wantErr: []string{"authz.rego:5", "undefined function"},
		},
		{
			name: "unknown input field",
			files: map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if input.request.max_token < 100\n",
			},
			wantErr: []string{"authz.rego:5", "undefined ref: input.request.max_token"},
		},
		{
			name: "input field of the wrong type",
			files: map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if count(input.request.stream) > 0\n",
			},
			wantErr: []string{"authz.rego:5", "rego_type_error"},
		},
		{
			name: "failing policy test",
			files: map[string]string{
				"authz.rego":      allowAll,
				"authz_test.rego": "package infergate.authz_test\n\nimport data.infergate.authz\n\ntest_allows if authz.allow\n\ntest_denies_acme if {\n\tnot authz.allow with input as {\"tenant\": \"acme\"}\n}\n",
			},
			wantErr: []string{"1 of 2 policy tests failed", "authz_test.rego:7", "data.infergate.authz_test.test_denies_acme: FAIL"},
		},
		{
			// Each failure in one line: the test, where it failed (the
			// expression as written, its fixtures left out) and what the
			// values there were, a rule's and a variable's.
			name: "failing policy test, explained",
			files: map[string]string{
				"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if input.tenant == \"acme\"\n\nreason := concat(\" \", [\"hello\", input.tenant])\n",
				"authz_test.rego": "package infergate.authz_test\n\nimport data.infergate.authz\n\n" +
					"test_reason if {\n\tauthz.reason == \"hello acme\" with input as {\"tenant\": \"globex\"}\n}\n\n" +
					"test_local if {\n\td := {\"allow\": true, \"n\": 3}\n\td.n > 5\n}\n\n" +
					"test_ok if authz.allow with input as {\"tenant\": \"acme\"}\n",
			},
			wantErr: []string{"2 of 3 policy tests failed",
				"authz_test.rego:5: data.infergate.authz_test.test_reason: FAIL at ",
				"authz_test.rego:6: authz.reason == \"hello acme\" (authz.reason = \"hello globex\")\n",
				"authz_test.rego:9: data.infergate.authz_test.test_local: FAIL at ",
				"authz_test.rego:11: d.n > 5 (d.n = 3)"},
		},
		{
			name: "policy test with a built-in error",
			files: map[string]string{
				"authz.rego":      allowAll,
				"authz_test.rego": "package infergate.authz_test\n\ntest_number if to_number(\"x\") == 1\n",
			},
			wantErr: []string{"test_number: ERROR", "to_number"},
		},
		{
			name:    "no allow rule",
			files:   map[string]string{"authz.rego": "package infergate.authz\n\ndeny := true\n"},
			wantErr: []string{"no rule data.infergate.authz.allow"},
		},
		{
			name:    "no policies",
			files:   map[string]string{"data.json": "{}"},
			wantErr: []string{"no .rego files"},
		},
		{
			name:    "bad data",
			files:   map[string]string{"authz.rego": allowAll, "data.yaml": "a: [b\n"},
			wantErr: []string{"data.yaml"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := policyDir(t, tt.files)
			err := Validate(context.Background(), dir)
			if err == nil {
				t.Fatal("Validate: no error")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// The input's maps (claims, labels, headers) take any key.
func TestLoadTypeChecksInputMaps(t *testing.T) {
	dir := policyDir(t, map[string]string{"authz.rego": `package infergate.authz

default allow := false

allow if {
	"admins" in input.principal.claims.groups
	input.labels.team == "ml"
	startswith(input.request.headers["user-agent"], "curl/")
}
`})
	e, err := Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	in := chat("acme", "m")
	in.Principal.Claims = map[string]any{"groups": []any{"admins"}}
	in.Labels = map[string]string{"team": "ml"}
	in.Request.Headers = map[string]string{"user-agent": "curl/8.5"}
	if d, err := e.Decide(context.Background(), in); err != nil || !d.Allow {
		t.Errorf("Decide = %+v, %v", d, err)
	}
}

func TestLoadSkipsOtherFiles(t *testing.T) {
	dir := copyPolicies(t)
	writeFile(t, dir, "README.md", "# not a policy")
	writeFile(t, dir, ".authz.rego.swp", "garbage")
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "..data"), "authz.rego", "package infergate.authz\n\nallow := true\n")
	if err := Validate(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDataInSubdirectory(t *testing.T) {
	dir := policyDir(t, map[string]string{
		"authz.rego": "package infergate.authz\n\ndefault allow := false\n\nallow if input.tenant in data.tenants.names\n",
	})
	if err := os.Mkdir(filepath.Join(dir, "tenants"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "tenants"), "data.json", `{"names": ["acme"]}`)
	e, err := Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := e.Decide(context.Background(), chat("acme", "m")); err != nil || !d.Allow {
		t.Errorf("Decide = %+v, %v; want data.tenants from tenants/data.json", d, err)
	}
}

// Decisions made concurrently (sharing the prepared query, the data cache
// and the pooled caches) are the decisions made one by one.
func TestDecideConcurrent(t *testing.T) {
	e := loadDefault(t)
	ctx := context.Background()
	var inputs []*Input
	for _, tenant := range []string{"acme", "globex", "initech", "hooli"} {
		for _, model := range []string{"llama-3.1-8b-instruct", "llama-3.1-70b-instruct", ""} {
			inputs = append(inputs, chat(tenant, model))
		}
	}
	want := make([]Decision, len(inputs))
	for i, in := range inputs {
		var err error
		if want[i], err = e.Decide(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for n := range 100 {
				i := (g + n) % len(inputs)
				d, err := e.Decide(ctx, inputs[i])
				if err != nil || !reflect.DeepEqual(d, want[i]) {
					t.Errorf("input %d: %+v, %v; want %+v", i, d, err, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

// Money limits per calendar month, and the request's price and worst-case
// cost in the input, from Rego: a policy can budget in money.
func TestDecideMoneyLimits(t *testing.T) {
	dir := policyDir(t, map[string]string{
		"authz.rego": allowAll,
		"ratelimit.rego": `package infergate.ratelimit

usd := 1000000000000

limits contains {"name": "month", "key": "k", "unit": "money", "amount": 500 * usd, "window": "month"}

limits contains {"name": "key-month", "key": "key", "unit": "money", "amount": input.principal.budget_month, "window": "month"} if input.principal.budget_month > 0

limits contains {"name": "day", "key": "k", "unit": "money", "amount": input.cost.reservation.cost * 3, "window": "24h"} if input.cost.priced
`,
	})
	e, err := Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	in := chat("acme", "m")
	in.Principal.BudgetMonth = 7_000_000
	in.Cost = Cost{Currency: "USD", Priced: true, Price: Price{Input: 1, Output: 2}, Reservation: Reservation{InputTokens: 40, OutputTokens: 10, Cost: 60}}
	d, err := e.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := []ratelimit.Limit{
		{Name: "day", Key: "k", Unit: ratelimit.Money, Amount: 180, Window: 24 * time.Hour},
		{Name: "key-month", Key: "key", Unit: ratelimit.Money, Amount: 7_000_000, Window: ratelimit.Month},
		{Name: "month", Key: "k", Unit: ratelimit.Money, Amount: 500_000_000_000_000, Window: ratelimit.Month},
	}
	slices.SortFunc(d.Limits, func(a, b ratelimit.Limit) int { return strings.Compare(a.Name, b.Name) })
	if !slices.Equal(d.Limits, want) {
		t.Errorf("limits = %+v, want %+v", d.Limits, want)
	}
}
