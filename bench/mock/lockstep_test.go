package mock

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Every API's stream in lock step: after the client read event n and before
// it acknowledged it, the mock has written exactly events 0..n (it waits);
// acknowledged in-process or over HTTP, the stream goes on; and its bytes
// are those of the same request streamed freely.
func TestLockstepEveryAPI(t *testing.T) {
	s, ts := newTestServer(t, noDelay())
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"m","max_tokens":5,"n":2,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi there"}]}`,
		"/v1/completions":      `{"model":"m","max_tokens":5,"stream":true,"prompt":"hi there"}`,
		"/v1/responses":        `{"model":"m","max_output_tokens":5,"stream":true,"input":"hi there"}`,
		"/v1/messages":         `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi there"}]}`,
	}
	for path, body := range bodies {
		t.Run(path, func(t *testing.T) {
			_, free := do(t, ts, http.MethodPost, path, body, nil)
			id := "ls" + strings.ReplaceAll(path, "/", "-")
			gate := s.Lockstep(id)
			t.Cleanup(func() { s.Forget(id) })
			req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("x-mock-lockstep", id)
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got bytes.Buffer
			r := bufio.NewReader(resp.Body)
			for n := 0; ; n++ {
				ev, err := readEvent(r)
				if err == io.EOF && ev == "" {
					break
				}
				if err != nil {
					t.Fatalf("event %d: %v", n, err)
				}
				got.WriteString(ev)
				if e := gate.Emitted(); len(e) != n+1 {
					t.Fatalf("after the client read event %d, unacknowledged, the mock had written %d events", n, len(e))
				}
				if n%2 == 0 {
					gate.Ack(n)
				} else {
					resp, _ := do(t, ts, http.MethodPost, fmt.Sprintf("/mock/lockstep/%s/ack?n=%d", id, n), "", nil)
					if resp.StatusCode != http.StatusNoContent {
						t.Fatalf("ack over HTTP: status %d", resp.StatusCode)
					}
				}
			}
			if got.String() != string(free) {
				t.Errorf("lock-step body differs from the free one\n got: %q\nwant: %q", got.String(), free)
			}
			if e := gate.Emitted(); len(e) < 4 {
				t.Errorf("%d events emitted", len(e))
			}
		})
	}
}

// readEvent reads one SSE event, through its blank line.
func readEvent(r *bufio.Reader) (string, error) {
	var ev strings.Builder
	for {
		line, err := r.ReadString('\n')
		ev.WriteString(line)
		if err != nil {
			return ev.String(), err
		}
		if line == "\n" {
			return ev.String(), nil
		}
	}
}

func TestLockstepRefusesBadIDs(t *testing.T) {
	_, ts := newTestServer(t, noDelay())
	resp, body := do(t, ts, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`,
		map[string]string{"x-mock-lockstep": "a/b"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("id a/b: status %d: %s", resp.StatusCode, body)
	}
	for _, path := range []string{"/mock/lockstep/x/ack", "/mock/lockstep/x/ack?n=-1", "/mock/lockstep/x/ack?n=z"} {
		if resp, body := do(t, ts, http.MethodPost, path, "", nil); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d: %s", path, resp.StatusCode, body)
		}
	}
}
