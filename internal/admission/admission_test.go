package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
)

// fakePolicy answers with a fixed decision and records the input.
type fakePolicy struct {
	d    policy.Decision
	err  error
	last *policy.Input
}

func (f *fakePolicy) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	f.last = in
	return f.d, f.err
}

const secretKey = "sk-live-very-secret"

func newController(t *testing.T) *Controller {
	t.Helper()
	dir := t.TempDir()
	sum := sha256.Sum256([]byte(secretKey))
	path := filepath.Join(dir, "keys.yaml")
	os.WriteFile(path, []byte("keys:\n- id: acme-prod\n  sha256: "+hex.EncodeToString(sum[:])+"\n  tenant: acme\n  labels: {tier: premium}\n"), 0o600)
	keys, err := identity.LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	set := &identity.KeySet{}
	set.Store(keys)
	m, err := NewMetrics(sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	return &Controller{Keys: set, Log: slog.New(slog.DiscardHandler), Metrics: m,
		JWT:     JWT{Enabled: true, Namespace: "envoy.filters.http.jwt_authn", PayloadKey: "jwt_payload", TenantClaim: "tenant", LabelClaims: []string{"tier"}},
		Headers: []string{"user-agent"}}
}

func chat(hdr map[string]string) *request.Admission {
	return &request.Admission{RequestID: "r", Method: "POST", Path: "/v1/chat/completions", Headers: hdr, Completion: true,
		Request: openai.Request{Model: "llama", Stream: true, MaxTokens: 100}, PromptTokens: 20, Body: []byte(`{}`)}
}

func TestIdentity(t *testing.T) {
	c := newController(t)
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Reason: "ok"}}
	ctx := context.Background()
	for name, hdr := range map[string]map[string]string{
		"missing": {},
		"unknown": {"authorization": "Bearer sk-wrong"},
		"basic":   {"authorization": "Basic " + secretKey},
	} {
		v := c.Decide(ctx, chat(hdr))
		if v.Deny == nil || v.Deny.Status != 401 || v.Deny.Type != openai.TypeAuthentication {
			t.Errorf("%s: verdict %+v, want 401", name, v.Deny)
		}
		// Before the body (no parsed request), the same answer.
		iv := c.Identify(ctx, &request.Admission{Method: "POST", Path: "/v1/chat/completions", Headers: hdr, Completion: true})
		if iv.Deny == nil || iv.Deny.Code != v.Deny.Code || iv.Reason != v.Reason {
			t.Errorf("%s: Identify %+v, Decide %+v", name, iv, v)
		}
		if strings.Contains(string(v.Deny.JSON()), "sk-") {
			t.Errorf("%s: a key leaked into the error: %s", name, v.Deny.JSON())
		}
	}
	for _, hdr := range []map[string]string{{"authorization": "Bearer " + secretKey}, {"x-api-key": secretKey}} {
		v := c.Decide(ctx, chat(hdr))
		if v.Deny != nil || v.Principal != "acme-prod" || v.Tenant != "acme" {
			t.Errorf("good key: %+v", v)
		}
		if iv := c.Identify(ctx, &request.Admission{Headers: hdr}); iv.Deny != nil || iv.Principal != "acme-prod" {
			t.Errorf("good key: Identify %+v", iv)
		}
		in := c.Policy.(*fakePolicy).last
		if in.Principal.Type != "api_key" || in.Labels["tier"] != "premium" || in.Request.Model != "llama" || in.Request.EstimatedPromptTokens != 20 {
			t.Errorf("policy input = %+v", in)
		}
	}
	// Verified JWT claims (from jwt_authn) win over headers.
	a := chat(map[string]string{"user-agent": "sdk/1"})
	a.Metadata = map[string]map[string]any{"envoy.filters.http.jwt_authn": {"jwt_payload": map[string]any{"sub": "alice", "tenant": "globex", "tier": "free"}}}
	if iv := c.Identify(ctx, &request.Admission{Metadata: a.Metadata}); iv.Deny != nil || iv.Principal != "alice" {
		t.Errorf("jwt: Identify %+v", iv)
	}
	v := c.Decide(ctx, a)
	in := c.Policy.(*fakePolicy).last
	if v.Deny != nil || v.Principal != "alice" || v.Tenant != "globex" || in.Principal.Type != "jwt" || in.Labels["tier"] != "free" || in.Request.Headers["user-agent"] != "sdk/1" {
		t.Errorf("jwt: verdict %+v, input %+v", v, in)
	}
}

func TestPolicyDenialsAndFailures(t *testing.T) {
	c := newController(t)
	c.Keys = nil
	c.JWT.Enabled = false
	ctx := context.Background()
	for _, tc := range []struct {
		d      policy.Decision
		err    error
		status int
		typ    string
	}{
		{policy.Decision{Allow: false, Reason: "model not in your tier"}, nil, 403, openai.TypePermission},
		{policy.Decision{Allow: false, Status: 401, Reason: "anonymous"}, nil, 401, openai.TypeAuthentication},
		{policy.Decision{Allow: false, Status: 404, Reason: "unknown_url"}, nil, 404, openai.TypeInvalidRequest},
		{policy.Decision{Allow: false, Status: 429, Reason: "slow down"}, nil, 429, openai.TypeRateLimit},
		{policy.Decision{Allow: true}, errors.New("eval: boom"), 500, openai.TypeServer}, // fails closed
	} {
		c.Policy = &fakePolicy{d: tc.d, err: tc.err}
		v := c.Decide(ctx, chat(nil))
		if v.Deny == nil || v.Deny.Status != tc.status || v.Deny.Type != tc.typ {
			t.Errorf("decision %+v err %v: got %+v", tc.d, tc.err, v.Deny)
		}
	}
	// Shadow mode records but does not enforce.
	c.Shadow = true
	c.Policy = &fakePolicy{d: policy.Decision{Allow: false, Reason: "model not in your tier"}}
	if v := c.Decide(ctx, chat(nil)); v.Decision != "shadow_deny" || v.Reason != "model not in your tier" {
		t.Errorf("shadow: %+v", v)
	}
}

func TestReserveAndSettle(t *testing.T) {
	c := newController(t)
	now := time.Unix(1_700_000_000, 0)
	mem := ratelimit.NewMemory(func() time.Time { return now })
	c.Limiter = mem
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "rpm", Key: "t=acme", Unit: ratelimit.Requests, Amount: 10, Window: time.Minute},
		{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 300, Window: time.Minute},
	}}}
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}

	v := c.Decide(ctx, chat(hdr)) // reserves 20 + 100
	if v.Deny != nil || v.Reservation == "" {
		t.Fatalf("first request: %+v", v)
	}
	if v.Metadata["x-ratelimit-remaining-tokens"] != "180" || v.Metadata["x-ratelimit-remaining-requests"] != "9" ||
		v.Metadata["x-ratelimit-limit-tokens"] != "300" || v.Metadata["x-ratelimit-reset-tokens"] == "" {
		t.Errorf("headers metadata = %v", v.Metadata)
	}
	v2 := c.Decide(ctx, chat(hdr)) // reserves 120 more: 240 of 300
	if v2.Deny != nil {
		t.Fatalf("second request denied: %+v", v2.Deny)
	}
	v3 := c.Decide(ctx, chat(hdr)) // 360 > 300
	if v3.Deny == nil || v3.Deny.Status != 429 || v3.Headers["retry-after"] == "" || v3.Headers["x-ratelimit-remaining-tokens"] != "60" {
		t.Fatalf("third request: %+v %v", v3.Deny, v3.Headers)
	}
	// The first two used far less than they reserved: settle refunds.
	c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, PromptTokens: 20, CompletionTokens: 10, UsageRead: true, End: request.EndComplete})
	c.Settle(ctx, &request.Settlement{Reservation: v2.Reservation, PromptTokens: 20, CompletionTokens: 10, UsageRead: true, End: request.EndComplete})
	v4 := c.Decide(ctx, chat(hdr)) // 60 used + 120 = 180 <= 300
	if v4.Deny != nil {
		t.Fatalf("after refunds: %+v", v4.Deny)
	}
	if got := v4.Metadata["x-ratelimit-remaining-tokens"]; got != "120" {
		t.Errorf("remaining after settle+reserve = %v, want 120", got)
	}
}

func TestChecks(t *testing.T) {
	var status atomic.Int64 // read by handlers a timed-out request left running
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := int(status.Load())
		if status == 0 {
			io.Copy(io.Discard, r.Body) // lets the server see the hang-up
			<-r.Context().Done()        // down: answers nothing until the check gives up
			return
		}
		w.WriteHeader(status)
		w.Write([]byte(`{"reason":"violence"}`))
	}))
	defer srv.Close()
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Checks: []string{"moderation"}}}
	check := NewCheck(Check{Name: "moderation", URL: srv.URL, Timeout: 50 * time.Millisecond, Log: c.Log})
	c.Checks = map[string]*Check{"moderation": check}
	ctx := context.Background()
	for _, tc := range []struct {
		status, want int
		allowOnError bool
	}{{200, 0, false}, {403, 400, false}, {500, 503, false}, {0, 503, false}, {500, 0, true}, {0, 0, true}} {
		status.Store(int64(tc.status))
		check.Allow = tc.allowOnError
		v := c.Decide(ctx, chat(nil))
		got := 0
		if v.Deny != nil {
			got = v.Deny.Status
		}
		if got != tc.want {
			t.Errorf("check answering %d (allow on error %v): status %d, want %d", tc.status, tc.allowOnError, got, tc.want)
		}
		if tc.status == 403 && !strings.Contains(v.Deny.Message, "violence") {
			t.Errorf("denial message %q", v.Deny.Message)
		}
		if tc.status == 0 && v.Timings.Checks < 50*time.Millisecond {
			t.Errorf("check time %v not recorded apart", v.Timings.Checks)
		}
	}
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Checks: []string{"pii"}}}
	if v := c.Decide(ctx, chat(nil)); v.Deny == nil || v.Deny.Status != 500 {
		t.Errorf("unconfigured check must fail closed: %+v", v.Deny)
	}
}

// A stream the meter lost, or one cut before its end (the client or the
// pool reset it), keeps its reservation: what was counted is only a lower
// bound. One that ended properly ([DONE]) is charged what was counted.
func TestSettlingAnIncompleteStream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		end      request.End
		terminal bool
		want     string // remaining once a second request reserved its 120
	}{
		{"lost: the reservation stays", request.EndLost, false, "60"}, // 300 − 120 − 120
		{"cut: the reservation stays", request.EndCut, false, "60"},
		{"ended: what was counted", request.EndComplete, true, "157"}, // 300 − 23 − 120
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(t)
			now := time.Unix(1_700_000_000, 0)
			c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
			c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
				{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 300, Window: time.Minute}}}}
			ctx := context.Background()
			hdr := map[string]string{"x-api-key": secretKey}
			v := c.Decide(ctx, chat(hdr)) // 120 reserved
			c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, SSE: true, PromptTokens: 20, Events: 3,
				End: tc.end, Terminal: tc.terminal, Status: 200, Origin: request.OriginPool})
			if got := c.Decide(ctx, chat(hdr)).Metadata["x-ratelimit-remaining-tokens"]; got != tc.want {
				t.Errorf("remaining %v, want %s", got, tc.want)
			}
		})
	}
}

// Only reservations infergate sealed are settled: a forged one (anything
// that reaches the ext_proc port could send one), a re-sealed one under
// another key, or a genuine one with its tenant or counters changed moves
// no counter.
func TestForgedReservationsMoveNoCounter(t *testing.T) {
	c := newController(t)
	now := time.Unix(1_700_000_000, 0)
	c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 300, Window: time.Minute},
	}}}
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}
	v := c.Decide(ctx, chat(hdr)) // reserves 120 of 300
	if v.Deny != nil {
		t.Fatal(v.Deny)
	}
	opened, err := c.keyring().Open(seal.Reservation, v.Reservation)
	if err != nil {
		t.Fatal(err)
	}
	_, payload, _ := strings.Cut(opened.Body, ".")
	other := seal.NewKeyring(&seal.MemoryStore{}, seal.Options{Now: c.now})
	other.Refresh(ctx)
	// A refund of everything the entry holds, if any of these were believed.
	for name, forged := range map[string]string{
		"bare JSON":       payload,
		"another key":     other.Seal(seal.Reservation, opened.Body, now.Add(time.Hour)),
		"another tenant":  strings.Replace(v.Reservation, "."+b64.EncodeToString([]byte("acme"))+".", "."+b64.EncodeToString([]byte("globex"))+".", 1),
		"changed counter": strings.Replace(v.Reservation, `"r":120`, `"r":100000`, 1),
		"garbage":         "...",
	} {
		c.Settle(ctx, &request.Settlement{Reservation: forged, PromptTokens: 0, CompletionTokens: 0, UsageRead: true, End: request.EndComplete})
		if v2 := c.Decide(ctx, chat(hdr)); v2.Deny != nil || v2.Metadata["x-ratelimit-remaining-tokens"] != "60" {
			t.Fatalf("after a forged settlement (%s): remaining %v, denial %v; want 60 (120 + 120 reserved)", name, v2.Metadata["x-ratelimit-remaining-tokens"], v2.Deny)
		} else {
			c.Settle(ctx, &request.Settlement{Reservation: v2.Reservation, UsageRead: true, End: request.EndComplete}) // back to 120
		}
	}
}

// The policy sees the request's API and what is particular to it: a
// response's previous_response_id, background, conversation, prompt and
// store, its max_output_tokens as max_tokens.
func TestPolicyInputNamesTheAPI(t *testing.T) {
	c := newController(t)
	c.Keys, c.JWT.Enabled = nil, false
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, AllowUnbounded: policy.UnboundedFields}}
	a := &request.Admission{RequestID: "r", Method: "POST", Path: "/v1/responses", Completion: true, API: openai.APIResponses,
		Request: openai.Request{Model: "llama", Stream: true, MaxTokens: 300, Choices: 1, PreviousResponseID: "resp_1",
			Background: true, Conversation: "conv_1", PromptID: "pmpt_1", Store: true}, PromptTokens: 20}
	if v := c.Decide(context.Background(), a); v.Deny != nil {
		t.Fatal(v.Deny)
	}
	in := c.Policy.(*fakePolicy).last.Request
	if in.API != "responses" || in.PreviousResponseID != "resp_1" || in.MaxTokens != 300 || !in.Stream || in.EstimatedPromptTokens != 20 ||
		!in.Background || in.Conversation != "conv_1" || in.PromptID != "pmpt_1" || !in.Store {
		t.Errorf("policy input %+v", in)
	}
	c.Decide(context.Background(), &request.Admission{RequestID: "r", Method: "GET", Path: "/v1/models"})
	if in := c.Policy.(*fakePolicy).last.Request; in.API != "" {
		t.Errorf("the model listing has API %q", in.API)
	}
}

// Without a policy, an authenticated caller may list models (GET
// /v1/models: the gate answers it when it knows them) as it may call them;
// other paths and methods stay unknown, and the key is still required.
func TestNoPolicyAdmitsTheListing(t *testing.T) {
	c := newController(t)
	key := map[string]string{"authorization": "Bearer " + secretKey}
	for _, tc := range []struct {
		method, path string
		hdr          map[string]string
		status       int // 0: admitted
	}{
		{"GET", "/v1/models", key, 0},
		{"GET", "/v1/models", nil, http.StatusUnauthorized},
		{"HEAD", "/v1/models", key, http.StatusNotFound},
		{"POST", "/v1/models", key, http.StatusNotFound},
		{"GET", "/v1/files", key, http.StatusNotFound},
	} {
		v := c.Decide(context.Background(), &request.Admission{RequestID: "r", Method: tc.method, Path: tc.path, Headers: tc.hdr})
		got := 0
		if v.Deny != nil {
			got = v.Deny.Status
		}
		if got != tc.status {
			t.Errorf("%s %s: %d (0: admitted), want %d", tc.method, tc.path, got, tc.status)
		}
	}
}
