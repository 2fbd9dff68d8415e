package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// otlpReceiver is an OpenTelemetry collector's OTLP/gRPC trace endpoint,
// in the test: it keeps every span it is sent, with its service name.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	Addr  string
	mu    sync.Mutex
	spans []span
}

// span is one received span, flattened.
type span struct {
	Service         string
	TraceID, SpanID string
	ParentID        string
	Name            string
	Start, End      time.Time
	Attrs           map[string]any
	Events          []string
	Kind            tracepb.Span_SpanKind
}

func (s span) Duration() time.Duration { return s.End.Sub(s.Start) }

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := span{Service: service, TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Name: sp.GetName(), Kind: sp.GetKind(),
					Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano())),
					Attrs: map[string]any{}}
				for _, a := range sp.GetAttributes() {
					v := a.GetValue()
					switch {
					case v.GetStringValue() != "":
						s.Attrs[a.GetKey()] = v.GetStringValue()
					case v.GetDoubleValue() != 0:
						s.Attrs[a.GetKey()] = v.GetDoubleValue()
					default:
						s.Attrs[a.GetKey()] = v.GetIntValue()
					}
				}
				for _, e := range sp.GetEvents() {
					s.Events = append(s.Events, e.GetName())
				}
				r.spans = append(r.spans, s)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// trace returns the spans of one trace so far.
func (r *otlpReceiver) trace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

var (
	otlpMu    sync.Mutex
	otlpPorts = map[string]string{}
)

// startOTLP starts a receiver that Envoy (started afterwards in the same
// test) exports its spans to.
func startOTLP(t *testing.T) *otlpReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{Addr: lis.Addr().String()}
	g := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(g, r)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	otlpMu.Lock()
	otlpPorts[t.Name()] = port(t, r.Addr)
	otlpMu.Unlock()
	return r
}

// otlpPort is the port of this test's receiver, or a closed port: Envoy's
// tracer then fails its exports quietly, off the request path.
func otlpPort(t *testing.T) string {
	otlpMu.Lock()
	p, ok := otlpPorts[t.Name()]
	otlpMu.Unlock()
	if ok {
		return p
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return port(t, lis.Addr().String())
}
