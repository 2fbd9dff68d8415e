package config

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/xds/controller"
)

// defaults is the configuration documented in default.yaml, spelled out so
// that the code defaults and the embedded file cannot drift together.
func defaults() *Config {
	return &Config{
		ExtProc: ExtProc{Listen: "127.0.0.1:50051", MaxConcurrentStreams: 10000, MaxGateStreamsPerPeer: 4096, MaxWaitingBodiesPerPrincipal: 256},
		Admin:   Admin{Listen: "127.0.0.1:9090", RecentRequests: ptr(1000)},
		Gate: Gate{
			MaxBodyBytes:    1 << 20,
			BodyTimeout:     30 * time.Second,
			InjectUsage:     ptr(true),
			ChatOutputLimit: "max_tokens",
			Paths:           []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"},
		},
		Meter: Meter{MaxEventBytes: 1 << 20, MaxTrackedGaps: 16384},
		Auth: Auth{
			JWT: JWT{Namespace: "envoy.filters.http.jwt_authn", PayloadKey: "jwt_payload",
				TenantClaim: "tenant", LabelClaims: []string{"tier"}},
			PolicyHeaders: []string{"user-agent", "x-request-id"},
		},
		Policy:           Policy{ReloadInterval: time.Second, Memoize: ptr(true)},
		RateLimit:        RateLimit{Backend: "embedded", Embedded: Embedded{Path: DefaultLedgerPath}, OnBackendError: "deny", DefaultMaxTokens: 1024, Redis: Redis{Mode: "standalone", Addresses: []string{}, Timeout: 250 * time.Millisecond}},
		Reservations:     defaultReservations,
		Checks:           map[string]Check{},
		Models:           []string{},
		VirtualModels:    []VirtualModel{},
		XDS:              XDS{Listen: "127.0.0.1:18000", RouteConfigName: "infergate"},
		WeightSink:       WeightSink{Type: "xds"},
		GatewayExtension: GatewayExtension{ClusterDomain: "cluster.local", EndpointPickerTLS: ptr(true)},
		Tracing:          Tracing{Protocol: "grpc", SampleRatio: 1, QueueSize: 4096},
		Log:              Log{Level: "info", Format: "json", Requests: ptr(true)},
		PoolModels:       defaultPoolModels,
		Prices:           Prices{Currency: "USD", Models: map[string]ModelPrice{}},
	}
}

var defaultPoolModels = PoolModels{Pools: []ModelsPool{}, Interval: 30 * time.Second, KeepFor: 5 * time.Minute, Timeout: 5 * time.Second}

var defaultReservations = Reservations{LongestStream: time.Hour, MaxAge: 25 * time.Hour, KeyRotation: 24 * time.Hour, KeyRefresh: time.Minute, MaxSettled: 1 << 20, MaxSettledPerTenant: 1 << 16}

func mustParse(t *testing.T, doc []byte) *Config {
	t.Helper()
	c, err := Parse(doc)
	if err != nil {
		t.Fatalf("Parse(%q): %v", doc, err)
	}
	return c
}

func assertConfig(t *testing.T, got, want *Config) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config:\n got %s\nwant %s", dump(got), dump(want))
	}
}

// dump prints a config with its pointers dereferenced.
func dump(c *Config) string {
	if c == nil {
		return "<nil>"
	}
	b := func(p *bool) string {
		if p == nil {
			return "<nil>"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("extproc=%+v admin=%+v gate={MaxBodyBytes:%d InjectUsage:%s ChatOutputLimit:%q Paths:%q} meter=%+v auth=%+v policy=%+v memoize=%s ratelimit=%+v reservations=%+v checks=%+v models=%q virtualModels=%+v xds=%+v weightSink=%+v gatewayExtension={Enabled:%t Policy:%+v ClusterDomain:%q EndpointPickerTLS:%s} tracing=%+v log={Level:%q Format:%q Requests:%s} poolModels=%+v prices=%+v",
		c.ExtProc, c.Admin, c.Gate.MaxBodyBytes, b(c.Gate.InjectUsage), c.Gate.ChatOutputLimit, c.Gate.Paths, c.Meter, c.Auth, c.Policy, b(c.Policy.Memoize), c.RateLimit, c.Reservations, c.Checks, c.Models, c.VirtualModels, c.XDS, c.WeightSink, c.GatewayExtension.Enabled, c.GatewayExtension.Policy, c.GatewayExtension.ClusterDomain, b(c.GatewayExtension.EndpointPickerTLS), c.Tracing, c.Log.Level, c.Log.Format, b(c.Log.Requests), c.PoolModels, c.Prices)
}

func TestDefaultMatchesCode(t *testing.T) {
	fromFile := mustParse(t, Default)
	assertConfig(t, fromFile, defaults())
	for _, doc := range []string{"", "\n", "# only a comment\n", "{}", "~", "---\n"} {
		assertConfig(t, mustParse(t, []byte(doc)), fromFile)
	}
	loaded, err := Load("")
	if err != nil {
		t.Fatalf("Load(\"\"): %v", err)
	}
	assertConfig(t, loaded, fromFile)
}

// TestDefaultFileSetsEveryKey checks default.yaml spells out every key, so it
// really documents all the defaults: decoding it without fillDefaults must
// leave no field at its zero value.
func TestDefaultFileSetsEveryKey(t *testing.T) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(Default))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	assertConfig(t, &c, defaults())
}

func TestValidFile(t *testing.T) {
	yes := true
	want := &Config{
		ExtProc: ExtProc{Listen: "127.0.0.1:6000", MaxConcurrentStreams: 512, MaxGateStreamsPerPeer: 64, MaxWaitingBodiesPerPrincipal: 8, TLS: TLS{
			CertFile: "/etc/infergate/tls/tls.crt", KeyFile: "/etc/infergate/tls/tls.key", ClientCAFile: "/etc/infergate/tls/ca.crt"},
			InsecureOpenToNetwork: true},
		Admin: Admin{Listen: "[::1]:9191", OpenToNetwork: true, RecentRequests: ptr(50), Pprof: true,
			Debug: Debug{Enabled: true, TokenFile: "/etc/infergate/debug/token"}},
		Gate: Gate{
			MaxBodyBytes:    64 << 20,
			BodyTimeout:     time.Minute,
			InjectUsage:     ptr(false),
			ChatOutputLimit: "max_completion_tokens",
			Paths:           []string{"/v1/chat/completions", "/openai/v1/responses"},
		},
		Meter: Meter{MaxEventBytes: 1024, MaxTrackedGaps: 100, Wasm: true},
		Auth: Auth{
			Keys: "/etc/infergate/keys",
			JWT: JWT{Enabled: true, Namespace: "jwt", PayloadKey: "claims", TenantClaim: "org",
				LabelClaims: []string{"tier", "team"}},
			PolicyHeaders: []string{"user-agent"},
		},
		Policy: Policy{Dir: "/etc/infergate/policies", ReloadInterval: 2 * time.Second, Shadow: true, Memoize: ptr(false)},
		RateLimit: RateLimit{Backend: "redis", Embedded: Embedded{Path: DefaultLedgerPath}, OnBackendError: "local", DefaultMaxTokens: 1024, Redis: Redis{Mode: "standalone", Address: "redis:6379", Addresses: []string{},
			Username: "infergate", PasswordFile: "/etc/infergate/redis-password", DB: 2, Timeout: 100 * time.Millisecond}},
		Reservations: Reservations{LongestStream: 2 * time.Hour, MaxAge: 50 * time.Hour, KeyRotation: 12 * time.Hour, KeyRefresh: 30 * time.Second, MaxSettled: 1000, MaxSettledPerTenant: 62},
		Checks:       map[string]Check{"moderation": {URL: "http://moderation.svc:8080/check", Timeout: 300 * time.Millisecond, OnError: "allow"}},
		Models:       []string{"llama-3.1-8b-instruct", "meta-llama/Llama-3.1-70B-Instruct"},
		VirtualModels: []VirtualModel{{
			Name:  "llama-3-70b",
			Pools: []PoolRef{{Cluster: "pool-a", Priority: 0, Metrics: []string{"http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"}}, {Cluster: "pool-b", Priority: 1}},
			SLA:   controller.SLA{TTFTP95: 300 * time.Millisecond, ITLP95: 50 * time.Millisecond, ErrorRate: 0.05, QueueDepth: 16},
			Tuning: controller.Tuning{Window: 20 * time.Second, MinSamples: 10, Interval: 2 * time.Second, Step: 20, Hysteresis: 0.3,
				Cooldown: 10 * time.Second, ProbeWeight: 2, PrefillPerToken: time.Millisecond},
			Retry: &RetryRule{Attempts: 1, On: "5xx,reset,retriable-status-codes", StatusCodes: []uint32{429}, AcrossPools: &yes},
		}},
		XDS: XDS{Listen: "127.0.0.1:18001", RouteConfigName: "llm", InsecureOpenToNetwork: true,
			TLS: TLS{CertFile: "/etc/infergate/xds/tls.crt", KeyFile: "/etc/infergate/xds/tls.key", ClientCAFile: "/etc/infergate/xds/ca.crt"}},
		WeightSink: WeightSink{Type: "httpRouteFile", HTTPRoute: HTTPRouteFile{File: "/etc/eg/routes.yaml", Namespace: "llm", Name: "chat"}},
		GatewayExtension: GatewayExtension{Enabled: true, Policy: Resource{Namespace: "llm", Name: "infergate"},
			ClusterDomain: "cluster.example", EndpointPickerTLS: ptr(false)},
		Tracing: Tracing{Endpoint: "otel-collector:4318", Protocol: "http", Insecure: true, SampleRatio: 0.25,
			QueueSize: 100, TraceURL: "http://jaeger:16686/trace/{trace_id}"},
		Log:        Log{Level: "debug", Format: "text", Requests: ptr(false)},
		PoolModels: defaultPoolModels,
		Prices: Prices{Currency: "EUR", Models: map[string]ModelPrice{
			"llama-3-70b": {Price: Price{Input: "0.15", CachedInput: "0.075", Output: "0.6"},
				Pools: map[string]Price{"pool-b": {Input: "0.30", Output: "1.2"}}},
		}},
	}
	c, err := Load(filepath.Join("testdata", "valid.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	assertConfig(t, c, want)
}

func TestParsePartial(t *testing.T) {
	tests := []struct {
		name   string
		doc    string
		modify func(*Config) // applied to defaults() to get the expected config
	}{
		{
			name:   "one key, the rest defaulted",
			doc:    "gate:\n  maxBodyBytes: 2048\n",
			modify: func(c *Config) { c.Gate.MaxBodyBytes = 2048 },
		},
		{
			name:   "explicit false is kept",
			doc:    "gate:\n  injectUsage: false\nlog:\n  requests: false\n",
			modify: func(c *Config) { c.Gate.InjectUsage, c.Log.Requests = ptr(false), ptr(false) },
		},
		{
			name:   "empty paths list is kept, not defaulted",
			doc:    "gate:\n  paths: []\n",
			modify: func(c *Config) { c.Gate.Paths = []string{} },
		},
		{
			name:   "null paths are defaulted",
			doc:    "gate:\n  paths: ~\n",
			modify: func(c *Config) {},
		},
		{
			name: "pool models",
			doc:  "poolModels:\n  pools: [{name: pool-a, url: \"https://vllm:8000/v1/models\", apiKeyFile: /run/key}]\n  interval: 1s\n  keepFor: 1s\n  timeout: 1s\n",
			modify: func(c *Config) {
				c.PoolModels = PoolModels{Pools: []ModelsPool{{Name: "pool-a", URL: "https://vllm:8000/v1/models", APIKeyFile: "/run/key"}},
					Interval: time.Second, KeepFor: time.Second, Timeout: time.Second}
			},
		},
		{
			name:   "empty section",
			doc:    "meter:\nlog: {}\n",
			modify: func(c *Config) {},
		},
		{
			name:   "bounds are inclusive",
			doc:    "gate:\n  maxBodyBytes: 1\nmeter:\n  maxEventBytes: 1024\n  maxTrackedGaps: 1\n",
			modify: func(c *Config) { c.Gate.MaxBodyBytes, c.Meter.MaxEventBytes, c.Meter.MaxTrackedGaps = 1, 1024, 1 },
		},
		{
			name:   "upper bound of maxBodyBytes",
			doc:    "gate:\n  maxBodyBytes: 67108864\n",
			modify: func(c *Config) { c.Gate.MaxBodyBytes = 64 << 20 },
		},
		{
			// An explicit 0 cannot be told from an absent key: it means
			// "use the default", not "invalid".
			name:   "explicit zero means the default",
			doc:    "extproc:\n  maxConcurrentStreams: 0\n  maxGateStreamsPerPeer: 0\ngate:\n  maxBodyBytes: 0\nmeter:\n  maxEventBytes: 0\n  maxTrackedGaps: 0\n",
			modify: func(c *Config) {},
		},
		{
			name:   "explicit empty strings mean the default",
			doc:    "extproc:\n  listen: \"\"\nadmin:\n  listen: \"\"\nlog:\n  level: \"\"\n  format: \"\"\n",
			modify: func(c *Config) {},
		},
		{
			name: "IPv6 loopback listen addresses",
			doc:  "extproc:\n  listen: \"[::1]:50051\"\nadmin:\n  listen: \"[::1]:9090\"\nxds:\n  listen: \"127.9.9.9:18000\"\n",
			modify: func(c *Config) {
				c.ExtProc.Listen, c.Admin.Listen, c.XDS.Listen = "[::1]:50051", "[::1]:9090", "127.9.9.9:18000"
			},
		},
		{
			name: "beyond loopback with the explicit opt-ins",
			doc: "extproc:\n  listen: \"localhost:50051\"\n  insecureOpenToNetwork: true\nadmin:\n  listen: \"[::]:9090\"\n  openToNetwork: true\n" +
				"xds:\n  listen: \":18000\"\n  insecureOpenToNetwork: true\n",
			modify: func(c *Config) {
				c.ExtProc.Listen, c.Admin.Listen, c.XDS.Listen = "localhost:50051", "[::]:9090", ":18000"
				c.ExtProc.InsecureOpenToNetwork, c.Admin.OpenToNetwork, c.XDS.InsecureOpenToNetwork = true, true, true
			},
		},
		{
			name: "beyond loopback with mTLS, and debug pages behind a token",
			doc: "extproc:\n  listen: \":50051\"\n  tls: {certFile: /t/tls.crt, keyFile: /t/tls.key, clientCAFile: /t/ca.crt}\n" +
				"xds:\n  listen: \"0.0.0.0:18000\"\n  tls: {certFile: /x/tls.crt, keyFile: /x/tls.key, clientCAFile: /x/ca.crt}\n" +
				"admin:\n  listen: \":9090\"\n  openToNetwork: true\n  pprof: true\n  debug: {enabled: true, tokenFile: /d/token}\n",
			modify: func(c *Config) {
				c.ExtProc.Listen, c.XDS.Listen, c.Admin.Listen = ":50051", "0.0.0.0:18000", ":9090"
				c.ExtProc.TLS = TLS{CertFile: "/t/tls.crt", KeyFile: "/t/tls.key", ClientCAFile: "/t/ca.crt"}
				c.XDS.TLS = TLS{CertFile: "/x/tls.crt", KeyFile: "/x/tls.key", ClientCAFile: "/x/ca.crt"}
				c.Admin.OpenToNetwork, c.Admin.Pprof, c.Admin.Debug = true, true, Debug{Enabled: true, TokenFile: "/d/token"}
			},
		},
		{
			name:   "debug pages on loopback need no token",
			doc:    "admin: {debug: {enabled: true}}\n",
			modify: func(c *Config) { c.Admin.Debug.Enabled = true },
		},
		{
			name:   "ext_proc on a Unix domain socket",
			doc:    "extproc:\n  listen: unix:/run/infergate/extproc.sock\n",
			modify: func(c *Config) { c.ExtProc.Listen = "unix:/run/infergate/extproc.sock" },
		},
		{
			name: "mTLS on the ext_proc port",
			doc:  "extproc:\n  tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, clientCAFile: /tls/ca.crt}\n",
			modify: func(c *Config) {
				c.ExtProc.TLS = TLS{CertFile: "/tls/tls.crt", KeyFile: "/tls/tls.key", ClientCAFile: "/tls/ca.crt"}
			},
		},
		{
			name:   "an empty tls section is plaintext",
			doc:    "extproc:\n  tls: {}\n",
			modify: func(c *Config) {},
		},
		{
			name: "a Redis Cluster",
			doc:  "ratelimit:\n  backend: redis\n  redis:\n    mode: cluster\n    addresses: [redis-0:6379, \"[fd00::1]:6379\"]\n    hashTag: budgets\n",
			modify: func(c *Config) {
				c.RateLimit.Backend = "redis"
				c.RateLimit.Redis.Mode = "cluster"
				c.RateLimit.Redis.Addresses = []string{"redis-0:6379", "[fd00::1]:6379"}
				c.RateLimit.Redis.HashTag = "budgets"
			},
		},
		{
			name: "a Redis Cluster with the default hash tag",
			doc:  "ratelimit:\n  backend: redis\n  redis: {mode: cluster, addresses: [redis-0:6379]}\n",
			modify: func(c *Config) {
				c.RateLimit.Backend = "redis"
				c.RateLimit.Redis.Mode = "cluster"
				c.RateLimit.Redis.Addresses = []string{"redis-0:6379"}
			},
		},
		{
			name:   "a cluster's addresses are not checked with the memory backend",
			doc:    "ratelimit:\n  redis: {mode: cluster}\n",
			modify: func(c *Config) { c.RateLimit.Redis.Mode = "cluster" },
		},
		{
			name:   "profiler on the admin port",
			doc:    "admin: {pprof: true}\n",
			modify: func(c *Config) { c.Admin.Pprof = true },
		},
		{
			name:   "document start marker",
			doc:    "---\nlog:\n  format: text\n",
			modify: func(c *Config) { c.Log.Format = "text" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := defaults()
			tt.modify(want)
			assertConfig(t, mustParse(t, []byte(tt.doc)), want)
		})
	}
}

// TestParseReturnsFreshValues checks configs do not share the default
// slices and pointers: mutating one must not leak into the next.
func TestParseReturnsFreshValues(t *testing.T) {
	a := mustParse(t, nil)
	a.Gate.Paths[0] = "/mutated"
	*a.Gate.InjectUsage = false
	*a.Policy.Memoize = false
	*a.Log.Requests = false
	assertConfig(t, mustParse(t, nil), defaults())
}

// Each testdata/invalid/*.yaml starts with "# want: <substring>", a part of
// the error Parse must return, including the line of the culprit.
func TestInvalidFiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no fixtures in testdata/invalid")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			doc, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := bytes.Cut(doc, []byte("\n"))
			want, ok := strings.CutPrefix(string(first), "# want: ")
			if !ok || !strings.Contains(want, "line ") {
				t.Fatalf("fixture must start with %q and name a line, got %q", "# want: ... line N ...", first)
			}
			c, err := Parse(doc)
			if err == nil {
				t.Fatalf("Parse succeeded with %s, want an error containing %q", dump(c), want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Parse error\n got %q\nwant it to contain %q", err, want)
			}
			if c != nil {
				t.Errorf("Parse returned a config with the error")
			}
			// Load adds the file name in front.
			_, err = Load(file)
			if err == nil || !strings.HasPrefix(err.Error(), file+": ") || !strings.Contains(err.Error(), want) {
				t.Errorf("Load error = %v, want %q then %q", err, file+": ", want)
			}
		})
	}
}

// Only an IP literal in 127.0.0.0/8 or ::1 is loopback: a host name may
// resolve elsewhere, an empty or unspecified host is every interface.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:50051": true, "127.1.2.3:1": true, "[::1]:9090": true, "[::ffff:127.0.0.1]:1": true,
		":50051": false, "0.0.0.0:1": false, "[::]:1": false, "localhost:1": false, "10.0.0.5:1": false,
		"[fe80::1%lo]:1": false, "infergate.svc:1": false, "127.0.0.1": false, "unix:/run/s.sock": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	if _, err := Load(path); !os.IsNotExist(err) {
		t.Errorf("Load(%q) error = %v, want a not-exist error", path, err)
	}
}

func TestErrorWithoutLine(t *testing.T) {
	e := &Error{Path: "gate.paths", Msg: "bad"}
	if got, want := e.Error(), "gate.paths: bad"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e.Line = 7
	if got, want := e.Error(), "line 7: gate.paths: bad"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Default)
	f.Add([]byte(""))
	f.Add([]byte("gate:\n  paths: []\n"))
	f.Add([]byte("extproc: {listen: \"[::1]:1\", maxConcurrentStreams: 1}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("gate: !!map {maxBodyBytes: 0x10}\n"))
	f.Add([]byte("\t- : ]"))
	for _, pattern := range []string{"testdata/*.yaml", "testdata/invalid/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			if b, err := os.ReadFile(file); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := Parse(doc)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse(%q) returned a config with error %v", doc, err)
			}
			if err.Error() == "" {
				t.Fatalf("Parse(%q): empty error message", doc)
			}
			return
		}
		checkBounds(t, c)
	})
}

// checkBounds asserts the invariants validate documents for a parsed config.
func checkBounds(t *testing.T, c *Config) {
	t.Helper()
	for _, addr := range []string{c.ExtProc.Listen, c.Admin.Listen} {
		if addr == c.ExtProc.Listen && validUnix(addr) {
			continue
		}
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			t.Errorf("listen address %q is not host:port", addr)
		}
	}
	if c.ExtProc.MaxConcurrentStreams == 0 || c.ExtProc.MaxGateStreamsPerPeer == 0 {
		t.Errorf("extproc.maxConcurrentStreams = %d, maxGateStreamsPerPeer = %d", c.ExtProc.MaxConcurrentStreams, c.ExtProc.MaxGateStreamsPerPeer)
	}
	if !validUnix(c.ExtProc.Listen) && !Loopback(c.ExtProc.Listen) && !c.ExtProc.TLS.Enabled() && !c.ExtProc.InsecureOpenToNetwork {
		t.Errorf("extproc.listen %q: plaintext beyond loopback without the opt-in", c.ExtProc.Listen)
	}
	if !Loopback(c.XDS.Listen) && !c.XDS.TLS.Enabled() && !c.XDS.InsecureOpenToNetwork {
		t.Errorf("xds.listen %q: plaintext beyond loopback without the opt-in", c.XDS.Listen)
	}
	if !Loopback(c.Admin.Listen) && (!c.Admin.OpenToNetwork || c.Admin.ServesDebug() && c.Admin.Debug.TokenFile == "") {
		t.Errorf("admin %+v: beyond loopback without the opt-in, or debug pages without a token", c.Admin)
	}
	if tls := c.ExtProc.TLS; tls.Enabled() && (len(tls.missing()) > 0 || validUnix(c.ExtProc.Listen)) {
		t.Errorf("extproc.tls = %+v on %q: partial, or on a Unix socket", tls, c.ExtProc.Listen)
	}
	if c.Gate.MaxBodyBytes < 1 || c.Gate.MaxBodyBytes > 64<<20 {
		t.Errorf("gate.maxBodyBytes = %d out of [1, 64 MiB]", c.Gate.MaxBodyBytes)
	}
	if c.Gate.InjectUsage == nil || c.Log.Requests == nil || c.Policy.Memoize == nil {
		t.Errorf("booleans left unset: %s", dump(c))
	}
	if c.Gate.Paths == nil {
		t.Errorf("gate.paths left nil")
	}
	for _, p := range c.Gate.Paths {
		if !strings.HasPrefix(p, "/") {
			t.Errorf("gate.paths has %q", p)
		}
	}
	if c.Meter.MaxEventBytes < 1024 {
		t.Errorf("meter.maxEventBytes = %d < 1024", c.Meter.MaxEventBytes)
	}
	if c.Meter.MaxTrackedGaps < 1 {
		t.Errorf("meter.maxTrackedGaps = %d < 1", c.Meter.MaxTrackedGaps)
	}
	if r := c.RateLimit.Redis; !oneOf(r.Mode, "standalone", "cluster") || strings.ContainsAny(r.HashTag, "{}") ||
		(c.RateLimit.Backend == "redis" && r.Mode == "cluster" && (len(r.Addresses) == 0 || r.Address != "" || r.DB != 0)) ||
		(c.RateLimit.Backend == "redis" && r.Mode == "standalone" && (len(r.Addresses) != 0 || r.Address == "")) {
		t.Errorf("ratelimit = %+v", c.RateLimit)
	}
	if !oneOf(c.Log.Level, "debug", "info", "warn", "error") {
		t.Errorf("log.level = %q", c.Log.Level)
	}
	if !oneOf(c.Log.Format, "json", "text") {
		t.Errorf("log.format = %q", c.Log.Format)
	}
}

// recentRequests: 0 turns the ring off; absent keeps 1000.
func TestRecentRequestsZeroDisables(t *testing.T) {
	c, err := Parse([]byte("admin: {recentRequests: 0}\n"))
	if err != nil || *c.Admin.RecentRequests != 0 {
		t.Fatalf("recentRequests: 0 gave %v, %v", c.Admin.RecentRequests, err)
	}
	if c, _ := Parse(nil); *c.Admin.RecentRequests != 1000 {
		t.Fatalf("default %d, want 1000", *c.Admin.RecentRequests)
	}
}

func TestCatalog(t *testing.T) {
	c := mustParse(t, []byte("models: [b, a]\nvirtualModels:\n- {name: v, pools: [{cluster: pool-a}]}\n"))
	if got := c.Catalog(); !reflect.DeepEqual(got, []string{"b", "a", "v"}) {
		t.Errorf("Catalog() = %q, want models then virtual models in order", got)
	}
	if got := mustParse(t, nil).Catalog(); len(got) != 0 {
		t.Errorf("default Catalog() = %q, want none", got)
	}
}

// The seals' lifetimes and keys are range-checked: a seal must outlive
// the longest stream, keys rotate slower than they are re-read.
func TestReservationsValidated(t *testing.T) {
	for _, doc := range []string{
		"reservations: {longestStream: 1s}",
		"reservations: {longestStream: 2h, maxAge: 1h}",
		"reservations: {maxAge: 800h}",
		"reservations: {keyRotation: 1s}",
		"reservations: {keyRotation: 1h, keyRefresh: 1h}",
		"reservations: {keyRefresh: 1ms}",
		"reservations: {keyRotation: 1m, keyRefresh: 30s, maxAge: 700h}",
		"reservations: {maxSettled: -1}",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "reservations.") {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

// The prices read exactly; a cache price left out is the input's, and a
// pool's price left out is the model's as written.
func TestPricesTable(t *testing.T) {
	c, err := Parse([]byte(`
prices:
  models:
    mini:
      input: 0.15
      cachedInput: 0.075
      output: 0.60
      pools:
        premium: {input: 0.30}
    plain:
      input: "3"
      output: 15
      pools:
        batch: {input: 1.5, output: 7.5}
`))
	if err != nil {
		t.Fatal(err)
	}
	tab := c.Prices.Table()
	for _, tc := range []struct {
		model, pool string
		want        price.Price
		src         price.Source
	}{
		{"mini", "other", price.Price{Input: 150_000, CachedInput: 75_000, CacheWrite: 150_000, Output: 600_000}, price.SourceModel},
		{"mini", "premium", price.Price{Input: 300_000, CachedInput: 75_000, CacheWrite: 300_000, Output: 600_000}, price.SourcePool},
		{"plain", "", price.Price{Input: 3_000_000, CachedInput: 3_000_000, CacheWrite: 3_000_000, Output: 15_000_000}, price.SourceModel},
		{"plain", "batch", price.Price{Input: 1_500_000, CachedInput: 1_500_000, CacheWrite: 1_500_000, Output: 7_500_000}, price.SourcePool},
	} {
		p, src, ok := tab.Lookup(tc.model, tc.pool)
		if !ok || p != tc.want || src != tc.src {
			t.Errorf("%s on %q: %+v from %q (%v), want %+v from %q", tc.model, tc.pool, p, src, ok, tc.want, tc.src)
		}
	}
	if tab.Currency != "USD" || tab.Len() != 2 {
		t.Errorf("currency %q, %d models", tab.Currency, tab.Len())
	}
}

// A decoding mistake is told in the file's words: its line, the key's
// dotted path, what the key wants, and for a typo the key meant; no Go
// type names.
func TestParseErrorsSpeakTheFilesWords(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"auth:\n  kyes: x\n", "line 2: auth.kyes: unknown key (did you mean keys?)"},
		{"ratelimit:\n  backnd: memory\n", "line 2: ratelimit.backnd: unknown key (did you mean backend?)"},
		{"policy:\n  reloadInterval: 5\n", "line 2: policy.reloadInterval: want a duration such as 30s, 5m or 1h, got 5"},
		{"gate:\n  maxBodyBytes: lots\n", "line 2: gate.maxBodyBytes: want a whole number, got lots"},
		{"virtualModels:\n  - name: m\n    pools:\n      - clustr: a\n", "line 4: virtualModels.0.pools.0.clustr: unknown key (did you mean cluster?)"},
		{"auth:\n  zzzzzzzz: 1\n", "line 2: auth.zzzzzzzz: unknown key"},
	} {
		_, err := Parse([]byte(c.yaml))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.yaml, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "config.") {
			t.Errorf("%q: a Go type name in %v", c.yaml, err)
		}
	}
}

// A price for a model the configuration does not name is refused, with the
// names it does and the nearest one: a misspelt price leaves the model
// clients call unpriced. With no models listed there is nothing to check.
func TestPricesForUnknownModel(t *testing.T) {
	_, err := Parse([]byte(`
models: [gpt-4o-mini, llama-70b]
virtualModels:
- name: llama
  pools: [{cluster: a}]
prices:
  models:
    gpt-4o-mni: {input: 0.15, output: 0.60}
    llama: {input: 1, output: 2}
`))
	want := `line 8: prices.models.gpt-4o-mni: no model or virtual model is named "gpt-4o-mni" (models and virtualModels: gpt-4o-mini, llama-70b, llama); did you mean "gpt-4o-mini"?`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	if _, err := Parse([]byte("prices:\n  models:\n    anything: {input: 1, output: 2}\n")); err != nil {
		t.Errorf("without models: %v", err)
	}
}

// An embeddings model needs no output price: left out, the model is priced
// for input only, on each pool too unless the pool gives one, and the
// gate's worst case says so.
func TestPricesInputOnly(t *testing.T) {
	c, err := Parse([]byte(`
prices:
  models:
    embed:
      input: 0.02
      pools:
        hosted: {input: 0.03}
        chatty: {output: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	tab := c.Prices.Table()
	for pool, want := range map[string]price.Price{
		"":       {Input: 20_000, CachedInput: 20_000, CacheWrite: 20_000, InputOnly: true},
		"hosted": {Input: 30_000, CachedInput: 30_000, CacheWrite: 30_000, InputOnly: true},
		"chatty": {Input: 20_000, CachedInput: 20_000, CacheWrite: 20_000, Output: 1_000_000},
	} {
		if p, _, _ := tab.Lookup("embed", pool); p != want {
			t.Errorf("on %q: %+v, want %+v", pool, p, want)
		}
	}
	if w, _ := tab.Worst("embed"); !w.InputOnly || w.Output != 1_000_000 {
		t.Errorf("worst %+v: want input-only (one pool has no output price)", w)
	}
	if _, err := Parse([]byte("prices:\n  models:\n    embed: {output: 1}\n")); err == nil || !strings.Contains(err.Error(), "input is required") {
		t.Errorf("a price without input: %v", err)
	}
}
