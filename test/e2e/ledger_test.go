package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/internal/wasmmeter"
)

// The accounting rule, tried by a hostile client and a hostile peer: for
// every tenant, what its budget was charged is at least what the pool
// generated for it. A seeded, randomised client (LEDGER_SEED replays a
// run, LEDGER_REQUESTS sets its size) sends every API, streamed and not,
// with every output-cap spelling, n, logprobs, background Responses,
// prompt_logprobs written after usage, hang-ups before and after the first
// byte and Envoy local replies; then a raw peer on infergate's ext_proc
// port replays sealed fields it got from real gate answers, as meter
// streams and as the in-Envoy meter's access-log entries, with 0 usage,
// with huge usage, and with forged tenants and reservations.
//
// Each request has a tenant of its own (those whose tenant the peer then
// replays share one per kind), so the budget charged to a tenant (its
// counter in Redis, under a limit only these tenants have) is the charge
// of one request, and the mock's ledger (what it prefilled and decoded for
// each request, until it ended or was hung up on) is what the pool
// generated for it. Over-charge is reported, not
// asserted: the rule keeps reservations it has no proof to lower.
func TestAdversarialLedger(t *testing.T) {
	seed, requests := uint64(time.Now().UnixNano()), 2000
	if v := os.Getenv("LEDGER_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LEDGER_SEED=%q: %v", v, err)
		}
		seed = n
	}
	if v := os.Getenv("LEDGER_REQUESTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LEDGER_REQUESTS=%q: want a positive integer", v)
		}
		requests = n
	}
	t.Logf("LEDGER_SEED=%d LEDGER_REQUESTS=%d", seed, requests)
	// The table again after the logs a failure dumps (this cleanup runs last).
	var summary string
	t.Cleanup(func() {
		if t.Failed() && summary != "" {
			t.Log(summary)
		}
	})
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	plan := make([]ledgerCall, requests)
	for i := range plan {
		plan[i] = planLedgerCall(rng, i)
	}
	cells := map[string]bool{}
	for _, c := range plan {
		cells[c.tenant()] = true
	}
	for _, p := range ledgerPeerCases {
		cells[p.tenant()] = true
	}

	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	keys, policies := ledgerTenants(t, slices.Sorted(maps.Keys(cells)))
	s := startStackFor(t, "", func(*stack) string {
		// meter.wasm: the access-log service is there for the peer to forge.
		return withWasmMeter(t, policyConfig(keys, policies, "ratelimit: {backend: redis, redis: {address: "+srv.Addr()+"}}"))
	}, 1)
	fast := mock.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, MaxTokens: 64}
	s.PoolA.SetConfig(fast)
	s.PoolB.SetConfig(fast)
	// Local replies: pool-b's route times out a response idle for a second
	// (Envoy answers 408 before the response starts, resets it after), and
	// the requests sent there stall for far longer.
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr,
		func(t *testing.T, rendered string) string {
			const route = "route: {cluster: pool-b, timeout: 0s}"
			if !strings.Contains(rendered, route) {
				t.Fatal("envoy/demo.yaml: pool-b's route not found")
			}
			return strings.Replace(rendered, route, "route: {cluster: pool-b, timeout: 0s, idle_timeout: 1s}", 1)
		})

	// Phase 1: the client mix through Envoy, 16 at a time.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: time.Minute /* a safety net */}
	statuses := make([]int, len(plan))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				statuses[i] = plan[i].do(t, client, s.Envoy.URL, s.PoolA)
			}
		})
	}
	for i := range plan {
		next <- i
	}
	close(next)
	wg.Wait()

	// Everything the pools started has ended, every stream between Envoy
	// and infergate has closed, and with it every settlement has run (the
	// meter settles before its stream ends).
	testutil.Eventually(t, 2*time.Minute, func() bool {
		for _, p := range []*pool{s.PoolA, s.PoolB} {
			for _, a := range p.Ledger() {
				if a.Open > 0 {
					return false
				}
			}
		}
		return envoyStat(t, s.Envoy.AdminURL, "http.llm.downstream_rq_active") == 0 &&
			envoyStat(t, s.Envoy.AdminURL, "cluster.infergate.upstream_rq_active") == 0 &&
			metricSum(t, s.Gateway.AdminURL, "infergate_meter_active_streams", "") == 0
	}, "the pools, Envoy's requests and the meter streams to end")
	t.Logf("reservations: %v reserved, %v settled",
		metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="reserved"`),
		metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`))

	// Phase 2: the raw peer. Each of its meter streams has settled when
	// infergate ends it.
	conn, err := grpc.NewClient(s.Gateway.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer := &ledgerPeer{t: t, client: extprocv3.NewExternalProcessorClient(conn),
		accessLog: accesslogv3.NewAccessLogServiceClient(conn), rdb: rdb}
	peerStreams := map[string]int{}
	for _, p := range ledgerPeerCases {
		peerStreams[p.tenant()] += p.run(peer)
	}

	// The comparison, per tenant, and the table, per kind.
	charged := ledgerCharges(t, rdb)
	if len(charged) == 0 {
		t.Fatal("no ledger budget counter in Redis: has the counter layout (ig:rl:{<limit key>}:<unit>:<window ms>:<start>) changed?")
	}
	generated := map[string]mock.LedgerAccount{}
	for _, p := range []*pool{s.PoolA, s.PoolB} {
		for account, a := range p.Ledger() {
			if account == "(overflow)" {
				t.Fatal("the mock's ledger overflowed its accounts: fewer LEDGER_REQUESTS")
			}
			name, _, _ := strings.Cut(account, "#") // a tenant's requests each have an account
			g := generated[name]
			g.Requests += a.Requests
			g.PromptTokens += a.PromptTokens
			g.OutputTokens += a.OutputTokens
			generated[name] = g
		}
	}
	type row struct {
		requests, peer, statusOK          int
		generated, charged, under, over   int64
		worstUnder, worstOver             int64
		worstUnderTenant, worstOverTenant string
	}
	rows := map[string]*row{}
	sent := map[string]int{}
	for i, c := range plan {
		sent[c.tenant()]++
		r := rows[c.kind]
		if r == nil {
			r = &row{}
			rows[c.kind] = r
		}
		r.requests++
		if statuses[i] == http.StatusOK {
			r.statusOK++
		}
	}
	type failure struct {
		under int64
		what  string
	}
	var failures []failure
	for _, tenant := range slices.Sorted(maps.Keys(cells)) {
		kind := strings.SplitN(strings.TrimPrefix(tenant, "ledger-"), ".", 2)[0]
		r := rows[kind]
		if r == nil {
			r = &row{}
			rows[kind] = r
		}
		r.peer += peerStreams[tenant]
		gen, ch := generated[tenant].Tokens(), charged[tenant]
		r.generated += gen
		r.charged += ch
		if d := gen - ch; d > 0 {
			r.under += d
			if d > r.worstUnder {
				r.worstUnder, r.worstUnderTenant = d, tenant
			}
			missing := ""
			if _, ok := charged[tenant]; !ok {
				missing = " (no budget counter at all)"
			}
			failures = append(failures, failure{d, fmt.Sprintf("%s: charged %d tokens%s, the pool generated %d (%d prompt + %d output) for its %d requests: %d under-charged",
				tenant, ch, missing, gen, generated[tenant].PromptTokens, generated[tenant].OutputTokens, sent[tenant], d)})
		} else if d < 0 {
			r.over -= d
			if -d > r.worstOver {
				r.worstOver, r.worstOverTenant = -d, tenant
			}
		}
	}
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\trequests\t200s\tpeer streams\tgenerated\tcharged\tunder-charged\tworst under (tenant)\tover-charged\tworst over (tenant)\t")
	var total row
	for _, kind := range slices.Sorted(maps.Keys(rows)) {
		r := rows[kind]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t\n", kind, r.requests, r.statusOK, r.peer,
			r.generated, r.charged, r.under, worst(r.worstUnder, r.worstUnderTenant), r.over, worst(r.worstOver, r.worstOverTenant))
		total.requests += r.requests
		total.statusOK += r.statusOK
		total.peer += r.peer
		total.generated += r.generated
		total.charged += r.charged
		total.under += r.under
		total.over += r.over
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%d\t%d\t%d\t\t%d\t\t\n", total.requests, total.statusOK, total.peer,
		total.generated, total.charged, total.under, total.over)
	tw.Flush()
	summary = fmt.Sprintf("LEDGER_SEED=%d LEDGER_REQUESTS=%d: tokens per case kind (charged: the tenants' budget counters; generated: the pools' ledger)\n%s",
		seed, requests, table.String())
	t.Log(summary)
	if total.generated == 0 {
		t.Fatal("the pools generated nothing: the mix never reached them")
	}
	// The worst twenty by name, then the count.
	slices.SortFunc(failures, func(a, b failure) int { return cmp.Compare(b.under, a.under) })
	for _, f := range failures[:min(len(failures), 20)] {
		t.Error(f.what)
	}
	if len(failures) > 0 {
		t.Errorf("%d tenants under-charged by %d tokens in all (replay with LEDGER_SEED=%d LEDGER_REQUESTS=%d)",
			len(failures), total.under, seed, requests)
	}
}

func worst(d int64, tenant string) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%d (%s)", d, strings.TrimPrefix(tenant, "ledger-"))
}

// ledgerTier is the tier of every ledger tenant: budgets far beyond what a
// run uses (nothing is refused for budget) and the output cap the gate
// holds requests to. ledgerLimit is the budget the test reads: one per
// tenant, in a window (30 days) that does not roll during a run, and
// only for these tenants, so the shipped policies' own tests still hold.
const (
	ledgerCap  = 256
	ledgerTier = `infergate:
  tiers:
    ledger:
      rank: 0
      models: ["*"]
      max_tokens: 256
      requests_per_minute: 1000000000
      tokens_per_minute: 1000000000000
      output_tokens_per_hour: 1000000000000
      checks: []
  tenants:
`
	ledgerLimit = `package infergate.ratelimit

# The adversarial ledger test reads each tenant's charge from this counter.
limits contains {
	"name": "ledger-total-tokens",
	"key": concat("", ["ledger/tenant=", input.tenant]),
	"unit": "total_tokens",
	"amount": 1000000000000,
	"window": "720h",
} if startswith(input.tenant, "ledger-")
`
	ledgerWindowMs = "2592000000"
)

// ledgerTenants writes a keys file with one key per tenant ("sk-" and the
// tenant's name) and a policy directory: the shipped policies plus the
// ledger tier and limit.
func ledgerTenants(t *testing.T, tenants []string) (keys, dir string) {
	t.Helper()
	dir = copyPolicies(t)
	var data, k strings.Builder
	data.WriteString(ledgerTier)
	k.WriteString("keys:\n")
	for _, tenant := range tenants {
		fmt.Fprintf(&data, "    %s: {tier: ledger}\n", tenant)
		sum := sha256.Sum256([]byte("sk-" + tenant))
		fmt.Fprintf(&k, "- id: %s\n  sha256: %s\n  tenant: %s\n", tenant, hex.EncodeToString(sum[:]), tenant)
	}
	for name, body := range map[string]string{"ledger.yaml": data.String(), "ledger.rego": ledgerLimit} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keys = filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(keys, []byte(k.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return keys, dir
}

// ledgerCharges reads every ledger tenant's budget counters from Redis,
// summed over windows (a charge carried into a later window included).
func ledgerCharges(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[string]int64{}
	iter := rdb.Scan(ctx, 0, "ig:rl:{ledger/tenant=*}:total_tokens:"+ledgerWindowMs+":*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		tenant := key[strings.Index(key, "=")+1 : strings.Index(key, "}")]
		n, err := rdb.Get(ctx, key).Int64()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		out[tenant] += n
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// envoyStat reads one of Envoy's counters or gauges.
func envoyStat(t *testing.T, adminURL, name string) int64 {
	t.Helper()
	for line := range strings.Lines(get(t, adminURL+"/stats?filter=^"+strings.ReplaceAll(name, ".", `\.`)+"$")) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+": "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("Envoy stat %s: %q", name, line)
			}
			return n
		}
	}
	t.Fatalf("Envoy has no stat %s", name)
	return 0
}

// Case kinds of the client mix.
const (
	kindComplete       = "complete"        // runs to its end
	kindTwoCaps        = "two-caps"        // two output caps; the pool writes the larger
	kindPromptLogprobs = "prompt-logprobs" // usage followed by more than 64 KiB
	kindBackground     = "background"      // Responses answered queued, generated after
	kindHangupEarly    = "hangup-early"    // the client leaves within 30 ms, before or around the first byte
	kindHangupStream   = "hangup-stream"   // the client leaves after some events
	kindHangupUnary    = "hangup-unary"    // the client leaves a non-streamed request mid-generation
	kindLocalReply     = "local-reply"     // Envoy times the stalled response out: 408 or a reset
	kindReplay         = "replay"          // real traffic, then its sealed field replayed with 0 usage
	kindForge          = "forge"           // real traffic, then forged tenants and reservations
	kindInflate        = "inflate"         // real traffic, then its sealed field replayed with huge usage
)

var ledgerKinds = []struct {
	kind   string
	weight int
	apis   []string
}{
	{kindComplete, 36, []string{"chat", "completions", "embeddings", "responses", "messages"}},
	{kindTwoCaps, 8, []string{"chat", "completions", "responses"}},
	{kindPromptLogprobs, 5, []string{"chat", "completions"}},
	{kindBackground, 5, []string{"responses"}},
	{kindHangupEarly, 8, []string{"chat", "completions", "embeddings", "responses", "messages"}},
	{kindHangupStream, 10, []string{"chat", "completions", "responses", "messages"}},
	{kindHangupUnary, 8, []string{"chat", "completions", "responses", "messages"}},
	{kindLocalReply, 4, []string{"chat", "completions", "responses", "messages"}},
	{kindReplay, 4, []string{"chat"}},
	{kindForge, 4, []string{"chat"}},
	{kindInflate, 4, []string{"chat"}},
}

var ledgerPaths = map[string]string{
	"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
	"responses": "/v1/responses", "messages": "/v1/messages",
}

// ledgerCall is one planned request, fixed from the seed before the run.
type ledgerCall struct {
	id          int
	kind, api   string
	body        string
	stream      bool
	hdr         map[string]string
	leaveAfter  time.Duration // hang up this long after sending (0: never)
	leaveLater  time.Duration // hang up this long after the pool started on it (0: never)
	leaveEvents int           // hang up after this many SSE events (0: never)
}

// tenant is the request's own (ledger-<kind>.<api>.<id>), so that no
// request's over-charge hides another's under-charge; the kinds the raw
// peer replays share one per API with the peer.
func (c ledgerCall) tenant() string {
	if c.kind == kindReplay || c.kind == kindForge || c.kind == kindInflate {
		return "ledger-" + c.kind + "." + c.api
	}
	return fmt.Sprintf("ledger-%s.%s.%d", c.kind, c.api, c.id)
}

// ledgerWords are the prompt's words: four letters or more, so that the
// gate's estimate (a token per four characters) is never below the mock's
// count (a token per word).
var ledgerWords = strings.Fields("alpha bravo charlie delta foxtrot hotel india juliet lima mike oscar papa quebec romeo sierra tango victor whiskey yankee zulu")

func planLedgerCall(rng *rand.Rand, i int) ledgerCall {
	total := 0
	for _, k := range ledgerKinds {
		total += k.weight
	}
	pick := rng.IntN(total)
	k := ledgerKinds[0]
	for _, kk := range ledgerKinds {
		if pick < kk.weight {
			k = kk
			break
		}
		pick -= kk.weight
	}
	c := ledgerCall{id: i, kind: k.kind, api: k.apis[rng.IntN(len(k.apis))]}
	c.hdr = map[string]string{
		"authorization":           "Bearer sk-" + c.tenant(),
		"x-mock-ledger":           fmt.Sprintf("%s#%d", c.tenant(), i),
		"x-request-id":            fmt.Sprintf("ledger-%d", i),
		"x-mock-tokens-per-event": strconv.Itoa([]int{1, 1, 4}[rng.IntN(3)]),
	}
	words := 3 + rng.IntN(30)
	if c.kind == kindPromptLogprobs {
		words = 80 // 80 prompt tokens × 20 logprobs: over 64 KiB after usage
	}
	prompt := make([]string, words)
	for j := range prompt {
		prompt[j] = ledgerWords[rng.IntN(len(ledgerWords))]
	}
	f := map[string]any{"model": "pool-a"}
	c.stream = c.api != "embeddings" && rng.IntN(2) == 0
	switch c.kind {
	case kindPromptLogprobs, kindHangupUnary, kindBackground:
		c.stream = false
	case kindHangupStream:
		c.stream = true
	}
	outCap := 1 + rng.IntN(200)
	switch c.api {
	case "chat", "completions":
		if c.api == "chat" {
			f["messages"] = []map[string]string{{"role": "user", "content": strings.Join(prompt, " ")}}
		} else {
			f["prompt"] = strings.Join(prompt, " ")
		}
		switch rng.IntN(4) { // the cap's spelling
		case 0: // none: the tier's cap applies
		case 1:
			f["max_tokens"] = outCap
		case 2:
			f["max_completion_tokens"] = outCap
		case 3:
			f["max_tokens"], f["max_completion_tokens"] = outCap, 1+rng.IntN(200)
		}
		if rng.IntN(4) == 0 {
			f["n"] = 1 + rng.IntN(3)
		}
		if rng.IntN(4) == 0 {
			if c.api == "chat" {
				f["logprobs"], f["top_logprobs"] = true, rng.IntN(6)
			} else {
				f["logprobs"] = rng.IntN(6)
			}
		}
		if c.stream && rng.IntN(2) == 0 {
			f["stream_options"] = map[string]bool{"include_usage": rng.IntN(2) == 0}
		}
	case "embeddings":
		f["input"] = strings.Join(prompt, " ")
	case "responses":
		f["input"] = strings.Join(prompt, " ")
		if rng.IntN(3) > 0 {
			f["max_output_tokens"] = outCap
		}
	case "messages":
		f["messages"] = []map[string]string{{"role": "user", "content": strings.Join(prompt, " ")}}
		f["max_tokens"] = outCap
	}
	if c.api != "embeddings" {
		f["stream"] = c.stream
	}
	switch c.kind {
	case kindTwoCaps:
		// The gate reads one key; a server reading the other writes more.
		c.hdr["x-mock-output-cap"] = "largest"
		small, large := 1+rng.IntN(8), 64+rng.IntN(600)
		if c.api == "responses" {
			f["max_output_tokens"], f["max_tokens"] = small, large
		} else {
			f["max_completion_tokens"], f["max_tokens"] = small, large
		}
	case kindPromptLogprobs:
		f["prompt_logprobs"] = 20
	case kindBackground:
		f["background"] = true
		f["max_output_tokens"] = 64 + rng.IntN(ledgerCap-64)
	case kindHangupEarly:
		c.hdr["x-mock-ttft-ms"] = "20"
		c.leaveAfter = time.Duration(rng.IntN(30_000)) * time.Microsecond
	case kindHangupStream:
		c.leaveEvents = 1 + rng.IntN(40)
	case kindHangupUnary:
		long := 100 + rng.IntN(ledgerCap-100)
		for _, key := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			if _, ok := f[key]; ok {
				f[key] = long
			}
		}
		c.leaveLater = time.Duration(1+rng.IntN(100)) * time.Millisecond
	case kindLocalReply:
		f["model"] = "pool-b"
		if rng.IntN(2) == 0 {
			c.hdr["x-mock-ttft-ms"] = "30000"
		} else {
			c.hdr["x-mock-stall-after"] = strconv.Itoa(1 + rng.IntN(20))
			c.hdr["x-mock-stall-ms"] = "30000"
		}
	}
	b, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	c.body = string(b)
	return c
}

// do sends c through Envoy and returns the status (0 when the client left
// before it).
func (c ledgerCall) do(t *testing.T, client *http.Client, base string, pool *pool) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if c.leaveAfter > 0 {
		timer := time.AfterFunc(c.leaveAfter, cancel)
		defer timer.Stop()
	}
	if c.leaveLater > 0 {
		// Mid-generation, however slow the way there: once the pool has
		// the request, then after the offset.
		go func() {
			account := c.hdr["x-mock-ledger"]
			for ctx.Err() == nil {
				if _, ok := pool.LedgerAccount(account); ok {
					time.AfterFunc(c.leaveLater, cancel)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+ledgerPaths[c.api], strings.NewReader(c.body))
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0 // a hang-up, or a reset
	}
	defer resp.Body.Close()
	if c.leaveEvents == 0 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	buf, events := make([]byte, 4096), 0
	for events < c.leaveEvents {
		n, err := resp.Body.Read(buf)
		events += bytes.Count(buf[:n], []byte("\n\n"))
		if err != nil {
			break
		}
	}
	return resp.StatusCode
}

// ledgerPeer is a hostile workload that reaches infergate's ext_proc port.
type ledgerPeer struct {
	t         *testing.T
	client    extprocv3.ExternalProcessorClient
	accessLog accesslogv3.AccessLogServiceClient
	rdb       *redis.Client
	n         int
}

// gateField opens a gate stream as tenant and returns the field the gate
// answered for the meter.
func (p *ledgerPeer) gateField(tenant string) string {
	t := p.t
	t.Helper()
	p.n++
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "gate"), 30*time.Second)
	defer cancel()
	st, err := p.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"pool-a","max_tokens":200,"messages":[{"role":"user","content":"oscar papa quebec romeo"}]}`
	for _, msg := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: ledgerHeaders(
			":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json",
			"authorization", "Bearer sk-"+tenant, "x-request-id", fmt.Sprintf("peer-%d", p.n))}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	} {
		if err := st.Send(msg); err != nil {
			t.Fatal(err)
		}
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("the gate answered no field for the meter: %v", err)
		}
		if f := resp.GetDynamicMetadata().GetFields()[request.MeterNamespace].GetStructValue().GetFields()[request.MeterKey].GetStringValue(); f != "" {
			return f
		}
	}
}

// settle opens a meter stream carrying field and a response whose usage
// is completion tokens; infergate has settled it once the stream ends.
func (p *ledgerPeer) settle(field string, completion int) {
	t := p.t
	t.Helper()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "meter"), 30*time.Second)
	defer cancel()
	st, err := p.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		request.MeterAttribute: structpb.NewStringValue(field)}}}
	usage := fmt.Sprintf(`{"id":"chatcmpl-peer","object":"chat.completion","model":"pool-a","choices":[],"usage":{"prompt_tokens":0,"completion_tokens":%d,"total_tokens":%d}}`,
		completion, completion)
	for _, msg := range []*extprocv3.ProcessingRequest{
		{Attributes: attrs, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: ledgerHeaders("x-request-id", fmt.Sprintf("peer-%d", p.n), request.ModelHeader, "pool-a")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: ledgerHeaders(":status", "200", "content-type", "application/json")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(usage), EndOfStream: true}}},
	} {
		if err := st.Send(msg); err != nil {
			break // refused: what was sent is what counts
		}
	}
	_ = st.CloseSend()
	for {
		if _, err := st.Recv(); err != nil {
			return
		}
	}
}

// settleByAccessLog sends field with a complete, 0-usage summary of the
// in-Envoy meter as one access-log entry per copy, on the ext_proc port
// where infergate takes the access log (meter.wasm is on). Infergate has
// handled the entries once it answers the stream.
func (p *ledgerPeer) settleByAccessLog(field string, copies int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := p.accessLog.StreamAccessLogs(ctx)
	if err != nil {
		return
	}
	sum := wasmmeter.Summary{Start: time.Now().Add(-time.Second), Complete: true, HasFirst: true,
		E2E: 500 * time.Millisecond, API: openai.APIChat, Usage: &openai.Usage{}}
	state, err := anypb.New(wrapperspb.Bytes([]byte(sum.Encode())))
	if err != nil {
		p.t.Fatal(err)
	}
	logs := &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{}
	for i := range copies {
		logs.LogEntry = append(logs.LogEntry, &accesslogdatav3.HTTPAccessLogEntry{
			CommonProperties: &accesslogdatav3.AccessLogCommon{
				FilterStateObjects: map[string]*anypb.Any{wasmmeter.FilterStateKey: state},
				Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MeterNamespace: {
					Fields: map[string]*structpb.Value{request.MeterKey: structpb.NewStringValue(field)}}}},
			},
			Request:  &accesslogdatav3.HTTPRequestProperties{RequestId: fmt.Sprintf("peer-log-%d", i)},
			Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200)},
		})
	}
	msg := &accesslogv3.StreamAccessLogsMessage{
		Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: "peer"}, LogName: "peer"},
		LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: logs},
	}
	if st.Send(msg) == nil {
		_, _ = st.CloseAndRecv()
	}
}

func ledgerHeaders(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// ledgerPeerCase is what the raw peer does in one tenant's name; run
// returns the streams it opened.
type ledgerPeerCase struct {
	kind string
	run  func(p *ledgerPeer) int
}

func (c ledgerPeerCase) tenant() string { return "ledger-" + c.kind + ".chat" }

var ledgerPeerCases = []ledgerPeerCase{
	{kindReplay, func(p *ledgerPeer) int {
		// One real gate answer, settled seven times with 0 usage: the
		// first settles a request that never went upstream, the others
		// would refund the tenant's real traffic.
		field := p.gateField("ledger-" + kindReplay + ".chat")
		for range 7 {
			p.settle(field, 0)
		}
		// And as the in-Envoy meter's access-log entries, three of them.
		p.settleByAccessLog(field, 3)
		return 9
	}},
	{kindForge, func(p *ledgerPeer) int {
		tenant := "ledger-" + kindForge + ".chat"
		field := p.gateField(tenant)
		// The field naming another tenant around this one's sealed
		// reservation (its first "|tenant|" is the tenant's field), settled
		// with 0 usage, three times.
		for _, victim := range []string{"ledger-complete.chat", "ledger-complete.completions", "acme"} {
			p.settle(strings.Replace(field, "|"+tenant+"|", "|"+victim+"|", 1), 0)
		}
		// A reservation infergate never sealed, naming this tenant's
		// counters with a huge reservation to refund.
		ctx := context.Background()
		counters, err := p.rdb.Keys(ctx, "ig:rl:{*"+tenant+"*").Result()
		if err != nil {
			p.t.Fatal(err)
		}
		var entries []string
		for _, k := range counters {
			entries = append(entries, fmt.Sprintf(`{"k":%q,"u":"total_tokens","r":1000000,"x":%d}`, k, time.Now().Add(time.Hour).UnixMilli()))
		}
		payload := `{"e":[` + strings.Join(entries, ",") + `]}`
		for _, reservation := range []string{payload, "AAAA." + base64.RawStdEncoding.EncodeToString([]byte(tenant)) + "." + payload} {
			p.settle("1|0|0|0|0|0|0|0|0|allow|peer-forged|pool-a|"+tenant+"|"+tenant+"|allowed||"+reservation+"|chat", 0)
		}
		return 6
	}},
	{kindInflate, func(p *ledgerPeer) int {
		// A real gate answer settled with a million output tokens, twice:
		// over-charge, reported.
		field := p.gateField("ledger-" + kindInflate + ".chat")
		for range 2 {
			p.settle(field, 1_000_000)
		}
		return 3
	}},
}
