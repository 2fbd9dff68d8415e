package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Through real Envoy, a caller without a key is answered 401 from its
// headers: a huge body that is not even JSON gets no 400, no pool sees it,
// and the answer comes while the body is still being sent (the gate waited
// for none of it). With a key, the same gateway answers as ever.
func TestUnauthenticatedAnsweredBeforeTheBody(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, "gate: {maxBodyBytes: 1048576}\nauth: {keys: "+writeKeys(t)+"}\nlog: {level: debug}\n", 1)
	url := s.Envoy.URL + "/v1/completions"
	// 960 KB of token IDs, cut before its end: invalid JSON.
	huge := `{"model":"pool-a","prompt":[` + strings.Repeat("12345,", 960<<10/6)

	resp, e := post(t, url, "application/json", huge, nil)
	if resp.StatusCode != http.StatusUnauthorized || e.Error.Code != "invalid_api_key" {
		t.Errorf("no key, 960 KB of invalid JSON: %d %+v, want 401 invalid_api_key", resp.StatusCode, e.Error)
	}

	// The body's first 64 KiB, then nothing until the answer is in.
	answered := make(chan struct{})
	pr, pw := io.Pipe()
	go func() {
		if _, err := pw.Write([]byte(huge[:64<<10])); err != nil {
			return
		}
		<-answered
		pw.CloseWithError(io.ErrUnexpectedEOF) // never finished
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang is a failure, not a wait
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	close(answered)
	if err != nil {
		t.Fatalf("no key, body held back: %v (the gate waited for the body)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key, body held back: %d, want 401", resp.StatusCode)
	}

	if n := s.served(); n != 0 {
		t.Errorf("pools served %d requests from callers without a key", n)
	}
	if got := metricSum(t, s.Gateway.AdminURL, "infergate_gate_decisions_total", `code="invalid_api_key"`); got != 2 {
		t.Errorf("infergate_gate_decisions_total{code=invalid_api_key} = %v, want 2", got)
	}

	// With a key: the body is read, and answered as ever.
	key := map[string]string{"authorization": "Bearer sk-acme-0001"}
	if resp, e := post(t, url, "application/json", huge, key); resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_json" {
		t.Errorf("with a key, invalid JSON: %d %+v, want 400 invalid_json", resp.StatusCode, e.Error)
	}
	body := `{"model":"pool-a","max_tokens":3,"prompt":[` + strings.Repeat("12345,", 50_000) + `1]}`
	resp, e = post(t, url, "application/json", body, key)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with a key, 300 KB of token IDs: %d %+v, want 200", resp.StatusCode, e.Error)
	}
	if n := s.served(); n != 1 {
		t.Errorf("pools served %d requests, want the one admitted", n)
	}
}
