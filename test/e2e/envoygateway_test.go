package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// egBinary is envoy-gateway v1.9.1 as scripts/install-test-deps.sh built it.
func egBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("EG_BIN")
	if p == "" {
		p = filepath.Join(repoRoot, ".tools", "bin", "envoy-gateway")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("envoy-gateway not found (%v): run scripts/install-test-deps.sh, or set EG_BIN", err)
	}
	return p
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return port(t, l.Addr().String())
}

// egStack is Envoy Gateway in standalone mode driving the pinned Envoy,
// with infergate (keys, a policy, the HTTPRoute weight sink) and two pools.
type egStack struct {
	*stack
	URL        string // the Envoy Gateway-managed Envoy's listener
	routesFile string
}

// extprocPlaceholder stands for infergate's port until it listens.
const extprocPlaceholder = "65535"

const egPolicy = `package infergate.authz

default allow := false

allow if input.request.model != "forbidden"

reason := "the model is forbidden" if not allow
`

func startEnvoyGateway(t *testing.T) *egStack {
	t.Helper()
	bin := egBinary(t)
	home := t.TempDir()
	for _, d := range []string{"resources", "config", "data/envoy-versions/1.40.0/bin", "state", "run"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Where Envoy Gateway looks for Envoy 1.40.0: the pinned binary, wrapped
	// to disable hot restart (whose shared-memory id would collide with any
	// other Envoy on the machine).
	wrapper := "#!/bin/sh\nexec " + envoytest.Binary(t) + " --disable-hot-restart \"$@\"\n"
	if err := os.WriteFile(filepath.Join(home, "data/envoy-versions/1.40.0/bin/envoy"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "certgen", "--local", "--config-home", filepath.Join(home, "config")).CombinedOutput(); err != nil {
		t.Fatalf("certgen: %v\n%s", err, out)
	}
	policyDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(policyDir, "authz.rego"), []byte(egPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	routes := filepath.Join(home, "resources", "llm.yaml")
	gwPort := freePort(t)
	s := &egStack{URL: "http://127.0.0.1:" + gwPort, routesFile: routes}
	s.stack = startStackFor(t, "", func(st *stack) string {
		return fmt.Sprintf(`
auth: {keys: %s}
policy: {dir: %s}
virtualModels:
- name: llama
  pools:
  - {cluster: pool-a, priority: 0}
  - {cluster: pool-b, priority: 1}
  sla: {ttftP95: 150ms}
  tuning: {window: 2s, minSamples: 6, interval: 250ms, step: 50, cooldown: 60s, probeWeight: 2}
weightSink:
  type: httpRouteFile
  httpRoute: {file: %s, namespace: default, name: llm}
admin: {debug: {enabled: true}} # the stamp's detail, for its timing brackets
`, writeKeys(t), policyDir, routes)
	}, 1, func(st *stack) {
		// The resources must exist before infergate reads its HTTPRoute.
		res := envoytest.Render(t, "envoy/gateway/standalone.yaml", map[string]string{"GATEWAY_PORT": gwPort,
			"EXTPROC_PORT": extprocPlaceholder, "POOL_A_PORT": port(t, st.PoolA.Addr), "POOL_B_PORT": port(t, st.PoolB.Addr)})
		if err := os.WriteFile(routes, []byte(res), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	// Now that infergate listens, point the Backend at it.
	b, _ := os.ReadFile(routes)
	b = bytes.Replace(b, []byte("port: "+extprocPlaceholder+"}"), []byte("port: "+port(t, s.Gateway.ExtProcAddr)+"}"), 1)
	if err := os.WriteFile(routes, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := envoytest.Render(t, "envoy/gateway/envoy-gateway.yaml", map[string]string{"EG_HOME": home})
	cfgPath := filepath.Join(home, "envoy-gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	log := &testutil.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "server", "--config-path", cfgPath)
	cmd.Dir, cmd.Stdout, cmd.Stderr = home, log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		// Envoy Gateway's host Envoy runs as its child; make sure it is gone.
		_ = exec.Command("pkill", "-f", filepath.Join(home, "data")).Run()
		if t.Failed() {
			t.Logf("envoy-gateway log:\n%s", log.String())
		}
	})
	// Ready when the Gateway's Envoy routes a request through the gate.
	testutil.Eventually(t, 60*time.Second, func() bool {
		resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("llama", 1, false, "")))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized // the gate answered: no key
	}, "Envoy Gateway's Envoy to route through infergate")
	return s
}

// The same infergate, the same Envoy, driven by Envoy Gateway v1.9.1 from
// Gateway API and Envoy Gateway resources (standalone mode: files, host
// Envoy): streams pass intact and incrementally through the gate and the
// meter, policies are enforced, TTFT/ITL are stamped with the pool, a
// stream longer than Envoy Gateway's fixed 10 s ext_proc gRPC timeout
// survives whole, and the SLA controller shifts traffic by rewriting the
// HTTPRoute's weights, which Envoy Gateway re-translates.
func TestEnvoyGatewayStandalone(t *testing.T) {
	s := startEnvoyGateway(t)
	key := map[string]string{"authorization": "Bearer sk-acme-0001", "x-mock-ttft-ms": "60", "x-mock-itl-ms": "15",
		"x-request-id": "eg-stream-1"}

	// Streams: byte-exact and incremental (in lock step); stamped, its timing
	// bracketed.
	r := mustLockstep(t, s.PoolA, s.URL+"/v1/chat/completions", chatBody("llama", 8, true, ""), key)
	r.RequestID = "eg-stream-1"
	// The gate asked the pool for usage on this client's behalf; the
	// policy's Lua filter removes that event after the meter read it.
	want := stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", chatBody("llama", 8, true, `,"stream_options":{"include_usage":true}`), key)
	if want := unasked(t, want).Body; r.Status != 200 || !bytes.Equal(r.Body, want) {
		t.Fatalf("through Envoy Gateway: %d %q\nwant the mock's less its usage event %q", r.Status, r.Body, want)
	}
	seqs := seqsOf(r.Events, isChatContent)
	if len(seqs) != 8 {
		t.Errorf("%d content events, want 8", len(seqs))
	}
	st := s.Gateway.stamp(t, "eg-stream-1")
	checkBrackets(t, s.Gateway.AdminURL, r, seqs, false)
	if st.Pool != "pool-a" || st.CompletionTokens != 8 || st.TokenSource != "usage" || st.Decision != "allow" || st.Principal == "" || !st.Complete {
		t.Errorf("stamp %+v", st)
	}

	// Policies: no key, a forbidden model.
	for _, c := range []struct {
		call   call
		status int
		code   string
	}{
		{chatCall("", "llama", 4), 401, "invalid_api_key"},
		{chatCall("sk-acme-0001", "forbidden", 4), 403, "permission_denied"},
	} {
		resp, e := c.call.do(t, s.URL)
		if resp.StatusCode != c.status || e.Error.Code != c.code {
			t.Errorf("%s/%s: %d %+v, want %d %s", c.call.key, c.call.body[:30], resp.StatusCode, e.Error, c.status, c.code)
		}
	}

	// Longer than Envoy Gateway's 10 s ext_proc timeout: whole, and stamped complete.
	long := map[string]string{"authorization": "Bearer sk-acme-0001", "x-mock-ttft-ms": "50", "x-mock-itl-ms": "100",
		"x-request-id": "eg-long-1"}
	lr := stream(t, s.URL+"/v1/chat/completions", chatBody("llama", 110, true, ""), long)
	lw := stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", chatBody("llama", 110, true, `,"stream_options":{"include_usage":true}`), long)
	if want := unasked(t, lw).Body; lr.Status != 200 || !bytes.Equal(lr.Body, want) {
		t.Fatalf("11 s stream: %d, %d bytes, want the mock's %d less its usage event", lr.Status, len(lr.Body), len(want))
	}
	if ls := s.Gateway.stamp(t, "eg-long-1"); !ls.Complete || ls.CompletionTokens != 110 || ls.TokenSource != "usage" || ls.E2Ems < 10_000 {
		t.Errorf("11 s stream's stamp: complete %v, %d tokens (%s), %.0f ms", ls.Complete, ls.CompletionTokens, ls.TokenSource, ls.E2Ems)
	}

	// The weight sink: pool-a slows down; the controller rewrites the
	// HTTPRoute; Envoy Gateway re-translates; traffic moves to pool-b.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				res := stream(t, s.URL+"/v1/chat/completions", chatBody("llama", 4, true, ""),
					map[string]string{"authorization": "Bearer sk-acme-0001", "x-mock-itl-ms": "5"})
				if res.Status != 200 && ctx.Err() == nil {
					t.Errorf("under load: %d %s", res.Status, res.Body)
					return
				}
			}
		})
	}
	loaded := s.PoolA.Served()
	testutil.Eventually(t, 20*time.Second, func() bool { return s.PoolA.Served()-loaded >= 20 }, "20 requests served under load")
	setTTFT(t, s.PoolA, "400")
	slowed := time.Now()
	testutil.Eventually(t, 20*time.Second, func() bool {
		b, _ := os.ReadFile(s.routesFile)
		return strings.Contains(string(b), "name: pool-b, weight: 100}") || strings.Contains(string(b), "name: pool-b, weight: 98}")
	}, "the controller to rewrite the HTTPRoute's weights")
	rewritten := time.Now()
	before := s.PoolB.Served()
	testutil.Eventually(t, 20*time.Second, func() bool { return s.PoolB.Served() > before+20 }, "traffic to reach pool-b")
	cancel()
	wg.Wait()
	t.Logf("HTTPRoute rewritten %v after pool-a slowed down; pool-b serving %v later",
		rewritten.Sub(slowed).Round(time.Millisecond), time.Since(rewritten).Round(time.Millisecond))
}
