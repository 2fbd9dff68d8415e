package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	modes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// dialFrom is a client connection to addr from the local IP from (any
// 127.0.0.0/8 address is this host's loopback).
func dialFrom(t *testing.T, addr, from string) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openGate opens a gate stream on conn and sends a request's headers in
// BUFFERED mode: the gate answers them at once, after it took the stream,
// or answers the stream with an immediate response.
func openGate(t *testing.T, conn *grpc.ClientConn) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse) {
	t.Helper()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	h := headersMsg(false, chatHeaders...)
	h.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes.ProcessingMode_BUFFERED}
	if err := stream.Send(h); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return stream, resp
}

// One peer holds at most MaxGateStreamsPerPeer gate streams, over all its
// connections; past that it is answered 503 gate_overloaded at once and
// counted, while another peer is served as ever, and a stream that ends
// gives its place back. Streams are held open, no clock involved: each
// held one is answered before the next is opened.
func TestGateStreamsPerPeer(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	s, err := New(Options{MaxGateStreamsPerPeer: 3, Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("t")})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()
	a1, a2, b := dialFrom(t, addr, "127.0.0.1"), dialFrom(t, addr, "127.0.0.1"), dialFrom(t, addr, "127.0.0.2")

	var held []extprocv3.ExternalProcessor_ProcessClient
	for i, conn := range []*grpc.ClientConn{a1, a2, a1} {
		stream, resp := openGate(t, conn)
		if resp.GetRequestHeaders() == nil {
			t.Fatalf("stream %d of 3: %v, want its headers answered", i+1, resp)
		}
		held = append(held, stream)
	}
	for _, conn := range []*grpc.ClientConn{a1, a2} {
		_, resp := openGate(t, conn)
		ir := resp.GetImmediateResponse()
		if ir.GetStatus().GetCode() != 503 || string(ir.GetBody()) != `{"error":{"message":"the gateway is handling too many requests from this peer; retry shortly","type":"server_error","param":null,"code":"gate_overloaded"}}` {
			t.Errorf("a 4th stream from the peer: %v, want 503 gate_overloaded", resp)
		}
	}
	if _, resp := openGate(t, b); resp.GetRequestHeaders() == nil {
		t.Errorf("another peer: %v, want its headers answered", resp)
	}
	if got := overloadedCount(t, reader); got != 2 {
		t.Errorf("gate_overloaded counted %d times, want 2", got)
	}

	// One held stream ends (the gate returned before the client sees the
	// end): its place is free again.
	end := held[0]
	if err := end.Send(bodyMsg(`{"model":"m"}`, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := end.Recv(); err != nil {
		t.Fatal(err)
	}
	end.CloseSend()
	if _, err := end.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream did not end: %v", err)
	}
	if _, resp := openGate(t, a2); resp.GetRequestHeaders() == nil {
		t.Errorf("after a stream ended: %v, want its headers answered", resp)
	}
}

// overloadedCount reads infergate.gate.decisions{code=gate_overloaded}.
func overloadedCount(t *testing.T, r sdkmetric.Reader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "infergate.gate.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("code")); v.AsString() == "gate_overloaded" {
					return dp.Value
				}
			}
		}
	}
	return 0
}
