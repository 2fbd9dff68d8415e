package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// rss is this process's resident memory (infergate's included).
func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapInUse is the live heap after a collection: infergate runs in this
// process, so what it retains shows here.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// Clients who send enormous model names, with or without a key (and with a
// key of a tier that admits any model), cost infergate almost nothing: each
// gets its 400/401, nothing they sent is kept whole, and normal traffic in
// between is served. HOSTILE_REQUESTS sets how many (default 1,000; the
// closing measurement used 10,000).
func TestHostileModelNamesCostNothing(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("HOSTILE_REQUESTS")); err == nil && v > 0 {
		n = v
	}
	s := startStackWith(t, policyConfig(writeKeys(t), copyPolicies(t), "gate: {maxBodyBytes: 2097152}"), 1)
	url := s.Envoy.URL + "/v1/chat/completions"
	normal := chatCall("sk-acme-0001", "pool-a", 8)
	normal.body = chatBody("pool-a", 4, true, "")
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions",
		chatBody("pool-a", 4, true, `,"stream_options":{"include_usage":true}`), nil))

	heapBefore, logBefore, rssBefore := heapInUse(), s.Gateway.requests.Len(), rss(t)
	huge := strings.Repeat("m", 1<<20)
	bodies := []struct {
		key, body string
		status    int
	}{
		{"", `{"model":"` + huge + `","messages":[{"role":"user","content":"hi"}]}`, 401}, // unread without a key
		{"sk-acme-0001", `{"model":"` + huge + `","messages":[{"role":"user","content":"hi"}]}`, 400},
		{"", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, 401},
	}
	var sent, wrong, timedOut atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 4 {
		wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for i := w; i < n; i += 4 {
				b := bodies[i%len(bodies)]
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(b.body))
				req.Header.Set("content-type", "application/json")
				if b.key != "" {
					req.Header.Set("authorization", "Bearer "+b.key)
				}
				resp, err := client.Do(req)
				if err != nil {
					wrong.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				sent.Add(1)
				if resp.StatusCode == http.StatusGatewayTimeout && b.status == http.StatusBadRequest {
					// Refused all the same, by Envoy: a starved machine took
					// longer than the gate's message timeout to pass 1 MiB.
					timedOut.Add(1)
					continue
				}
				if resp.StatusCode != b.status && wrong.Add(1) <= 3 {
					t.Errorf("request %d: status %d, want %d", i, resp.StatusCode, b.status)
				}
			}
		})
	}
	// Normal traffic keeps flowing meanwhile, byte for byte.
	served := 0
	for sent.Load() < int64(n) && time.Since(start) < 10*time.Minute {
		resp, _ := normal.do(t, s.Envoy.URL)
		if resp.StatusCode != 200 {
			t.Fatalf("a normal request during the attack: status %d", resp.StatusCode)
		}
		served++
		if got := stream(t, url, normal.body, map[string]string{"authorization": "Bearer sk-acme-0001"}); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
			t.Fatalf("a normal stream during the attack arrived altered: status %d (request %s)\n got: %q\nwant: %q",
				got.Status, got.RequestID, got.Body, want.Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	elapsed := time.Since(start)
	heapAfter, logAfter, rssAfter := heapInUse(), s.Gateway.requests.Len(), rss(t)
	growth := int64(heapAfter) - int64(heapBefore)
	t.Logf("%d hostile requests (a third each: 1 MiB model names without a key, the same with a premium key, no key) in %s: %d wrong answers, %d refused by the gate's message timeout; "+
		"%d normal requests served meanwhile; RSS %.1f → %.1f MiB (test client included), live heap %+.1f MiB, request log +%.1f MB (%.0f bytes per request)",
		n, elapsed.Round(time.Millisecond), wrong.Load(), timedOut.Load(), served, float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), float64(growth)/(1<<20),
		float64(logAfter-logBefore)/1e6, float64(logAfter-logBefore)/float64(n))
	if wrong.Load() > 0 {
		t.Errorf("%d requests got the wrong answer", wrong.Load())
	}
	if growth > 50<<20 {
		t.Errorf("live heap grew by %.1f MiB; want at most 50", float64(growth)/(1<<20))
	}
	if perRequest := float64(logAfter-logBefore) / float64(n); perRequest > 1000 {
		t.Errorf("the request log grew by %.0f bytes per request; want at most 1000 (10 MB per 10,000)", perRequest)
	}
}

// Anything that reaches the ext_proc port may send nonsense: attempt counts
// of 1e18, NaN status codes, negative durations, forged metadata, phases
// out of order. infergate answers or drops those streams, keeps running,
// and keeps serving Envoy.
func TestOutOfRangeExtProcMessagesCrashNothing(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	conn, err := grpc.NewClient(s.Gateway.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	attrs := func(kv map[string]*structpb.Value) map[string]*structpb.Struct {
		return map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: kv}}
	}
	hdrs := func(kv ...string) *corev3.HeaderMap {
		hm := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return hm
	}
	forged := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MetadataNamespace: {Fields: map[string]*structpb.Value{
		"prompt_tokens": structpb.NewNumberValue(1e300), "gate_us": structpb.NewNumberValue(-1e18),
		"checks_us": structpb.NewNumberValue(math.Inf(1)), "model": structpb.NewStringValue(strings.Repeat("m", 1<<20)),
	}}}}
	sequences := [][]*extprocv3.ProcessingRequest{
		{ // a meter stream with absurd attributes
			{ObservabilityMode: true, MetadataContext: forged, Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs("x-request-id", "hostile-1", request.ModelHeader, "pool-a")}}},
			{ObservabilityMode: true, Attributes: attrs(map[string]*structpb.Value{
				"upstream.request_attempt_count": structpb.NewNumberValue(1e18),
				"response.code":                  structpb.NewNumberValue(math.NaN()),
				"xds.cluster_metadata":           structpb.NewStringValue(strings.Repeat("{", 1<<16)),
				"upstream.locality":              structpb.NewStringValue("region: \"" + strings.Repeat("r", 1<<16)),
				"request.time":                   structpb.NewStringValue("not a time"),
			}), Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":status", "99999999999999999999", "content-type", "text/event-stream", request.PoolHeader, strings.Repeat("p", 1<<16))}}},
			{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
				Body: []byte("data: {\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":1e300}}\n\n" + strings.Repeat("x", 1<<20))}}},
		},
		{ // a gate stream: body before headers, then headers twice, then trailers
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":`), EndOfStream: true}}},
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions"), EndOfStream: true}}},
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions"), EndOfStream: true}}},
			{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}},
		},
	}
	for i, seq := range sequences {
		role := "meter"
		if i == 1 {
			role = "gate"
		}
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, role), 5*time.Second)
		stream, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range seq {
			if err := stream.Send(msg); err != nil {
				break
			}
		}
		stream.CloseSend()
		for {
			if _, err := stream.Recv(); err != nil {
				break
			}
		}
		cancel()
	}

	// Still alive, still serving Envoy, no panic recovered along the way.
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", chatBody("pool-a", 4, true, `,"stream_options":{"include_usage":true}`), nil))
	if got := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 4, true, ""), nil); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("after the hostile streams: status %d, body %q", got.Status, got.Body)
	}
	metrics := get(t, s.Gateway.AdminURL+"/metrics")
	if strings.Contains(metrics, "infergate_extproc_panics_total") {
		t.Errorf("a stream panicked:\n%s", grepLines(metrics, "panics"))
	}
	for _, st := range s.Gateway.stamps() {
		if st.RequestID == "hostile-1" {
			if len(st.Model) > 256 || st.Attempts > 64 || st.PromptTokens < 0 || len(st.Pool) > 256 {
				t.Errorf("hostile stamp kept out-of-range values: model %d bytes, attempts %d, prompt tokens %d, pool %d bytes",
					len(st.Model), st.Attempts, st.PromptTokens, len(st.Pool))
			}
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return fmt.Sprint(out)
}

// The client's gateway key stops at the gateway, and so do headers that
// try to spell the gate's own: the pool sees neither.
func TestUpstreamNeverSeesClientCredentials(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, policyConfig(writeKeys(t), copyPolicies(t), ""), 1)
	c := chatCall("sk-acme-0001", "pool-a", 8)
	c.hdr = map[string]string{"x-api-key": "sk-acme-0001", "x_infergate_model": "pool-b", "x-infergate-tenant": "globex"}
	if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("status %d: %+v", resp.StatusCode, e)
	}
	h, _ := s.PoolA.LastRequest()
	if h == nil {
		t.Fatal("pool-a received nothing")
	}
	for _, k := range []string{"Authorization", "X-Api-Key", "X_infergate_model", "X-Infergate-Tenant"} {
		if v := h.Values(k); len(v) > 0 {
			t.Errorf("the pool received %s: %q", k, v)
		}
	}
	if got := h.Get("X-Infergate-Model"); got != "pool-a" {
		t.Errorf("x-infergate-model at the pool = %q, want the gate's pool-a", got)
	}
}

// A meter stream anyone could open with a forged reservation (counter keys
// are Redis keys) moves no counter: only reservations infergate sealed are
// settled. The test reads Redis itself.
func TestForgedReservationMovesNoCounter(t *testing.T) {
	t.Parallel()
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	s := startStackWith(t, policyConfig(writeKeys(t), copyPolicies(t),
		"ratelimit: {backend: redis, redis: {address: "+srv.Addr()+"}}"), 1)
	if resp, e := chatCall("sk-acme-0001", "pool-a", 8).do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("a real request: %d %+v", resp.StatusCode, e)
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		keys, err := rdb.Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.HasPrefix(k, "ig:seal") {
				continue // the sealing keys and the settle-once records: no counters
			}
			if v, err := rdb.Get(context.Background(), k).Result(); err == nil {
				out[k] = v
			}
		}
		return out
	}
	// The metric counts a settlement after its Redis write: the snapshot
	// is taken once it shows, or it could catch the reservation unsettled.
	testutil.Eventually(t, 3*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 1
	}, "the real request's settlement")
	before := snapshot()
	var counters []string
	for k := range before {
		counters = append(counters, k)
	}
	var entries []string
	for _, k := range counters {
		entries = append(entries, fmt.Sprintf(`{"k":%q,"u":"total_tokens","r":1000000,"x":%d}`, k, time.Now().Add(time.Hour).UnixMilli()))
	}
	payload := `{"e":[` + strings.Join(entries, ",") + `]}`

	conn, err := grpc.NewClient(s.Gateway.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, forged := range []string{payload, "AAAA.YWNtZQ." + payload} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "meter")
		stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MetadataNamespace: {Fields: map[string]*structpb.Value{
			"reservation": structpb.NewStringValue(forged), "tenant": structpb.NewStringValue("acme")}}}}
		for _, msg := range []*extprocv3.ProcessingRequest{
			{ObservabilityMode: true, MetadataContext: md, Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-request-id", RawValue: []byte("forged")}}}}}},
			{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}},
		} {
			if err := stream.Send(msg); err != nil {
				t.Fatal(err)
			}
		}
		stream.CloseSend()
		stream.Recv()
	}
	testutil.Eventually(t, 3*time.Second, func() bool {
		// Unsealed, the older namespace is trusted for no reservation.
		return metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="unverified"`) >= 2
	}, "both forged settlements to be refused and counted")
	if after := snapshot(); !maps.Equal(before, after) {
		t.Errorf("a forged reservation moved Redis:\nbefore %v\nafter  %v", before, after)
	}
}

// 1 MiB of nesting is refused at once (400), before anything recurses
// into it, and the service carries on.
func TestDeepJSONRefusedAtOnce(t *testing.T) {
	s := startStackWith(t, "gate: {maxBodyBytes: 2097152}\n", 1)
	for name, body := range map[string]string{
		"[":     strings.Repeat("[", 1<<20),
		`{"a":`: strings.Repeat(`{"a":`, 1<<20/5),
	} {
		resp, e := post(t, s.Envoy.URL+"/v1/chat/completions", "application/json", body, nil)
		if resp.StatusCode != 400 || e.Error.Code != "invalid_json" || !strings.Contains(e.Error.Message, "nests deeper than 64 levels") {
			t.Fatalf("%s × 1 MiB: %d %+v", name, resp.StatusCode, e.Error)
		}
		st := s.Gateway.stamp(t, resp.Header.Get("x-request-id"))
		t.Logf("%s × 1 MiB: 400 after %.3f ms in the gate (receiving the body included)", name, st.Gatems)
		// The message names the depth check: the parse stopped there (a
		// parser that descended would have exhausted its stack instead).
	}
	want := unasked(t, stream(t, "http://"+s.PoolA.Addr+"/v1/chat/completions", chatBody("pool-a", 4, true, `,"stream_options":{"include_usage":true}`), nil))
	if got := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 4, true, ""), nil); got.Status != 200 || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("after the deep bodies: status %d", got.Status)
	}
}

// A client that opts out of usage is still charged the model server's own
// count: the gate asks for usage on every stream.
func TestUsageOptOutStillMetered(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	got := stream(t, s.Envoy.URL+"/v1/chat/completions",
		chatBody("pool-a", 6, true, `,"stream_options":{"include_usage":false}`), nil)
	if got.Status != 200 {
		t.Fatalf("status %d", got.Status)
	}
	st := s.Gateway.stamp(t, got.RequestID)
	if st.TokenSource != "usage" || st.CompletionTokens != 6 || st.PromptTokens == 0 {
		t.Errorf("stamp: %d prompt + %d completion tokens from %q; want the server's usage", st.PromptTokens, st.CompletionTokens, st.TokenSource)
	}
	h, body := s.PoolA.LastRequest()
	if h == nil || !strings.Contains(string(body), `"include_usage":true`) {
		t.Errorf("the pool received %s", body)
	}
}
