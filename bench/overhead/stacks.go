package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"gopkg.in/yaml.v3"
)

// The API key the load sends on every path (direct and plain Envoy ignore
// it); its tenant is added to the example policies' data with a budget no
// run can exhaust, so the limits are checked and charged but never deny.
const (
	benchKey    = "sk-overhead-bench"
	benchTenant = "overhead"
)

// stack is one gateway under test: Envoy alone, or Envoy with infergate.
type stack struct {
	name      string
	url       string // Envoy's listener
	envoy     *proc
	infergate *proc  // nil for plain Envoy
	admin     string // infergate's admin base URL
}

func (s *stack) procs() []*proc {
	if s.infergate == nil {
		return []*proc{s.envoy}
	}
	return []*proc{s.envoy, s.infergate}
}

func (s *stack) stop() {
	if s == nil {
		return
	}
	s.envoy.stop()
	s.infergate.stop()
}

// gatewaySpec says how a gateway stack differs from the default one.
type gatewaySpec struct {
	envoy     func(doc map[string]any) error // edits the rendered envoy/overhead.yaml
	infergate func(cfg map[string]any)       // edits infergate's config
	unix      bool                           // ext_proc over a Unix domain socket
	cpus      string                         // infergate's CPUs, when not the gateway's
	env       []string                       // added to infergate's environment
	bin       string                         // infergate's binary, when not the measured one
	// module: the gate and the meter run inside Envoy as the dynamic
	// module (variant "module"): no infergate process; envoyEnv is added
	// to Envoy's environment (GODEBUG, the module's search path).
	module   bool
	envoyEnv []string
}

// startMock runs `infergate-bench mock --profile board` on the client CPUs.
func (h *harness) startMock() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	p, err := startProc(h.work, "mock", h.opts.ClientCPUs, nil, h.opts.Mock,
		"mock", "--profile", "board", "--listen", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	h.mock, h.mockPort = p, port
	return p.waitReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
}

// startPlain runs Envoy without infergate (envoy/overhead-plain.yaml).
func (h *harness) startPlain(name string) (*stack, error) {
	return h.startEnvoy(name, "envoy/overhead-plain.yaml", map[string]string{}, nil, nil, nil)
}

// startGateway runs infergate and an Envoy with its filters
// (envoy/overhead.yaml), both on the gateway CPUs.
func (h *harness) startGateway(name string, spec gatewaySpec) (*stack, error) {
	extproc, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	listen := "127.0.0.1:" + strconv.Itoa(extproc)
	sock := filepath.Join(h.work, name+".sock")
	if spec.unix {
		listen = "unix:" + sock
	}
	adminCfg := map[string]any{"listen": "127.0.0.1:" + strconv.Itoa(admin)}
	if h.opts.ProfileDir != "" {
		adminCfg["pprof"] = true
	}
	cfg := map[string]any{
		"extproc": map[string]any{"listen": listen},
		"admin":   adminCfg,
		"auth":    map[string]any{"keys": h.keysFile},
		"policy":  map[string]any{"dir": h.policyDir},
		"log":     map[string]any{"level": "warn"},
		// The baseline's limiter (serve's default is the embedded ledger,
		// one fsync per admission): variants change it.
		"ratelimit": map[string]any{"backend": "memory"},
	}
	if spec.infergate != nil {
		spec.infergate(cfg)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(h.work, name+"-infergate.yaml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return nil, err
	}
	if spec.module { // the same configuration file, read by the module in Envoy
		return h.startEnvoy(name, "envoy/overhead.yaml", map[string]string{"EXTPROC_PORT": strconv.Itoa(extproc)}, spec.envoy, nil, spec.envoyEnv)
	}
	cpus := cmp.Or(spec.cpus, h.opts.InfergateCPUs, h.opts.GatewayCPUs)
	ig, err := startProc(h.work, name+"-infergate", cpus, append(slices.Clone(h.opts.InfergateEnv), spec.env...), cmp.Or(spec.bin, h.infergateBin), "serve", "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	adminURL := "http://127.0.0.1:" + strconv.Itoa(admin)
	if err := ig.waitReady(adminURL + "/readyz"); err != nil {
		ig.stop()
		return nil, err
	}
	edit := spec.envoy
	if spec.unix {
		edit = chain(edit, func(doc map[string]any) error {
			ep, err := dig(doc, "static_resources", "clusters", clusterIndex(doc, "infergate"), "load_assignment",
				"endpoints", 0, "lb_endpoints", 0, "endpoint")
			if err != nil {
				return err
			}
			ep.(map[string]any)["address"] = map[string]any{"pipe": map[string]any{"path": sock}}
			return nil
		})
	}
	st, err := h.startEnvoy(name, "envoy/overhead.yaml", map[string]string{"EXTPROC_PORT": strconv.Itoa(extproc)}, edit, ig, spec.envoyEnv)
	if err != nil {
		ig.stop()
		return nil, err
	}
	st.admin = adminURL
	return st, nil
}

// startEnvoy renders an envoy/ template, applies edit, and runs Envoy with
// one worker thread on the gateway CPUs.
func (h *harness) startEnvoy(name, template string, vars map[string]string, edit func(map[string]any) error, ig *proc, env []string) (*stack, error) {
	listen, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	vars["LISTEN_PORT"], vars["ADMIN_PORT"], vars["POOL_A_PORT"] = strconv.Itoa(listen), strconv.Itoa(admin), strconv.Itoa(h.mockPort)
	rendered, err := render(filepath.Join(h.opts.Root, template), vars)
	if err != nil {
		return nil, err
	}
	if h.opts.AccessLog { // Envoy's own timings per request, for looking into a number
		logPath := filepath.Join(h.work, name+"-access.log")
		edit = chain(edit, func(doc map[string]any) error {
			hcm, err := dig(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
			if err != nil {
				return err
			}
			hcm.(map[string]any)["access_log"] = []any{map[string]any{
				"name": "envoy.access_loggers.file",
				"typed_config": map[string]any{
					"@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
					"path":  logPath,
					"log_format": map[string]any{"text_format_source": map[string]any{"inline_string": "%START_TIME% rx_end=%COMMON_DURATION(DS_RX_BEG:DS_RX_END:us)% " +
						"us_tx_beg=%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)% us_rx_beg=%COMMON_DURATION(DS_RX_BEG:US_RX_BEG:us)% " +
						"ds_tx_beg=%COMMON_DURATION(DS_RX_BEG:DS_TX_BEG:us)% total=%DURATION% %RESPONSE_CODE%\n"}},
				},
			}}
			return nil
		})
	}
	if edit != nil {
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(rendered), &doc); err != nil {
			return nil, err
		}
		if err := edit(doc); err != nil {
			return nil, fmt.Errorf("%s: editing %s: %w", name, template, err)
		}
		b, err := yaml.Marshal(doc)
		if err != nil {
			return nil, err
		}
		rendered = string(b)
	}
	cfgPath := filepath.Join(h.work, name+"-envoy.yaml")
	if err := os.WriteFile(cfgPath, []byte(rendered), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc(h.work, name+"-envoy", h.opts.GatewayCPUs, env, h.envoyBin,
		"-c", cfgPath, "--concurrency", "1", "--disable-hot-restart", "-l", "warning")
	if err != nil {
		return nil, err
	}
	if err := p.waitReady(fmt.Sprintf("http://127.0.0.1:%d/ready", admin)); err != nil {
		p.stop()
		return nil, err
	}
	st := &stack{name: name, url: "http://127.0.0.1:" + strconv.Itoa(listen), envoy: p, infergate: ig}
	if err := probe(st.url, nil); err != nil {
		p.stop()
		return nil, fmt.Errorf("%s: %w; envoy log:\n%s", name, err, p.tail())
	}
	return st, nil
}

// probe sends one request, with headers, and wants a 200: routes, keys and
// policies work.
func probe(base string, headers map[string]string) error {
	var err error
	for range 50 { // the listener may take a moment after /ready
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			bytes.NewReader([]byte(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"probe"}]}`)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+benchKey)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			return fmt.Errorf("probe request: HTTP %d: %s", resp.StatusCode, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("probe request: %w", err)
}

// render fills a template's ${NAME} placeholders; an unknown one is an error.
func render(path string, vars map[string]string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var missing []string
	out := os.Expand(string(b), func(k string) string {
		v, ok := vars[k]
		if !ok {
			missing = append(missing, k)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%s: unfilled placeholders %v", path, missing)
	}
	return out, nil
}

// dig walks a decoded YAML document by map keys and slice indices.
func dig(v any, path ...any) (any, error) {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok || m[k] == nil {
				return nil, fmt.Errorf("no %q", k)
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k < 0 || k >= len(s) {
				return nil, fmt.Errorf("no [%d]", k)
			}
			v = s[k]
		}
	}
	return v, nil
}

func clusterIndex(doc map[string]any, name string) int {
	cs, _ := dig(doc, "static_resources", "clusters")
	s, _ := cs.([]any)
	for i, c := range s {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return i
		}
	}
	return -1
}

// filterConfig returns the typed_config of the HTTP filter called name.
func filterConfig(doc map[string]any, name string) (map[string]any, error) {
	fs, err := dig(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "http_filters")
	if err != nil {
		return nil, err
	}
	for _, f := range fs.([]any) {
		if m, ok := f.(map[string]any); ok && m["name"] == name {
			tc, _ := m["typed_config"].(map[string]any)
			if tc != nil {
				return tc, nil
			}
		}
	}
	return nil, fmt.Errorf("no http filter %s", name)
}

func chain(fs ...func(map[string]any) error) func(map[string]any) error {
	return func(doc map[string]any) error {
		for _, f := range fs {
			if f == nil {
				continue
			}
			if err := f(doc); err != nil {
				return err
			}
		}
		return nil
	}
}

// writePolicies copies the example policies (policies/*.rego, their tests
// included: infergate runs them at load) and their data, plus the bench
// tenant on a tier like premium with budgets no run can exhaust; and the
// bench key file.
func (h *harness) writePolicies() error {
	src := filepath.Join(h.opts.Root, "policies")
	h.policyDir = filepath.Join(h.work, "policies")
	if err := os.MkdirAll(h.policyDir, 0o755); err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(src, "*.rego"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no policies in %s", src)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(h.policyDir, filepath.Base(f)), b, 0o644); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(filepath.Join(src, "data.yaml"))
	if err != nil {
		return err
	}
	var data map[string]any
	if err := yaml.Unmarshal(b, &data); err != nil {
		return err
	}
	ig, _ := dig(data, "infergate")
	m, ok := ig.(map[string]any)
	if !ok {
		return errors.New("policies/data.yaml: no infergate key")
	}
	premium, _ := dig(m, "tiers", "premium")
	tier := map[string]any{}
	for k, v := range premium.(map[string]any) {
		tier[k] = v
	}
	tier["requests_per_minute"], tier["tokens_per_minute"], tier["output_tokens_per_hour"] = 1_000_000_000, 1_000_000_000_000, 1_000_000_000_000
	m["tiers"].(map[string]any)[benchTenant] = tier
	m["tenants"].(map[string]any)[benchTenant] = map[string]any{"tier": benchTenant}
	if b, err = yaml.Marshal(data); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.policyDir, "data.yaml"), b, 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(benchKey))
	keys := fmt.Sprintf("keys:\n- {id: %s, sha256: %s, tenant: %s}\n", benchTenant, hex.EncodeToString(sum[:]), benchTenant)
	h.keysFile = filepath.Join(h.work, "keys.yaml")
	return os.WriteFile(h.keysFile, []byte(keys), 0o644)
}

// otlpSink is an OTLP/gRPC trace receiver that counts and drops spans: the
// tracing variant's collector, on the client CPUs with the harness.
type otlpSink struct {
	coltracepb.UnimplementedTraceServiceServer
	spans atomic.Int64
	addr  string
	srv   *grpc.Server
}

func startOTLPSink() (*otlpSink, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{addr: lis.Addr().String(), srv: grpc.NewServer()}
	coltracepb.RegisterTraceServiceServer(s.srv, s)
	go s.srv.Serve(lis)
	return s, nil
}

func (s *otlpSink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			s.spans.Add(int64(len(ss.GetSpans())))
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startRedis runs a throwaway redis-server, found the way
// scripts/install-test-deps.sh finds it: $REDIS_SERVER, else redis-server on
// PATH, else Debian's package installed with apt-get when running as root.
func (h *harness) startRedis() (*proc, string, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			if _, aptErr := exec.LookPath("apt-get"); aptErr != nil || os.Geteuid() != 0 {
				return nil, "", errors.New("redis-server not found: install it (Debian: sudo apt-get install redis-server) or set REDIS_SERVER")
			}
			h.logf("installing Debian's redis-server with apt-get")
			for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "redis-server"}} {
				cmd := exec.Command("apt-get", args...)
				cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
				if out, err := cmd.CombinedOutput(); err != nil {
					return nil, "", fmt.Errorf("apt-get %v: %w\n%s", args, err, out)
				}
			}
			_ = exec.Command("service", "redis-server", "stop").Run() // the tests run their own
			if bin, err = exec.LookPath("redis-server"); err != nil {
				return nil, "", err
			}
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	// The limiter's backend is shared infrastructure, not the gateway: it
	// runs on the client CPUs.
	p, err := startProc(h.work, "redis", h.opts.ClientCPUs, nil, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", h.work)
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := p.WaitReady(10*time.Second, func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("redis-server did not start: %w", err)
	}
	return p, addr, nil
}
