package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

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
	s := startModuleStackFor(t, parityConfig(t))
	return &moduleStack{stack: s, Pool: s.PoolA}
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
}
