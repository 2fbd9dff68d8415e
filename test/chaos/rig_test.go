// Package chaos breaks a running deployment on purpose and checks that
// nothing is lost: infergate, Envoy, Redis, the controller and a pool are
// killed, frozen or restarted while streams are in flight, clients leave at
// random byte offsets or read one byte a second, and after each fault the
// ledger is checked — what Redis charged against what the pools billed.
//
// The rig is the scaled-out deployment, every piece a real process except
// the mock pools: `infergate extproc` (killed with SIGKILL, frozen with
// SIGSTOP), `infergate controller` feeding Envoy's routes over xDS, Envoy
// 1.40 on envoy/sla.yaml, and a durable Redis. The load is `infergate
// bench`; probe clients next to it check every byte.
package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

var repoRoot = envoytest.RepoRoot

// infergateBin and benchBin (infergate-bench, the load) are built once by
// TestMain.
var infergateBin, benchBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "infergate-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	infergateBin = filepath.Join(dir, "infergate")
	build := exec.Command("go", "build", "-o", infergateBin, "./cmd/infergate")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building infergate: %v\n%s", err, out)
		os.Exit(1)
	}
	benchBin = filepath.Join(dir, "infergate-bench")
	build = exec.Command("go", "build", "-o", benchBin, "./cmd/infergate-bench")
	build.Dir = filepath.Join(repoRoot, "bench")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building infergate-bench: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// apiKeys are the clients' keys, one per tenant, each on its own tier.
var apiKeys = []struct{ key, tenant string }{
	{"sk-chaos-gold", "gold"}, {"sk-chaos-silver", "silver"}, {"sk-chaos-bronze", "bronze"},
}

const (
	// model is the virtual model the controller routes over both pools.
	model = "llama"
	// messageTimeout is the gate's ext_proc message_timeout in envoy/sla.yaml:
	// a gate that does not answer within it fails the request closed.
	messageTimeout = time.Second
	// maxTokens is the largest output any client asks for; the tier's cap.
	maxTokens = 48
)

// tenantData adds three tenants on three tiers to the shipped example
// data: budgets far above the load, so every charge shows in the ledger
// and none denies. The tiers differ in what a policy reload changes.
const tenantData = `infergate:
  tiers:
    t-gold: {rank: 2, models: ["*"], max_tokens: 48, requests_per_minute: 3000000, tokens_per_minute: 3000000000, output_tokens_per_hour: 3000000000, checks: []}
    t-silver: {rank: 1, models: ["*"], max_tokens: 48, requests_per_minute: 2000000, tokens_per_minute: 2000000000, output_tokens_per_hour: 2000000000, checks: []}
    t-bronze: {rank: 0, models: ["*"], max_tokens: 48, requests_per_minute: 1000000, tokens_per_minute: 1000000000, output_tokens_per_hour: 1000000000, checks: []}
  tenants:
    gold: {tier: t-gold}
    silver: {tier: t-silver}
    bronze: {tier: t-bronze}
`

// rig is one deployment under test.
type rig struct {
	t   *testing.T
	dir string

	redis *redisserver.Server
	rdb   *redis.Client
	pools [2]*pool
	// reference answers like a pool but is outside the ledger: what a
	// client must receive, byte for byte, for a request.
	reference *mock.Server

	gate  *proc // infergate extproc
	ctrl  *proc // infergate controller
	envoy *envoytest.Envoy
	// envoyConfig is envoy/sla.yaml on a fixed listener port, so that a
	// new Envoy can take over from a draining one (SO_REUSEPORT).
	envoyConfig string
	URL         string // Envoy's listener

	gateAdmin, ctrlAdmin string
	keys, policyData     string // the files a reload rewrites

	ledger *ledger
}

// pool is a mock pool that can be killed (every connection cut) and
// brought back on the same address, keeping its ledger.
type pool struct {
	*mock.Server
	name, addr string
	// undecided counts requests that reached the pool without the routing
	// header only the gate sets: requests no decision was made for.
	undecided atomic.Int64

	mu  sync.Mutex
	srv *http.Server
}

var poolConfig = mock.Config{TTFT: 40 * time.Millisecond, ITL: 8 * time.Millisecond}

func startPool(t *testing.T, name string) *pool {
	t.Helper()
	p := &pool{Server: mock.New(poolConfig, nil), name: name}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(p.Kill)
	return p
}

func (p *pool) serve(lis net.Listener) {
	h := p.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "completions") && r.Header.Get(request.ModelHeader) == "" {
			p.undecided.Add(1)
		}
		h.ServeHTTP(w, r)
	})}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go srv.Serve(lis)
}

// undecided counts requests that reached either pool without a decision.
func (r *rig) undecided() int64 {
	return r.pools[0].undecided.Load() + r.pools[1].undecided.Load()
}

// Kill closes the pool's listener and every connection, mid-stream or not.
func (p *pool) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Close()
		p.srv = nil
	}
}

// Restart serves again on the same address.
func (p *pool) Restart(t *testing.T) {
	t.Helper()
	lis, err := listenRetry(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(lis)
}

func listenRetry(addr string) (net.Listener, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return lis, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// proc is an infergate process that can be killed, frozen and restarted
// with the same arguments (so on the same ports).
type proc struct {
	*testutil.Proc
	t     *testing.T
	ready string // URL that answers 200 once it serves
	log   *testutil.Buffer
}

func startProc(t *testing.T, name, ready string, args ...string) *proc {
	t.Helper()
	log := &testutil.Buffer{}
	t.Cleanup(func() { // runs once the process has been stopped
		if dir := os.Getenv("CHAOS_LOGS"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".log"), []byte(log.String()), 0o644)
		}
	})
	fmt.Fprintf(log, "--- start %s\n", time.Now().Format(time.TimeOnly))
	p := &proc{t: t, ready: ready, log: log,
		Proc: testutil.StartProc(t, exec.Command(infergateBin, args...), testutil.ProcOptions{Name: name, Log: log})}
	p.waitReady()
	return p
}

// Start runs the process again and waits until it is ready.
func (p *proc) Start() {
	p.t.Helper()
	if err := p.Restart(); err != nil {
		p.t.Fatal(err)
	}
	p.waitReady()
}

func (p *proc) waitReady() {
	p.t.Helper()
	if err := p.WaitReady(15*time.Second, testutil.HTTPReady(p.ready)); err != nil {
		p.t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// startRig brings the whole deployment up.
func startRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, dir: t.TempDir(), reference: mock.New(poolConfig, nil)}
	r.redis = redisserver.StartDurable(t)
	r.rdb = redis.NewClient(&redis.Options{Addr: r.redis.Addr(), ReadTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { r.rdb.Close() })
	r.pools = [2]*pool{startPool(t, "pool-a"), startPool(t, "pool-b")}

	policies := filepath.Join(r.dir, "policies")
	copyPolicies(t, policies)
	r.policyData = filepath.Join(policies, "chaos.yaml")
	write(t, r.policyData, tenantData)
	r.keys = filepath.Join(r.dir, "keys.yaml")
	write(t, r.keys, keysFile(""))

	// One Redis for budgets and the observation feed; a Redis outage
	// denies (fail closed) rather than admitting on local counters the
	// ledger cannot see.
	shared := fmt.Sprintf(`
ratelimit: {backend: redis, onBackendError: deny, redis: {address: %s, timeout: 200ms}}
log: {level: info}
`, r.redis.Addr())
	gateCfg := filepath.Join(r.dir, "extproc.yaml")
	write(t, gateCfg, fmt.Sprintf("auth: {keys: %s}\npolicy: {dir: %s}\n", r.keys, policies)+shared)
	extprocAddr, gateAdmin := freeAddr(t), freeAddr(t)
	r.gateAdmin = "http://" + gateAdmin
	r.gate = startProc(t, "infergate extproc", r.gateAdmin+"/readyz", "extproc", "--config", gateCfg,
		"--extproc-listen", extprocAddr, "--admin-listen", gateAdmin)

	xdsAddr, ctrlAdmin := freeAddr(t), freeAddr(t)
	r.ctrlAdmin = "http://" + ctrlAdmin
	ctrlCfg := filepath.Join(r.dir, "controller.yaml")
	write(t, ctrlCfg, fmt.Sprintf(`
admin: {listen: %q}
xds: {listen: %q}
virtualModels:
- name: %s
  pools:
  - {cluster: pool-a, priority: 0}
  - {cluster: pool-b, priority: 1}
  sla: {ttftP95: 400ms}
  tuning: {window: 2s, minSamples: 8, interval: 250ms, step: 20, cooldown: 3s, probeWeight: 2}
  retry: {attempts: 1}
`, ctrlAdmin, xdsAddr, model)+shared)
	r.ctrl = startProc(t, "infergate controller", r.ctrlAdmin+"/readyz", "controller", "--config", ctrlCfg)

	listen := freeAddr(t)
	r.URL = "http://" + listen
	r.envoyConfig = envoytest.Render(t, "envoy/sla.yaml", map[string]string{
		"LISTEN_PORT": port(listen), "ADMIN_PORT": "0",
		"EXTPROC_PORT": port(extprocAddr), "POOL_A_PORT": port(r.pools[0].addr), "POOL_B_PORT": port(r.pools[1].addr),
		"JWKS_FILE": filepath.Join(repoRoot, "envoy", "demo-jwks.json"), "XDS_PORT": port(xdsAddr), "OTLP_PORT": port(freeAddr(t)),
	})
	r.envoy = envoytest.Start(t, r.envoyConfig, envoyDrain...)
	r.ledger = newLedger(t, r)
	// The first request proves the whole path, routes from the controller
	// included.
	deadline := time.Now().Add(15 * time.Second)
	for {
		res := r.probe(context.Background(), probeSpec{stream: true, key: apiKeys[0].key})
		if res.outcome == exact {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rig never served a request: %+v", res)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return r
}

// restartEnvoy starts a new Envoy on the same listener, then drains the
// old one as a rolling restart does: streams it holds finish, new
// connections go to the new one.
func (r *rig) restartEnvoy() {
	r.t.Helper()
	old := r.envoy
	r.envoy = envoytest.Start(r.t, r.envoyConfig, envoyDrain...)
	post(r.t, old.AdminURL+"/drain_listeners?graceful")
	// Wait until the old one holds no connection (HTTP/1.1 clients were
	// told to close, HTTP/2 ones sent a GOAWAY) and no gate or meter stream:
	// a meter stream ends, its settlement sent, up to the meter's
	// deferred_close_timeout (5 s) after its request. Killed earlier, the
	// old Envoy would take settlements with it that a rolling restart
	// keeps. The deadline only tells a hang from a slow drain.
	drained := func() bool {
		return gauge(old.AdminURL, "http.llm.downstream_cx_active") == 0 &&
			gauge(old.AdminURL, "cluster.infergate.upstream_rq_active") == 0
	}
	deadline := time.Now().Add(time.Minute)
	for !drained() {
		if time.Now().After(deadline) {
			r.t.Errorf("the old Envoy still holds connections or gate and meter streams a minute into its drain")
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	old.Kill()
}

// envoyDrain is how a rolling restart drains: every connection is asked
// to close at once (Connection: close, GOAWAY), and the listener stops
// accepting 3 s later.
var envoyDrain = []string{"--drain-strategy", "immediate", "--drain-time-s", "3"}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// gauge reads one stat from Envoy's admin (-1 if unreadable).
func gauge(adminURL, name string) int {
	resp, err := http.Get(adminURL + "/stats?filter=^" + strings.ReplaceAll(name, ".", `\.`) + "$")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, v, ok := strings.Cut(strings.TrimSpace(string(b)), ": ")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

// quiesce waits until no request is in flight anywhere: Envoy holds no
// stream and the pools are idle.
func (r *rig) quiesce() {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if gauge(r.envoy.AdminURL, "http.llm.downstream_rq_active") == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Errorf("requests still in flight 20s after the load stopped")
}

// keysFile lists the clients' keys (hashes only), plus extra lines.
func keysFile(extra string) string {
	var b strings.Builder
	b.WriteString("keys:\n")
	for _, k := range apiKeys {
		sum := sha256.Sum256([]byte(k.key))
		fmt.Fprintf(&b, "- id: %s-client\n  sha256: %s\n  tenant: %s\n", k.tenant, hex.EncodeToString(sum[:]), k.tenant)
	}
	return b.String() + extra
}

func copyPolicies(t *testing.T, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(repoRoot, "policies"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".rego") || strings.HasSuffix(e.Name(), ".yaml")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, "policies", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dst, e.Name()), string(b))
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
