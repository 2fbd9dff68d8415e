package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// post sends a request and decodes an OpenAI-style error body.
func post(t *testing.T, url, contentType, body string, hdr map[string]string) (*http.Response, openAIError) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("content-type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e openAIError
	if resp.StatusCode >= 400 {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("status %d: body is not an OpenAI-style JSON error: %v", resp.StatusCode, err)
		}
	}
	return resp, e
}

// Every malformed request gets its OpenAI-style error from the gateway and
// never reaches an upstream.
func TestBadRequestsNeverReachUpstream(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	big := `{"model":"pool-a","messages":[{"role":"user","content":"` + strings.Repeat("x", 70_000) + `"}]}`
	huge := `{"model":"pool-a","messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<20) + `"}]}`
	cases := []struct {
		name, path, contentType, body string
		status                        int
		code, typ                     string
	}{
		{"malformed JSON", "/v1/chat/completions", "application/json", `{"model":"pool-a",`, 400, "invalid_json", "invalid_request_error"},
		{"not an object", "/v1/chat/completions", "application/json", `["pool-a"]`, 400, "invalid_json", "invalid_request_error"},
		{"missing model", "/v1/chat/completions", "application/json", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "missing_model", "invalid_request_error"},
		{"empty model", "/v1/chat/completions", "application/json", `{"model":"  ","messages":[]}`, 400, "missing_model", "invalid_request_error"},
		{"bad max_tokens", "/v1/chat/completions", "application/json", `{"model":"pool-a","max_tokens":"ten"}`, 400, "invalid_value", "invalid_request_error"},
		{"empty body", "/v1/chat/completions", "application/json", ``, 400, "invalid_json", "invalid_request_error"},
		{"wrong content type", "/v1/chat/completions", "text/plain", `{"model":"pool-a"}`, 415, "unsupported_media_type", "invalid_request_error"},
		{"no content type", "/v1/chat/completions", "", `{"model":"pool-a"}`, 415, "unsupported_media_type", "invalid_request_error"},
		{"over the gate's limit", "/v1/chat/completions", "application/json", big, 413, "request_too_large", "invalid_request_error"},
		{"over Envoy's buffer too", "/v1/chat/completions", "application/json", huge, 413, "request_too_large", "invalid_request_error"},
		{"embeddings without input", "/v1/embeddings", "application/json", `{"model":"pool-a"}`, 400, "invalid_value", "invalid_request_error"},
		{"unknown path", "/v1/audio/speech", "application/json", `{"model":"pool-a","input":"x"}`, 404, "unknown_url", "invalid_request_error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, e := post(t, s.Envoy.URL+c.path, c.contentType, c.body, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d (error %+v)", resp.StatusCode, c.status, e.Error)
			}
			if e.Error.Type != c.typ || (c.code != "" && e.Error.Code != c.code) || e.Error.Message == "" {
				t.Errorf("error = %+v, want type %q code %q", e.Error, c.typ, c.code)
			}
			if ct := resp.Header.Get("content-type"); ct != "application/json" {
				t.Errorf("content-type %q", ct)
			}
		})
	}
	// A GET carries no body; it must still get a decision.
	resp, err := http.Get(s.Envoy.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", resp.StatusCode)
	}
	if n := s.served(); n != 0 {
		t.Fatalf("upstreams served %d requests; bad requests must never reach them", n)
	}
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	if !strings.Contains(metrics, `infergate_gate_decisions_total{code="invalid_json",decision="deny"} 3`) {
		t.Errorf("deny metric missing or wrong:\n%s", grep(metrics, "infergate_gate_decisions"))
	}
}

// A client cannot pick a pool by sending the routing header itself.
func TestSpoofedRoutingHeaderHasNoEffect(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	hdr := map[string]string{"x-infergate-model": "pool-b", "x-infergate-tenant": "admin"}
	r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 3, true, ""), hdr)
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if a, b := s.PoolA.Served(), s.PoolB.Served(); a != 1 || b != 0 {
		t.Fatalf("pool-a served %d, pool-b %d; the body's model (pool-a) must decide", a, b)
	}
	fwd, _ := s.PoolA.LastRequest()
	if got := fwd.Get("x-infergate-model"); got != "pool-a" {
		t.Errorf("upstream saw x-infergate-model %q", got)
	}
	if got := fwd.Get("x-infergate-tenant"); got != "" {
		t.Errorf("client's x-infergate-tenant reached the upstream: %q", got)
	}
}

// A meter that dies mid-stream never breaks the response.
func TestMeterFailureNeverBreaksStream(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	body := chatBody("pool-a", 20, true, "")
	hdr := map[string]string{"x-mock-ttft-ms": "100", "x-mock-itl-ms": "25"}
	// Kill infergate (every connection cut, as a crash would) once the
	// fifth event has arrived: in lock step, before the mock writes the
	// sixth.
	got, err := streamLockstepThen(http.DefaultClient, []lockstepPool{s.PoolA}, s.Envoy.URL+"/v1/chat/completions", body, hdr,
		func(k int) {
			if k == 4 {
				s.Gateway.Stop(t)
			}
		})
	if err != nil {
		t.Fatalf("after the meter died: %v", err)
	}
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
		chatBody("pool-a", 20, true, `,"stream_options":{"include_usage":true}`), hdr))
	if got.Status != 200 || string(got.Body) != string(want.Body) {
		t.Fatalf("stream broken by the meter's failure: status %d\n got: %q\nwant: %q", got.Status, got.Body, want.Body)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
