package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/testutil"
	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/internal/wasmmeter"
)

func headerMap(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// gateField opens a gate stream on infergate's ext_proc port as Envoy
// would, with a tenant's valid key, and returns the field the gate hands
// to the meter (its sealed reservation inside).
func gateField(t *testing.T, conn *grpc.ClientConn, key string) string {
	t.Helper()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(
			":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json",
			"authorization", "Bearer "+key, "x-request-id", "replayed")}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: modes.ProcessingMode_STREAMED,
				SendBodyWithoutWaitingForHeaderResponse: true}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(chatBody("pool-a", 32, false, "")), EndOfStream: true}}},
	} {
		if err := stream.Send(msg); err != nil {
			t.Fatal(err)
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the gate's answer ended without a field: %v", err)
		}
		if r := resp.GetImmediateResponse(); r != nil {
			t.Fatalf("the gate refused: %d %s", r.GetStatus().GetCode(), r.GetBody())
		}
		field := resp.GetDynamicMetadata().GetFields()[request.MeterNamespace].GetStructValue().GetFields()[request.MeterKey].GetStringValue()
		if field != "" {
			stream.CloseSend()
			return field
		}
	}
}

// replayMeter opens a meter stream that settles field's reservation with
// no usage: a complete response whose usage says 0 tokens.
func replayMeter(t *testing.T, conn *grpc.ClientConn, field string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), request.RoleHeader, "meter")
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		request.MeterAttribute: structpb.NewStringValue(field)}}}
	for _, msg := range []*extprocv3.ProcessingRequest{
		{ObservabilityMode: true, Attributes: attrs, Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap("x-request-id", "replayed")}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", "200", "content-type", "application/json")}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`), EndOfStream: true}}},
	} {
		if err := stream.Send(msg); err != nil {
			t.Fatal(err)
		}
	}
	stream.CloseSend()
	// The meter settles before its handler returns, which ends the stream.
	for {
		if _, err := stream.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Logf("meter stream: %v", err)
			}
			return
		}
	}
}

// Whoever reaches the ext_proc port cannot refund a tenant by replaying a
// reservation: a gate stream with the tenant's own key gets a sealed
// field, and five meter streams replaying it with no usage refund its
// reservation once. Before, each replay refunded the whole reservation
// again (8 extra requests through an exhausted budget). A forged
// access-log summary (a field with another tenant's name, or an unsealed
// one) writes no request-log line under that tenant.
func TestReplayedSettlementRefundsOnce(t *testing.T) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	// Budgets are per clock-aligned minute: run inside one.
	inOneWindow(t)
	// The in-Envoy meter's access-log service is on, so forged summaries
	// have somewhere to go.
	s := startStackWith(t, withWasmMeter(t, policyConfig(writeKeys(t), loadPolicies(t, 1_000_000),
		"ratelimit: {backend: redis, redis: {address: "+srv.Addr()+"}}")), 1)
	// Real use through Envoy, so a refund has something to take back.
	c := chatCall("sk-load-0001", "pool-a", 32)
	for range 10 {
		if resp, e := c.do(t, s.Envoy.URL); resp.StatusCode != 200 {
			t.Fatalf("a real request: %d %+v", resp.StatusCode, e)
		}
	}
	ctx := context.Background()
	counter := func() int {
		t.Helper()
		keys, err := rdb.Keys(ctx, "*tenant=loadtest}:total_tokens*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("total-token counters: %v %v", keys, err)
		}
		v, _ := rdb.Get(ctx, keys[0]).Int()
		return v
	}
	// Read once all ten settled: a read before the last settlement landed
	// would count its reservation, not its usage.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == 10
	}, "the real requests' settlements")
	used := counter()

	conn, err := grpc.NewClient(s.Gateway.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	field := gateField(t, conn, "sk-load-0001")
	reserved := counter() - used
	if reserved <= 0 {
		t.Fatalf("the gate stream reserved %d tokens", reserved)
	}
	for range 5 {
		replayMeter(t, conn, field)
	}
	after := counter()
	t.Logf("used %d, reserved %d, after 5 replays %d", used, reserved, after)
	if after < used {
		t.Errorf("replays refunded %d tokens the tenant used (the one reservation held %d)", used-after, reserved)
	}

	// A forged summary on the access-log service: the genuine field with
	// the tenant changed, and an unsealed field naming the tenant.
	forged := strings.Replace(field, "|loadtest|", "|acme|", 1)
	if forged == field {
		t.Fatal("the tenant is not where the test looks for it")
	}
	unsealed := "1|0|0|12|0|0|0|0|0|allow|unsealed-summary|pool-a|acme|key:forger|ok|||chat"
	if !sendSummaries(t, conn, 200, []string{forged, unsealed}, []string{"forged-summary", "unsealed-summary"}) {
		t.Fatal("the access-log service is not registered: meter.wasm is on, it must be")
	}
	for _, id := range []string{"forged-summary", "unsealed-summary"} {
		if st := s.Gateway.stamp(t, id); st.Tenant != "" || st.Principal != "" {
			t.Errorf("a forged summary was recorded under tenant %q, principal %q", st.Tenant, st.Principal)
		}
	}
	// The four replays after the first and the two summaries.
	if n := metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="unverified"`); n != 6 {
		t.Errorf("%v stamps counted unverified, want 6", n)
	}
	if counter() != after {
		t.Errorf("the forged summaries moved the tenant's counter: %d -> %d", after, counter())
	}
}

// sendSummaries sends, on the access-log service, one in-Envoy meter
// summary per field (a pool-a response with the given status, 9 s long),
// under the request ids given. It reports false when the service is not
// registered.
func sendSummaries(t *testing.T, conn *grpc.ClientConn, code uint32, fields, ids []string) bool {
	t.Helper()
	sum := wasmmeter.Summary{Start: time.Now().Add(-10 * time.Second), Complete: true, E2E: 9 * time.Second,
		HasFirst: true, TTFT: 8 * time.Second, Usage: &openai.Usage{PromptTokens: 1, CompletionTokens: 1}}
	var entries []*accesslogdatav3.HTTPAccessLogEntry
	for i, f := range fields {
		fs, err := anypb.New(wrapperspb.Bytes([]byte(sum.Encode())))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := structpb.NewStruct(map[string]any{request.MeterKey: f})
		entries = append(entries, &accesslogdatav3.HTTPAccessLogEntry{
			CommonProperties: &accesslogdatav3.AccessLogCommon{
				StartTime:                   timestamppb.New(sum.Start),
				UpstreamCluster:             "pool-a",
				UpstreamRequestAttemptCount: 1,
				FilterStateObjects:          map[string]*anypb.Any{wasmmeter.FilterStateKey: fs},
				Metadata:                    &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{request.MeterNamespace: md}},
			},
			Request:  &accesslogdatav3.HTTPRequestProperties{RequestId: ids[i%len(ids)]},
			Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code)},
		})
	}
	als, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// One message, as the forger of the issue sent them.
	if err := als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	// The service stamps every entry before it answers the stream's end.
	_, err = als.CloseAndRecv()
	if status.Code(err) == codes.Unimplemented {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// 300 forged summaries in one message (failed, 8-second first tokens, on
// the primary pool of a virtual model: unsealed fields, and sealed-looking
// ones that do not verify) move no weight and give the controller no
// sample; the one real request after them does. Before, such a message
// moved pool-a's weight 100 -> 5 in about 4 s.
func TestForgedSummariesMoveNoWeight(t *testing.T) {
	t.Parallel()
	s := startStackOn(t, "envoy/sla.yaml", withWasmMeter(t, slaConfig), 1)
	conn, err := grpc.NewClient(s.Gateway.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fields := make([]string, 300)
	for i := range fields {
		fields[i] = "1|0|1|12|0|0|0|0|0|allow|forged|llama|acme|key:forger|ok|||chat"
		if i%2 == 1 {
			fields[i] = "2|k.i.0.99999999999999.bWFj.1|0|1|12|0|0|0|0|0|allow|forged|llama|acme|key:forger|ok|||chat"
		}
	}
	if !sendSummaries(t, conn, 500, fields, []string{"forged"}) {
		t.Fatal("the access-log service is not registered: meter.wasm is on, it must be")
	}
	if resp, e := chatCall("", "llama", 4).do(t, s.Envoy.URL); resp.StatusCode != 200 {
		t.Fatalf("a real request: %d %+v", resp.StatusCode, e)
	}
	// The controller judges pool-a on the real request alone.
	var samples int
	testutil.Eventually(t, 5*time.Second, func() bool {
		var states []struct {
			Pools map[string]struct {
				Samples int `json:"samples"`
			} `json:"pools"`
		}
		if err := json.Unmarshal([]byte(get(t, s.Gateway.AdminURL+"/debug/controller?format=json")), &states); err != nil || len(states) != 1 {
			t.Fatalf("controller state: %v %+v", err, states)
		}
		samples = states[0].Pools["pool-a"].Samples
		return samples >= 1
	}, "the real request's sample")
	if samples != 1 {
		t.Errorf("pool-a judged on %d samples, want the real request's alone", samples)
	}
	if a, b := weights(t, s.Gateway.AdminURL); a != 100 || b != 0 {
		t.Errorf("weights pool-a %v, pool-b %v: forged summaries moved them", a, b)
	}
	if n := metricSum(t, s.Gateway.AdminURL, "infergate_meter_errors_total", `reason="unverified"`); n != 300 {
		t.Errorf("%v summaries counted unverified, want 300", n)
	}
	// A seal naming a key no replica holds raises the alarm for replicas
	// that disagree on the keys (here: a forgery).
	if n := metricSum(t, s.Gateway.AdminURL, "infergate_reservation_key_mismatch_total", `cause="unknown_key"`); n != 150 {
		t.Errorf("%v seals counted under an unknown key, want 150", n)
	}
}
