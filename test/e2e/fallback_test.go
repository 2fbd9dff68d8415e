package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/testutil"
)

const fallbackConfig = `
admin: {debug: {enabled: true}}
virtualModels:
- name: llama
  pools:
  - {cluster: pool-a, priority: 0}
  - {cluster: pool-b, priority: 1}
  sla: {ttftP95: 2s}
  tuning: {window: 10s, minSamples: 8, interval: 250ms}
  retry: {attempts: 1}
`

// A pool failing 20% of requests with 503 costs the client nothing: each
// failure is retried on the next pool (an aggregate cluster served over
// CDS, previous_priorities retry), the streams arrive intact (in lock step), the stamps
// show both attempts, and the controller counts the failures against the
// pool that failed rather than the one that answered.
func TestSLAFallbackAcrossPools(t *testing.T) {
	s := startStackOn(t, "envoy/sla.yaml", fallbackConfig, 1)
	s.PoolA.SetFaults(mock.Faults{ErrorRate: 0.2, ErrorStatus: http.StatusServiceUnavailable})

	const requests, workers, tokens = 500, 8, 4
	hdr := map[string]string{"x-mock-ttft-ms": "5", "x-mock-itl-ms": "10"}
	body := chatBody("llama", tokens, true, "")
	want := unasked(t, stream(t, "http://"+s.PoolB.Addr+"/v1/chat/completions",
		chatBody("llama", tokens, true, `,"stream_options":{"include_usage":true}`), hdr))

	var mu sync.Mutex
	var ok, failed int
	var ids []string
	var wg sync.WaitGroup
	next := make(chan struct{}, requests)
	for range requests {
		next <- struct{}{}
	}
	close(next)
	for range workers {
		wg.Go(func() {
			for range next {
				r, err := streamLockstepWith(http.DefaultClient, []lockstepPool{s.PoolA, s.PoolB}, s.Envoy.URL+"/v1/chat/completions", body, hdr)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				switch {
				case r.Status != 200 || !bytes.Equal(r.Body, want.Body):
					failed++
					if failed <= 3 {
						t.Errorf("status %d, body %q; want 200 and the mock's bytes", r.Status, r.Body)
					}
				default:
					ok++
					ids = append(ids, r.RequestID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if rate := float64(ok) / requests; rate < 0.999 {
		t.Fatalf("client success %.2f%% (%d failed), want >= 99.9%%", 100*rate, failed)
	}

	// The stamps: every request that hit a 503 on pool-a was served by
	// pool-b on its second attempt.
	var retried, direct int
	for _, id := range ids {
		st := s.Gateway.stamp(t, id)
		switch {
		case st.Attempts == 1 && st.Pool == "pool-a" && slices.Equal(st.PoolsTried, []string{"pool-a"}):
			direct++
		case st.Attempts == 2 && st.Pool == "pool-b" && slices.Equal(st.PoolsTried, []string{"pool-a", "pool-b"}):
			retried++
			if st.Status != 200 || !st.Complete || st.CompletionTokens != tokens {
				t.Errorf("retried stamp %+v", st)
			}
		default:
			t.Errorf("stamp with attempts %d, pool %q, pools tried %v", st.Attempts, st.Pool, st.PoolsTried)
		}
	}
	t.Logf("%d requests: %d served by pool-a, %d retried on pool-b after a 503", requests, direct, retried)
	// Faults are spread evenly: exactly one in five of pool-a's requests.
	if lo, hi := requests*18/100, requests*22/100; retried < lo || retried > hi {
		t.Errorf("%d retried, want about 20%% of %d", retried, requests)
	}

	// The controller saw pool-a's failures (failed attempts) and none on pool-b.
	testutil.Eventually(t, 3*time.Second, func() bool {
		resp, err := http.Get(s.Gateway.AdminURL + "/debug/controller?format=json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var states []struct {
			Pools map[string]struct {
				Samples   int     `json:"samples"`
				ErrorRate float64 `json:"error_rate"`
			} `json:"pools"`
		}
		if json.NewDecoder(resp.Body).Decode(&states) != nil || len(states) != 1 {
			return false
		}
		a, b := states[0].Pools["pool-a"], states[0].Pools["pool-b"]
		t.Logf("controller: pool-a %d samples, error rate %.3f; pool-b %d samples, error rate %.3f", a.Samples, a.ErrorRate, b.Samples, b.ErrorRate)
		return a.ErrorRate > 0.15 && a.ErrorRate < 0.25 && b.Samples > 0 && b.ErrorRate == 0
	}, "the controller to count pool-a's failed attempts")
}
