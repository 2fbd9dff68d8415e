package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/infergate/infergate/internal/ledgerfile"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// crashTenants each call their own pool (the model is the pool's name in
// envoy/demo.yaml), so that each pool's billing is one tenant's.
var crashTenants = []struct{ key, tenant, model string }{
	{"sk-chaos-gold", "gold", "pool-a"}, {"sk-chaos-silver", "silver", "pool-b"},
}

// crashKills is how many times the test kills infergate.
const crashKills = 20

// TestLedgerSurvivesKill9 is the embedded ledger's crash test: `infergate
// serve` on its default backend (a bbolt file) behind Envoy, under load,
// killed with SIGKILL at seeded random instants and restarted on the same
// file, 20 times. After each kill, and at the end, the file is read
// (infergate dead, so opened read-only): every tenant's output-token
// counter must hold at least what its pool billed for the requests it
// admitted (a crash may over-charge, never under-charge), and the spend
// read back never shrinks across a restart and never exceeds the counters.
func TestLedgerSurvivesKill9(t *testing.T) {
	// The hour's output-token counter is the one reconciled: start where
	// the whole test fits in one hour.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 2*time.Minute {
		time.Sleep(left + time.Second)
	}
	dir := t.TempDir()
	pools := map[string]*pool{"pool-a": startPool(t, "pool-a"), "pool-b": startPool(t, "pool-b")}
	policies := filepath.Join(dir, "policies")
	copyPolicies(t, policies)
	write(t, filepath.Join(policies, "chaos.yaml"), tenantData)
	keys := filepath.Join(dir, "keys.yaml")
	write(t, keys, keysFile(""))
	ledgerPath := filepath.Join(dir, "ledger.db")
	cfg := filepath.Join(dir, "infergate.yaml")
	write(t, cfg, fmt.Sprintf("auth: {keys: %s}\npolicy: {dir: %s}\nratelimit: {embedded: {path: %s}}\nlog: {level: info}\n", keys, policies, ledgerPath))
	extprocAddr, adminAddr := freeAddr(t), freeAddr(t)
	gate := startProc(t, "infergate serve", "http://"+adminAddr+"/readyz", "serve", "--config", cfg,
		"--extproc-listen", extprocAddr, "--admin-listen", adminAddr)
	if !strings.Contains(gate.log.String(), "embedded ledger") {
		t.Fatalf("serve did not say the money is in the embedded ledger:\n%s", tail(gate.log.String(), 2000))
	}
	listen := freeAddr(t)
	envoy := envoytest.Start(t, envoytest.Render(t, "envoy/demo.yaml", map[string]string{
		"LISTEN_PORT": port(listen), "ADMIN_PORT": "0", "EXTPROC_PORT": port(extprocAddr),
		"POOL_A_PORT": port(pools["pool-a"].addr), "POOL_B_PORT": port(pools["pool-b"].addr),
		"JWKS_FILE": filepath.Join(repoRoot, "envoy", "demo-jwks.json"), "OTLP_PORT": port(freeAddr(t)),
	}))
	url := "http://" + listen + "/v1/chat/completions"
	testutil.Eventually(t, 15*time.Second, func() bool {
		return crashRequest(url, crashTenants[0].key, crashTenants[0].model, false, 8, 16) == http.StatusOK
	}, "the stack's first answer")

	// The load: two clients per tenant, streamed and not, until stopped.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, ok atomic.Int64
	for i := range 2 * len(crashTenants) {
		c := crashTenants[i%len(crashTenants)]
		rnd := rand.New(rand.NewPCG(7, uint64(i)))
		wg.Go(func() {
			for ctx.Err() == nil {
				sent.Add(1)
				if crashRequest(url, c.key, c.model, rnd.IntN(2) == 0, 4+rnd.IntN(40), 8+rnd.IntN(maxTokens-8)) == http.StatusOK {
					ok.Add(1)
				} else {
					time.Sleep(20 * time.Millisecond) // infergate is down: Envoy fails closed at once
				}
			}
		})
	}

	rnd := rand.New(rand.NewPCG(32, 1))
	var last map[string]spend.Amount
	check := func(when string) readBack {
		t.Helper()
		rb := readLedger(t, ledgerPath)
		for _, c := range crashTenants {
			s, before := rb.spend[c.tenant], last[c.tenant]
			if s.Requests < before.Requests || s.OutputTokens < before.OutputTokens || s.Cost < before.Cost {
				t.Errorf("%s: %s's spend read back %+v, less than %+v before", when, c.tenant, s, before)
			}
			if s.OutputTokens > rb.output[c.tenant] {
				t.Errorf("%s: %s's spend holds %d output tokens, more than its counters' %d", when, c.tenant, s.OutputTokens, rb.output[c.tenant])
			}
		}
		last = rb.spend
		return rb
	}
	for k := range crashKills {
		time.Sleep(time.Duration(300+rnd.IntN(1200)) * time.Millisecond)
		gate.Kill()
		check(fmt.Sprintf("kill %d", k+1))
		gate.Start()
	}
	stop()
	wg.Wait()
	// Every request has ended; what the last run admitted has settled
	// once its reservations say so. Then one more kill, and the reckoning.
	testutil.Eventually(t, 20*time.Second, func() bool { return gauge(envoy.AdminURL, "http.llm.downstream_rq_active") == 0 },
		"Envoy's requests to end")
	testutil.Eventually(t, 10*time.Second, func() bool { return settledAt("http://" + adminAddr) }, "the last run's reservations to settle")
	gate.Kill()
	final := check("the end")

	var b strings.Builder
	fmt.Fprintf(&b, "%d kills, %d requests sent, %d answered 200\n| tenant | billed output tokens | charged | over | under | spend output tokens | spend requests |\n|---|---|---|---|---|---|---|\n",
		crashKills, sent.Load(), ok.Load())
	for _, c := range crashTenants {
		billed, charged := pools[c.model].Usage().CompletionTokens, final.output[c.tenant]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d |\n", c.tenant, billed, charged, max(0, charged-billed), max(0, billed-charged),
			final.spend[c.tenant].OutputTokens, final.spend[c.tenant].Requests)
		if charged < billed {
			t.Errorf("%s: charged %d output tokens, billed %d: under-charged by %d", c.tenant, charged, billed, billed-charged)
		}
		if billed == 0 {
			t.Errorf("%s: its pool billed nothing: the load did not reach it", c.tenant)
		}
	}
	t.Logf("the embedded ledger after kill -9:\n%s", b.String())
}

// crashRequest sends one chat completion and reads it whole; it returns
// the status (0 when no answer came).
func crashRequest(url, key, model string, stream bool, words, maxTok int) int {
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		model, stream, maxTok, strings.Repeat("word ", words))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("authorization", "Bearer "+key)
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0
	}
	return resp.StatusCode
}

// readBack is what the ledger's file holds, by tenant: the output tokens
// of its hour counters, and its spend.
type readBack struct {
	output map[string]int64
	spend  map[string]spend.Amount
}

// readLedger opens the file of a dead infergate read-only.
func readLedger(t *testing.T, path string) readBack {
	t.Helper()
	db, err := ledgerfile.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rb := readBack{output: map[string]int64{}, spend: map[string]spend.Amount{}}
	_ = db.View(func(tx *bolt.Tx) error {
		for id, v := range ratelimit.Counters(tx, "") {
			// ig:rl:{tenant=NAME/model=M}:output_tokens:3600000:<start>
			key, rest, _ := strings.Cut(strings.TrimPrefix(id, ratelimit.DefaultCounterPrefix+"{"), "}:")
			if strings.HasPrefix(rest, "output_tokens:3600000:") {
				tenant, _, _ := strings.Cut(strings.TrimPrefix(key, "tenant="), "/")
				rb.output[tenant] += v
			}
		}
		return nil
	})
	hours, err := (&spend.Embedded{DB: db}).Hours(context.Background(), 0, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range hours {
		for k, a := range b {
			rb.spend[k.Tenant] = rb.spend[k.Tenant].Add(a)
		}
	}
	return rb
}

// settledAt says whether the infergate at admin has ended every
// reservation it made (see rig.settled).
func settledAt(admin string) bool {
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return false
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return false
	}
	var reserved, ended float64
	for _, line := range strings.Split(string(body), "\n") {
		series, val, ok := strings.Cut(line, " ")
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		switch {
		case !ok || err != nil:
		case strings.HasPrefix(series, "infergate_ratelimit_reservations_total{") && strings.Contains(series, `state="reserved"`):
			reserved += f
		case strings.HasPrefix(series, "infergate_ratelimit_reservations_total{") && strings.Contains(series, `state="settled"`),
			strings.HasPrefix(series, "infergate_admission_errors_total{") && strings.Contains(series, `op="settle"`):
			ended += f
		}
	}
	return ended >= reserved
}
