package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/sse"
	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// The shipped usage filter (envoy/snippet.yaml's infergate.usage, in real
// Envoy) removes the usage event the gate asked for, and nothing else,
// however the pool's bytes are cut: a pool here writes each stream in
// random pieces, flushed apart, some a byte long, some splitting the usage
// line or its blank line, some holding several events; what the client gets is what infergate's own
// stripper (internal/sse, fuzzed against a whole-stream reference) makes
// of the stream whole. A marked request only: the gate's metadata is set
// here by Envoy's set_metadata filter.
func TestUsageFilterAnyChunking(t *testing.T) {
	t.Parallel()
	streams := map[string]string{
		"chat": "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n" +
			"data: [DONE]\n\n",
		"crlf": "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n" +
			"data: {\"choices\": [ ], \"usage\": {\"prompt_tokens\":1}}\r\n\r\n" +
			"data: [DONE]\r\n\r\n",
		// vLLM's running usage rides on content chunks: kept.
		"continuous usage": "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"completion_tokens\":1}}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\n" +
			"data: [DONE]\n\n",
		"keep-alive and no usage": ": ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: [DONE]\n\n",
	}
	var seed atomic.Int64
	pool := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := streams[r.URL.Query().Get("stream")]
		rnd := rand.New(rand.NewPCG(uint64(seed.Add(1)), 7))
		w.Header().Set("content-type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for rest := body; rest != ""; {
			var n int
			switch rnd.IntN(4) {
			case 0:
				n = 1
			case 1:
				n = 1 + rnd.IntN(len(rest)) // events together, as a busy pool or Envoy coalesces them
			default:
				n = 1 + rnd.IntN(24)
			}
			n = min(n, len(rest))
			io.WriteString(w, rest[:n])
			rc.Flush()
			rest = rest[n:]
			time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond) // pieces apart, so Envoy reads them apart
		}
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go pool.Serve(l)
	t.Cleanup(func() { pool.Close() })

	var snippet struct {
		HTTPFilters []map[string]any `yaml:"http_filters"`
	}
	readYAML(t, "envoy/snippet.yaml", &snippet)
	var usage map[string]any
	for _, f := range snippet.HTTPFilters {
		if f["name"] == "infergate.usage" {
			usage = f
		}
	}
	if usage == nil {
		t.Fatal("envoy/snippet.yaml has no infergate.usage filter")
	}
	filter, err := json.Marshal(usage) // JSON is YAML: the filter as shipped
	if err != nil {
		t.Fatal(err)
	}
	_, poolPort, _ := net.SplitHostPort(l.Addr().String())
	e := envoytest.Start(t, fmt.Sprintf(`
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          http_filters:
          - name: mark
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata: [{metadata_namespace: infergate, value: {usage_added: true}}]
          - %s
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{match: {prefix: "/"}, route: {cluster: pool, timeout: 0s}}]
  clusters:
  - name: pool
    type: STATIC
    load_assignment:
      cluster_name: pool
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %s}}}}]}]
`, filter, poolPort))

	for name, body := range streams {
		st := &sse.UsageStripper{}
		whole, _ := st.Strip([]byte(body))
		want := append(bytes.Clone(whole), st.End()...)
		for i := range 25 {
			resp, err := http.Get(e.URL + "/?stream=" + url.QueryEscape(name) + "&i=" + strconv.Itoa(i))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s #%d: %d %v", name, i, resp.StatusCode, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s #%d: through the usage filter\n%q\nwant\n%q", name, i, got, want)
			}
		}
	}
}
