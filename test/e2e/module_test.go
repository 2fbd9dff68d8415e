package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/testutil"
)

// The gate and the meter as a dynamic module inside Envoy
// (cmd/infergate-module, envoy/snippet-module.yaml): the module is built
// once per test binary (moduleDir, with the test-only panic hook), loaded
// by the pinned Envoy from a temp search path, configured by the same file
// serve reads; its request log is Envoy's standard output. What it shares
// with ext_proc is proven on both by TestParity; here is what only the
// module has.

// moduleStack is Envoy with the module in front of one mock pool: the
// parity table's stack on the module (startModuleStackFor).
type moduleStack struct {
	*stack
	Pool *pool // PoolA (and PoolB): the snippet's one upstream
}

func startModuleStack(t *testing.T) *moduleStack {
	t.Helper()
	base := parityConfig(t)
	// The model listing and the spend page need models and a price.
	s := startModuleStackFor(t, func(s *stack) string {
		return base(s) + "models: [pool-a, pool-b]\nprices: {currency: USD, models: {pool-a: {input: 0.15, output: 0.60}}}\n"
	})
	return &moduleStack{stack: s, Pool: s.PoolA}
}

// stampLine is the module's request-log line of a request, as written.
func (s *moduleStack) stampLine(t *testing.T, requestID string) []byte {
	t.Helper()
	return s.Stamps.line(t, requestID)
}

func (s *stack) post(t *testing.T, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.Envoy.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp, b.Bytes()
}

// errorCode is the code of an OpenAI-style error body ("" if it is none).
func errorCode(b []byte) string {
	var e struct {
		Error struct{ Type, Code string }
	}
	if json.Unmarshal(b, &e) != nil || e.Error.Type == "" {
		return ""
	}
	return e.Error.Code
}

func TestModule(t *testing.T) {
	s := startModuleStack(t)
	acme := map[string]string{"authorization": "Bearer sk-acme-0001"}

	// A panic on the response path passes the response whole; the meter
	// stops, and Envoy serves on. (On the request path it fails the request
	// closed: TestParity's fail-closed case.)
	t.Run("panic on the response", func(t *testing.T) {
		hdr := map[string]string{"authorization": "Bearer sk-acme-0001", "x-test-panic-at": "response_body"}
		if resp, body := s.post(t, chatBody("pool-a", 4, false, ""), hdr); resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"usage"`)) {
			t.Errorf("panic on the response: %d %s; want the pool's answer", resp.StatusCode, body)
		}
		resp, body := s.post(t, chatBody("pool-a", 4, false, ""), acme)
		if resp.StatusCode != 200 {
			t.Fatalf("after the panic: %d %s", resp.StatusCode, body)
		}
		if ready := testutil.HTTPReady(s.Envoy.AdminURL + "/ready"); ready() != nil {
			t.Errorf("Envoy not ready after the panic: %v", ready())
		}
	})

	// The module's stamps reach serve's sinks, on the admin port its
	// process serves: the request's metric series, its line on
	// /debug/requests, its charge on /debug/spend.
	t.Run("admin", func(t *testing.T) {
		resp, body := s.post(t, chatBody("pool-a", 6, false, ""), acme)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if resp, body := s.post(t, chatBody("pool-a", 6, false, ""), nil); resp.StatusCode != 401 {
			t.Fatalf("no key: %d %s", resp.StatusCode, body)
		}
		id := resp.Header.Get("x-request-id")
		var st spendLine // settled, then recorded by every sink
		if err := json.Unmarshal(s.stampLine(t, id), &st); err != nil || st.Cost == "" || st.TokenSource != "usage" {
			t.Fatalf("stamp %+v (%v): want the pool's usage, priced", st, err)
		}
		metrics := get(t, s.AdminURL+"/metrics")
		for _, series := range [][]string{
			{"gen_ai_client_token_usage", `gen_ai_request_model="pool-a"`, `gen_ai_token_type="output"`, `gen_ai_operation_name="chat"`},
			{"gen_ai_server_request_duration_seconds", `gen_ai_request_model="pool-a"`, `infergate_pool="pool-a"`},
			{"infergate_gate_decisions_total", `code="allowed"`, `decision="allow"`},
			{"infergate_gate_decisions_total", `code="invalid_api_key"`, `decision="deny"`}, // "no key"
			{"infergate_cost_total", `gen_ai_request_model="pool-a"`, `infergate_tenant="acme"`},
		} {
			if !hasSeries(metrics, series[0], series[1:]...) {
				t.Errorf("/metrics has no series %s with %v", series[0], series[1:])
			}
		}
		if recent := get(t, s.AdminURL+"/debug/requests?format=json"); !strings.Contains(recent, id) {
			t.Errorf("/debug/requests does not list %s", id)
		}
		rep := spendReport(t, s.AdminURL+"/debug/spend?format=json&since=2h&by=tenant,model")
		var acmeA spend.Amount
		for _, r := range rep.Rows {
			if r.Tenant == "acme" && r.Model == "pool-a" {
				acmeA = r.Window
			}
		}
		// Every acme request on pool-a was settled on the pool's usage and
		// priced: the stamp's is one of them.
		if acmeA.Requests == 0 || acmeA.OutputTokens < int64(st.CompletionTokens) || acmeA.Cost < pico(t, st.Cost.String()) {
			t.Errorf("/debug/spend acme/pool-a = %+v; want at least the stamp's %d output tokens, cost %s", acmeA, st.CompletionTokens, st.Cost)
		}
		if h := get(t, s.AdminURL+"/healthz"); !strings.HasPrefix(h, "ok") {
			t.Errorf("/healthz: %q", h)
		}
	})

	// GET /v1/models is the gate's own answer from the catalog (models:),
	// decided as any request: no pool sees it, a caller without a key is
	// refused.
	t.Run("models", func(t *testing.T) {
		before := s.Pool.Served()
		list := func(hdr map[string]string) (*http.Response, []byte) {
			req, err := http.NewRequest(http.MethodGet, s.Envoy.URL+"/v1/models", nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			return resp, b.Bytes()
		}
		resp, body := list(acme)
		var got struct {
			Object string
			Data   []struct{ ID, Object string }
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &got) != nil || got.Object != "list" {
			t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, body)
		}
		var ids []string
		for _, m := range got.Data {
			ids = append(ids, m.ID)
		}
		if !slices.Contains(ids, "pool-a") {
			t.Errorf("acme's listing %v lacks pool-a", ids)
		}
		if st := s.stamp(t, resp.Header.Get("x-request-id")); st.Status != 200 || st.Decision != "allow" || st.Tenant != "acme" {
			t.Errorf("stamp of the listing = %+v", st)
		}
		if resp, body := list(nil); resp.StatusCode != 401 || errorCode(body) == "" {
			t.Errorf("GET /v1/models without a key: %d %s", resp.StatusCode, body)
		}
		if s.Pool.Served() != before {
			t.Error("a listing reached the pool")
		}
	})
}

// hasSeries reports whether Prometheus text metrics hold a sample of the
// metric named name (or its _bucket, _count, _sum) with every label of labels.
func hasSeries(metrics, name string, labels ...string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !strings.Contains(rest, "{") {
			continue
		}
		if suffix, _, _ := strings.Cut(rest, "{"); suffix != "" && suffix != "_bucket" && suffix != "_count" && suffix != "_sum" && suffix != "_total" {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if all {
			return true
		}
	}
	return false
}
