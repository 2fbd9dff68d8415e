package e2e

import (
	"net"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/internal/request"
)

// standInPicker is an ext_proc server that answers request headers as an
// Endpoint Picker does: with its choice in x-gateway-destination-endpoint.
type standInPicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoint string
}

func (p *standInPicker) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		msg, err := s.Recv()
		if err != nil {
			return nil
		}
		if msg.GetRequestHeaders() == nil {
			continue
		}
		set := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: request.EndpointHeader, RawValue: []byte(p.endpoint)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
		if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set}}}}}}); err != nil {
			return nil
		}
	}
}

// withPicker puts an ext_proc filter at addr between the gate and the
// meter of the demo bootstrap, as an Endpoint Picker sits.
func withPicker(addr string) func(*testing.T, string) string {
	return func(t *testing.T, rendered string) string {
		t.Helper()
		const meter = "          - name: infergate.meter\n"
		const clusters = "\n  clusters:\n"
		if !strings.Contains(rendered, meter) || !strings.Contains(rendered, clusters) {
			t.Fatal("envoy/demo.yaml: the meter filter or the clusters not found")
		}
		_, p, _ := net.SplitHostPort(addr)
		filter := `          - name: picker
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: picker}}
              processing_mode: {request_header_mode: SEND, response_header_mode: SKIP, request_body_mode: NONE, response_body_mode: NONE}
`
		cluster := `  - name: picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: picker
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: ` + p + `}}}
`
		rendered = strings.Replace(rendered, meter, filter+meter, 1)
		return strings.Replace(rendered, clusters, clusters+cluster, 1)
	}
}

// Behind an Endpoint Picker (a stand-in ext_proc between the gate and the
// meter, through the real Envoy) the stamp names the endpoint it chose,
// and its stage is timed apart: picker_ms, within gateway_ms, and the
// meter's later read of the request not taken for a late one.
func TestStampNamesThePickersEndpoint(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, &standInPicker{endpoint: "10.1.2.3:8000"})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	s := startStackFor(t, "", func(*stack) string { return testConfig }, 1)
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr,
		withPicker(l.Addr().String()))
	// The picker's stage is measured unless a stall of infergate's
	// overlapped it (then it is 0, and the stamp may still be ok): some
	// request of a few has it, whatever the machine's load.
	measured := false
	for i := 0; i < 20 && !measured; i++ {
		r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 3, true, ""), nil)
		if r.Status != 200 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		st := s.Gateway.stamp(t, r.Header.Get("x-request-id"))
		if st.Endpoint != "10.1.2.3:8000" {
			t.Errorf("stamp endpoint %q, want the picker's 10.1.2.3:8000 (stamp %+v)", st.Endpoint, st)
		}
		if st.Pickerms < 0 || st.Pickerms > st.Gatewayms {
			t.Errorf("picker_ms %v, gateway_ms %v: want the picker's stage within the gateway's", st.Pickerms, st.Gatewayms)
		}
		measured = st.Timing == "ok" && st.Pickerms > 0
		t.Logf("timing %s, picker_ms %.3f, gateway_ms %.3f, gate_ms %.3f", st.Timing, st.Pickerms, st.Gatewayms, st.Gatems)
	}
	if !measured {
		t.Error("no stamp of 20 measured the picker's stage")
	}
}
