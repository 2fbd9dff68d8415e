package e2e

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// slowRequest sends a chat request's headers and the first bytes of its
// body (of length declared in content-length) to Envoy at addr, then
// holds the rest back; the caller reads its answer with answer.
type slowRequest struct {
	conn net.Conn
	r    *bufio.Reader
}

func startSlowRequest(t *testing.T, addr, key string) *slowRequest {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body := `{"model":"llama-3.1-8b-instruct","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	head := "POST /v1/chat/completions HTTP/1.1\r\nhost: llm\r\ncontent-type: application/json\r\n" +
		"authorization: Bearer " + key + "\r\ncontent-length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body[:10]
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	return &slowRequest{conn: conn, r: bufio.NewReader(conn)}
}

// answer reads the response Envoy gave the held request: its status and
// error code.
func (s *slowRequest) answer(t *testing.T) (int, string) {
	t.Helper()
	s.conn.SetReadDeadline(time.Now().Add(2 * time.Minute)) // a hung test, not a measurement
	resp, err := http.ReadResponse(s.r, nil)
	if err != nil {
		t.Fatalf("reading the held request's answer: %v", err)
	}
	defer resp.Body.Close()
	var e openAIError
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code
}

// A key whose clients hold request bodies back holds only its own share of
// the gate, through the real Envoy in both of the gate's body modes (the
// recommended streamed one, and Buffered, where Envoy holds the body as
// Envoy Gateway's config does): past extproc.maxWaitingBodiesPerPrincipal
// its next request is refused 429 at its headers, another tenant is served
// meanwhile, and the held request ends with the gate's 408
// request_body_timeout, after which the key is served again. What ends
// the held request is asserted (the gate's own answer), not when: the
// deadline itself is tested in virtual time (extproc's
// TestGateSlowBodiesHoldOnlyTheirCaller).
func TestSlowBodyHoldsOnlyItsCaller(t *testing.T) {
	for _, mode := range []string{"streamed", "buffered"} {
		t.Run(mode, func(t *testing.T) {
			config := policyConfig(writeKeys(t), copyPolicies(t), "extproc: {maxWaitingBodiesPerPrincipal: 1}\ngate: {bodyTimeout: 3s}\n")
			s := startStackFor(t, "", func(*stack) string { return config }, 1)
			// Streamed, Envoy waits for the gate's answer to the headers
			// under its message_timeout (1 s in the demo), which would
			// answer 504 first: raised here so that the gate's own
			// deadline is the one met.
			edits := []func(*testing.T, string) string{replaceOnce("message_timeout: 1s", "message_timeout: 20s")}
			if mode == "buffered" {
				edits = []func(*testing.T, string) string{bufferedGate}
			}
			s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr, edits...)
			addr := strings.TrimPrefix(s.Envoy.URL, "http://")

			held := startSlowRequest(t, addr, "sk-initech-0001")
			waitHeld(t, s.Gateway)
			if resp, e := chatCall("sk-initech-0001", "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL); resp.StatusCode != 429 || e.Error.Code != "too_many_waiting_bodies" {
				t.Errorf("the key's second request while the first holds its body: %d %s, want 429 too_many_waiting_bodies", resp.StatusCode, e.Error.Code)
			}
			if resp, e := chatCall("sk-globex-0001", "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL); resp.StatusCode != 200 {
				t.Errorf("another tenant while the key holds its share: %d %s, want 200", resp.StatusCode, e.Error.Code)
			}
			if status, code := held.answer(t); status != 408 || code != "request_body_timeout" {
				t.Errorf("the held request ended with %d %q, want the gate's 408 request_body_timeout", status, code)
			}
			if resp, e := chatCall("sk-initech-0001", "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL); resp.StatusCode != 200 {
				t.Errorf("the key once its held request ended: %d %s, want 200", resp.StatusCode, e.Error.Code)
			}
		})
	}
}

// Envoy's own deadline (the shipped configs' request_timeout, Envoy
// Gateway's requestReceivedTimeout) ends a held body too, with Envoy's
// 408, and the gate's stream with it: the key's share is free again. The
// gate's own deadline is set far out so that only Envoy's can end it; the
// body Buffered, as under Envoy Gateway.
func TestEnvoyRequestTimeoutFreesTheGate(t *testing.T) {
	config := policyConfig(writeKeys(t), copyPolicies(t), "extproc: {maxWaitingBodiesPerPrincipal: 1}\ngate: {bodyTimeout: 10m}\n")
	s := startStackFor(t, "", func(*stack) string { return config }, 1)
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr,
		replaceOnce("request_timeout: 60s", "request_timeout: 3s"), bufferedGate)
	addr := strings.TrimPrefix(s.Envoy.URL, "http://")
	held := startSlowRequest(t, addr, "sk-initech-0001")
	waitHeld(t, s.Gateway)
	if resp, e := chatCall("sk-initech-0001", "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL); resp.StatusCode != 429 || e.Error.Code != "too_many_waiting_bodies" {
		t.Errorf("the key's second request while the first holds its body: %d %s, want 429 too_many_waiting_bodies", resp.StatusCode, e.Error.Code)
	}
	if status, code := held.answer(t); status != 408 || code != "request_overall_timeout" {
		t.Errorf("the held request ended with %d %q, want Envoy's own 408", status, code)
	}
	// Envoy closes the gate's stream as it answers; the key's share is
	// freed when infergate sees the close.
	testutil.Eventually(t, 30*time.Second, func() bool {
		resp, _ := chatCall("sk-initech-0001", "llama-3.1-8b-instruct", 4).do(t, s.Envoy.URL)
		return resp.StatusCode == 200
	}, "the key to be served once Envoy ended its held request")
}

// waitHeld waits until the gate counts one stream waiting for its body:
// the held request has reached it.
func waitHeld(t *testing.T, g *gateway) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		return metricSum(t, g.AdminURL, "infergate_gate_waiting_bodies", "") == 1
	}, "the held request to wait at the gate")
}

// bufferedGate switches the gate filter to a Buffered body, as Envoy
// Gateway's config has it: Envoy holds the body until it is whole.
func bufferedGate(t *testing.T, rendered string) string {
	t.Helper()
	return replaceOnce("request_body_mode: STREAMED", "request_body_mode: BUFFERED")(t,
		replaceOnce("send_body_without_waiting_for_header_response: true", "send_body_without_waiting_for_header_response: false")(t, rendered))
}

// replaceOnce is an edit of a rendered config: old, found exactly once, becomes new.
func replaceOnce(old, new string) func(*testing.T, string) string {
	return func(t *testing.T, rendered string) string {
		t.Helper()
		if n := strings.Count(rendered, old); n != 1 {
			t.Fatalf("%q found %d times in the config, want once", old, n)
		}
		return strings.Replace(rendered, old, new, 1)
	}
}
