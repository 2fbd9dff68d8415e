//go:build wasip1

// Command infergate-meter-wasm is infergate's in-Envoy meter: a proxy-wasm
// module for Envoy's Wasm filter (V8) that times a response where it passes
// (TTFT, every inter-token gap, usage, for every API: internal/wasmmeter,
// counting as the ext_proc meter does) and leaves one summary per request
// in Envoy's filter state, which Envoy's gRPC access log carries to
// infergate (envoy/wasm-meter.yaml). Build it with `make wasm`:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o bin/infergate-meter.wasm ./cmd/infergate-meter-wasm
package main

import (
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/wasmmeter"
)

// property is where the summary goes: Envoy keeps it as the filter state
// object "wasm." + property, which the access log names in
// filter_state_objects_to_log.
var property = []string{wasmmeter.Property}

func main() {}

func init() {
	// Go's collector on Wasm is slow, stop-the-world, on Envoy's worker
	// thread: run it less often (the module's live heap is a few records).
	// Measured under wazero: 57 → 26 µs per streamed chunk.
	debug.SetGCPercent(400)
	proxywasm.SetHttpContext(func(uint32) types.HttpContext { return &meter{} })
}

// meter is one request's context. It only observes: every callback lets the
// stream continue, and a panic drops this request's summary, never the
// response (nor the VM: it is recovered).
type meter struct {
	types.DefaultHttpContext
	rec wasmmeter.Recorder
}

// OnHttpRequestHeaders runs once the gate has answered (the filter is after
// it): the request leaves the gateway now. Its path names the API, as the
// gate reads it: a count_tokens answer does not name its own.
func (m *meter) OnHttpRequestHeaders(int, bool) types.Action {
	at := time.Now()
	defer m.recover()
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	path, _, _ = strings.Cut(path, "?")
	m.rec.Start(at, openai.APIOf(path))
	return types.ActionContinue
}

func (m *meter) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	defer m.recover()
	ct, _ := proxywasm.GetHttpResponseHeader("content-type")
	m.rec.ResponseHeaders(ct)
	if endOfStream {
		m.end(true, time.Now())
	}
	return types.ActionContinue
}

func (m *meter) OnHttpResponseBody(size int, endOfStream bool) types.Action {
	at := time.Now()
	defer m.recover()
	if size > 0 && m.rec.Started() {
		if body, err := proxywasm.GetHttpResponseBody(0, size); err == nil {
			m.rec.Body(body, at)
		}
	}
	if endOfStream {
		m.end(true, at)
	}
	return types.ActionContinue
}

func (m *meter) OnHttpResponseTrailers(int) types.Action {
	defer m.recover()
	m.end(true, time.Now())
	return types.ActionContinue
}

// OnHttpStreamDone (proxy_on_log) runs when Envoy logs the request: a
// response that never reached its end was cut (client or pool reset).
// Envoy runs it before the access logs it was configured with, so the
// summary written here still reaches them.
func (m *meter) OnHttpStreamDone() {
	defer m.recover()
	m.end(false, time.Now())
}

// end writes the summary once.
func (m *meter) end(complete bool, at time.Time) {
	s, ok := m.rec.End(complete, at)
	if !ok {
		return
	}
	if err := proxywasm.SetProperty(property, []byte(s.Encode())); err != nil {
		proxywasm.LogWarnf("infergate meter: setting the summary: %v", err)
	}
}

func (m *meter) recover() {
	if r := recover(); r != nil {
		m.rec = wasmmeter.Recorder{} // nothing more from this request
		proxywasm.LogErrorf("infergate meter: %s", fmt.Sprint(r))
	}
}
