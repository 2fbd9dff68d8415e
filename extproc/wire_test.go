package extproc

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// wireSamples are the messages Envoy sends the gate and the meter, as the
// shipped configs make it send them, plus the rarer shapes.
func wireSamples() map[string]*extprocv3.ProcessingRequest {
	meterHeaders := headersMsg(false, "x-request-id", "3f6c1a2e-9d1b-4c47-8a55-0b1f7e2d9c10", request.ModelHeader, "llama")
	meterHeaders.ObservabilityMode = true
	meterHeaders.Attributes = map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
		request.MeterAttribute: structpb.NewStringValue(sampleField.encode()),
		"request.time":         structpb.NewStringValue(time.Unix(1_796_000_000, 0).UTC().Format(time.RFC3339Nano))}}}
	gateHeaders := headersMsg(false, append(chatHeaders, "authorization", "Bearer sk-test", "user-agent", "openai-python/1.99")...)
	jwt, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "alice", "groups": []any{"a", "b"},
		"exp": 1.8e9, "admin": false, "tenant": nil}})
	gateHeaders.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": jwt}}
	chunk := respBody(contentChunk, false)
	chunk.ObservabilityMode = true
	trailers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{
		Trailers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "grpc-status", Value: "0"}}}}}}
	return map[string]*extprocv3.ProcessingRequest{
		"meter-chunk":            chunk,
		"meter-request-headers":  meterHeaders,
		"meter-response-headers": respHeadersWith("text/event-stream", sampleField.encode(), time.Unix(1_796_000_000, 0)),
		"gate-request-headers":   gateHeaders,
		"gate-body":              bodyMsg(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`, true),
		"trailers":               trailers,
		"empty":                  {},
	}
}

// The hand decoder builds what proto.Unmarshal builds, for every shape
// Envoy sends, and takes them all itself (no fallback).
func TestDecodeMatchesProto(t *testing.T) {
	for name, msg := range wireSamples() {
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var got extprocv3.ProcessingRequest
		var d wireDecoder
		if !d.request(b, &got) {
			t.Errorf("%s: the hand decoder did not take it", name)
		}
		if !proto.Equal(&got, msg) {
			t.Errorf("%s: decoded %v, want %v", name, &got, msg)
		}
	}
}

// Through the gRPC codec: a request from a transport buffer that is reused
// after, an answer into a pooled one.
func TestCodec(t *testing.T) {
	msg := respBody(contentChunk, true)
	b, _ := proto.Marshal(msg)
	buf := append([]byte(nil), b...)
	var got extprocv3.ProcessingRequest
	if err := NewCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &got); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if !proto.Equal(&got, msg) {
		t.Fatalf("decoded %v, want %v", &got, msg)
	}
	// Answers: into pooled buffers, as proto.Marshal encodes them.
	answer := immediate(openai.NewError(429, "rate_limit_exceeded", "rate_limited", "", "slow down"))
	out, err := NewCodec().Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	var back extprocv3.ProcessingResponse
	if err := proto.Unmarshal(out.Materialize(), &back); err != nil || !proto.Equal(&back, answer) {
		t.Fatalf("answer through the codec: %v %v", &back, err)
	}
	out.Free()
	var other structpb.Struct // anything else: grpc-go's own codec
	sb, _ := proto.Marshal(&structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewBoolValue(true)}})
	if err := NewCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(sb)}, &other); err != nil || !other.Fields["a"].GetBoolValue() {
		t.Fatalf("Struct through the codec: %v %v", &other, err)
	}
}

// FuzzDecodeProcessingRequest: whatever the bytes, decoding gives what
// proto.Unmarshal gives: the same error-or-not and an equal message.
func FuzzDecodeProcessingRequest(f *testing.F) {
	for _, msg := range wireSamples() {
		b, _ := proto.Marshal(msg)
		f.Add(b)
	}
	// Shapes the hand decoder leaves to proto: a repeated oneof, an unknown
	// field, invalid UTF-8, a typed metadata entry, a group.
	body, _ := proto.Marshal(respBody("x", false))
	f.Add(append(body, body...))
	f.Add(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
			protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
				protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff})))))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 8, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), nil)))
	f.Add(protowire.AppendTag(nil, 5, protowire.StartGroupType))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got extprocv3.ProcessingRequest
		werr := proto.Unmarshal(b, &want)
		gerr := decodeProcessingRequest(b, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Unmarshal: %v; hand decoding: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("hand decoding gave %v, proto.Unmarshal %v", &got, &want)
		}
	})
}

// BenchmarkDecode: each message Envoy sends, decoded by proto.Unmarshal and
// by hand, side by side.
func BenchmarkDecode(b *testing.B) {
	for _, name := range []string{"meter-chunk", "meter-request-headers", "meter-response-headers", "gate-request-headers", "gate-body"} {
		data, _ := proto.Marshal(wireSamples()[name])
		b.Run(name+"/proto", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var m extprocv3.ProcessingRequest
				if err := proto.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/hand", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var m extprocv3.ProcessingRequest
				if err := decodeProcessingRequest(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
