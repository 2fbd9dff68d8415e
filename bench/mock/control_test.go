package mock

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRuntimeControl(t *testing.T) {
	m := New(Config{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond}, nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	post := func(body string) int {
		resp, err := http.Post(srv.URL+"/mock/control", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"ttft_ms": 0, "itl_ms": 12.5}`); code != 200 {
		t.Fatalf("status %d", code)
	}
	if c := m.Config(); c.TTFT != 0 || c.ITL != 12500*time.Microsecond {
		t.Errorf("after control: %+v", c)
	}
	post(`{"error_rate": 0.25, "error_status": 429}`)
	post(`{"itl_ms": 1}`) // another change keeps the zero TTFT and the faults
	if c := m.Config(); c.TTFT != 0 {
		t.Errorf("TTFT %v: a later change must not restore the default", c.TTFT)
	}
	failed := 0
	for range 20 {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 429 {
			failed++
		}
	}
	if failed != 5 {
		t.Errorf("%d of 20 failed with error_rate 0.25, want exactly 5", failed)
	}
	for _, bad := range []string{`{"ttft":1}`, `{"error_status": 200}`, `not json`} {
		if code := post(bad); code != 400 {
			t.Errorf("%s: status %d", bad, code)
		}
	}
}
