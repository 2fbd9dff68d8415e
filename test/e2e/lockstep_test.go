package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
)

// Streams proven by causality: the mock's lock-step mode (x-mock-lockstep)
// writes event n+1 only once the client has acknowledged event n, which it
// does here as soon as event n has arrived through the gateway. A gateway
// that holds events back deadlocks the stream, so "incremental" needs no
// read count and no gap tolerance: a stream that completes was delivered
// event by event.

// lockstepTimeout is how long the client waits for one event before calling
// the response buffered. Generous: an event crosses Envoy in well under a
// millisecond; only one held back for the rest of the response waits this
// long (it never arrives: the mock waits for its acknowledgement).
const lockstepTimeout = 10 * time.Second

// lockstepResult is a lock-step stream as the client saw it. Its Events are
// indexed as the mock numbers them (each read brought exactly one).
type lockstepResult struct {
	streamResult
	Sent     time.Time   // the request left the client
	Received []time.Time // when event k arrived at the client
	Emitted  []time.Time // when the mock began writing event k
}

var lockstepN atomic.Int64

// lockstepPool is a mock that serves lock-step streams (a pool, or one
// that embeds it).
type lockstepPool interface {
	Lockstep(id string) *mock.Lockstep
	Forget(id string)
}

// streamLockstep POSTs body to url in lock step with p, the pool that will
// serve it, and acknowledges each event to p once it has arrived. It returns
// an error, "event n never arrived", when an event does not come within
// lockstepTimeout: the response is held back on the way.
func streamLockstep(p lockstepPool, url, body string, hdr map[string]string) (lockstepResult, error) {
	return streamLockstepWith(http.DefaultClient, []lockstepPool{p}, url, body, hdr)
}

// streamLockstepWith is streamLockstep through client, for a request any of
// pools may serve (a retry moves it to the next): each gets the client's
// acknowledgements, and Emitted is the one that wrote the most events.
func streamLockstepWith(client *http.Client, pools []lockstepPool, url, body string, hdr map[string]string) (lockstepResult, error) {
	return streamLockstepThen(client, pools, url, body, hdr, nil)
}

// streamLockstepThen is streamLockstepWith calling arrived(k) once event k
// has arrived, before acknowledging it: what arrived does happens before
// the mock writes event k+1.
func streamLockstepThen(client *http.Client, pools []lockstepPool, url, body string, hdr map[string]string, arrived func(k int)) (lockstepResult, error) {
	id := fmt.Sprintf("e2e-%d", lockstepN.Add(1))
	var gates []*mock.Lockstep
	for _, p := range pools {
		gates = append(gates, p.Lockstep(id))
		defer p.Forget(id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stalled atomic.Bool
	watchdog := time.AfterFunc(lockstepTimeout, func() { stalled.Store(true); cancel() })
	defer watchdog.Stop()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return lockstepResult{}, err
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	req.Header.Set("x-mock-lockstep", id)
	if asksNoUsage(body) {
		// The gateway removes the usage it asked the pool for on this
		// client's behalf: the client never sees it to acknowledge it.
		req.Header.Set("x-mock-lockstep-unseen", "usage")
	}
	r := lockstepResult{Sent: time.Now()}
	never := func(err error) error {
		if stalled.Load() {
			return fmt.Errorf("event %d never arrived (%v without it): the response is buffered", len(r.Events), lockstepTimeout)
		}
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return r, never(err)
	}
	defer resp.Body.Close()
	r.Status, r.Header, r.RequestID = resp.StatusCode, resp.Header, resp.Header.Get("x-request-id")
	buf := make([]byte, 64<<10)
	var pending []byte
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			at := time.Now()
			r.Body = append(r.Body, buf[:n]...)
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.Index(pending, []byte("\n\n"))
				if i < 0 {
					break
				}
				r.Events = append(r.Events, event{At: at.Sub(r.Sent), Data: strings.TrimPrefix(string(pending[:i]), "data: ")})
				r.Received = append(r.Received, at)
				pending = pending[i+2:]
				watchdog.Reset(lockstepTimeout)
				if arrived != nil {
					arrived(len(r.Events) - 1)
				}
				for _, g := range gates {
					g.Ack(len(r.Events) - 1)
				}
			}
		}
		if err != nil {
			for _, g := range gates {
				if e := g.Emitted(); len(e) > len(r.Emitted) {
					r.Emitted = e
				}
			}
			if errors.Is(err, io.EOF) {
				return r, nil
			}
			return r, never(err)
		}
	}
}

// asksNoUsage is whether body is a chat or completions stream that did not
// ask for usage (stream_options.include_usage).
func asksNoUsage(body string) bool {
	var b struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	return json.Unmarshal([]byte(body), &b) == nil && b.Stream && !b.StreamOptions.IncludeUsage
}

// mustLockstep is streamLockstep failing t on an error.
func mustLockstep(t *testing.T, p lockstepPool, url, body string, hdr map[string]string) lockstepResult {
	t.Helper()
	return mustLockstepWith(t, http.DefaultClient, p, url, body, hdr)
}

// mustLockstepWith is mustLockstep through client.
func mustLockstepWith(t *testing.T, client *http.Client, p lockstepPool, url, body string, hdr map[string]string) lockstepResult {
	t.Helper()
	r, err := streamLockstepWith(client, []lockstepPool{p}, url, body, hdr)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return r
}

// seqsOf are the indexes of r's events that keep selects.
func seqsOf(evs []event, keep func(event) bool) []int {
	var out []int
	for i, e := range evs {
		if keep(e) {
			out = append(out, i)
		}
	}
	return out
}

// isChatContent: a chat or text completion event carrying output text.
func isChatContent(e event) bool { return len(contentEvents([]event{e})) == 1 }

// stampRecord is a request's stamp as the admin API's detail shows it.
type stampRecord struct {
	Start        time.Time `json:"start"`
	GatewayMs    float64   `json:"gateway_ms"`
	ModerationMs float64   `json:"moderation_ms"`
	TTFTMs       float64   `json:"ttft_ms"`
	GapsMs       []float64 `json:"gaps_ms"`
}

// recordAt reads a request's stamp from the /debug/requests of the admin
// server at adminURL (infergate serve's, or the module's).
func recordAt(t *testing.T, adminURL, requestID string) stampRecord {
	t.Helper()
	var rec stampRecord
	testutil.Eventually(t, 5*time.Second, func() bool {
		resp, err := http.Get(adminURL + "/debug/requests/" + requestID + "?format=json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && jsonDecode(resp, &rec) == nil
	}, "the request's detail on /debug/requests")
	return rec
}

// msDur is a published duration: whole microseconds, in milliseconds.
func msDur(ms float64) time.Duration { return time.Duration(math.Round(ms*1e3)) * time.Microsecond }

// checkBrackets holds the stamp's timing of each content event (the events
// of r at seqs) between the mock's emit time and the client's receipt,
// with no tolerance. The stamp places content event k at
//
//	F_k = Sent + TTFT + gaps[0] + … + gaps[k-1],  Sent = start + gateway + moderation
//
// (the waterfall of /debug/requests). Two inequalities, each asserted only
// where it is sound:
//
//   - E_k ≤ F_k, E_k the mock's time just before it wrote event k: sound
//     whoever's clock F_k is, Envoy's or infergate's, since nothing can see
//     bytes before they are written. Compared on the wall clock (the
//     stamp's start is one: Envoy's request.time), which the mock, Envoy and
//     infergate share on one machine; unsound only across a step of the
//     wall clock. Always asserted.
//   - F_k − Sent ≤ C_k − S, C_k the client's receipt of event k and S its
//     sending of the request, each side on one monotonic clock: sound when
//     F_k is taken in Envoy as the bytes pass, before it forwards them to
//     the client, and Sent no earlier than the client sent (causal): the
//     in-Envoy (Wasm) meter's times. Asserted when timedInEnvoy. The
//     ext_proc meter times the moments it reads the copies Envoy sends it
//     in observability mode, which may be after the client got the event
//     (a busy machine showed 2.4 ms after): no upper bound is sound for it.
//
// The stamp's durations are published floored to the microsecond, so F_k
// is known within [F'_k, F'_k + (k+3) µs): each check refutes only what
// that interval excludes.
func checkBrackets(t *testing.T, adminURL string, r lockstepResult, seqs []int, timedInEnvoy bool) {
	t.Helper()
	rec := recordAt(t, adminURL, r.RequestID)
	if len(rec.GapsMs) != len(seqs)-1 {
		t.Fatalf("the stamp has %d gaps for %d content events", len(rec.GapsMs), len(seqs))
	}
	sent := rec.Start.Add(msDur(rec.GatewayMs) + msDur(rec.ModerationMs))
	since := msDur(rec.TTFTMs) // F_k − Sent
	for k, seq := range seqs {
		if k > 0 {
			since += msDur(rec.GapsMs[k-1])
		}
		if seq >= len(r.Emitted) {
			t.Fatalf("content event %d (event %d): the mock recorded %d emits", k, seq, len(r.Emitted))
		}
		floor := time.Duration(k+3) * time.Microsecond
		if f := sent.Add(since); !r.Emitted[seq].Before(f.Add(floor)) {
			t.Errorf("content event %d: the stamp places it at %s, before the mock wrote it at %s",
				k, f.Format(time.RFC3339Nano), r.Emitted[seq].Format(time.RFC3339Nano))
		}
		if client := r.Received[seq].Sub(r.Sent); timedInEnvoy && since > client {
			t.Errorf("content event %d: the stamp places it %v after the request left the gateway, the client got it %v after sending",
				k, since, client)
		}
	}
}

// The lock-step check is honest: through the shipped config a lock-step
// stream completes, byte-identical to the mock's own; through a gateway
// that buffers the response it fails, as a deadlock ("event n never
// arrived"), whatever the machine's speed. Two buffering configs: the
// meter in BUFFERED body mode (blocking, as it must be to buffer), and a
// Lua filter that reads the whole response body before passing it on.
func TestLockstepFailsThroughABufferingGateway(t *testing.T) {
	replace := func(old, new string) func(*testing.T, string) string {
		return func(t *testing.T, rendered string) string {
			t.Helper()
			if strings.Count(rendered, old) != 1 {
				t.Fatalf("envoy/demo.yaml: %q not found once", old)
			}
			return strings.Replace(rendered, old, new, 1)
		}
	}
	const router = "          - name: envoy.filters.http.router\n"
	for _, c := range []struct {
		name      string
		edits     []func(*testing.T, string) string
		buffering bool
	}{
		{name: "shipped"},
		{name: "meter BUFFERED", buffering: true, edits: []func(*testing.T, string) string{
			replace("observability_mode: true", "observability_mode: false"),
			replace("response_body_mode: STREAMED", "response_body_mode: BUFFERED"),
		}},
		{name: "Lua reading the whole body", buffering: true, edits: []func(*testing.T, string) string{
			replace(router, `          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: "function envoy_on_response(h) h:body() end"
`+router),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startStackFor(t, "", func(*stack) string { return testConfig }, 1)
			s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr,
				s.PoolA.Addr, s.PoolB.Addr, c.edits...)
			body := chatBody("pool-a", 8, true, "")
			got, err := streamLockstep(s.PoolA, s.Envoy.URL+"/v1/chat/completions", body, nil)
			if c.buffering {
				if err == nil || !strings.Contains(err.Error(), "never arrived") {
					t.Fatalf("through a buffering gateway the lock-step stream ended with %v (status %d, %d events): the check cannot see buffering",
						err, got.Status, len(got.Events))
				}
				t.Logf("as it must: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
				chatBody("pool-a", 8, true, `,"stream_options":{"include_usage":true}`), nil))
			if got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
				t.Fatalf("status %d; body through the gateway differs from the direct body\n got: %q\nwant: %q", got.Status, got.Body, want.Body)
			}
		})
	}
}
