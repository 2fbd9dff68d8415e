package gatewayext

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/internal/testutil/envoytest"
)

// processor is an ext_proc server: respond answers each message.
type processor struct {
	extprocsvc.UnimplementedExternalProcessorServer
	respond func(*extprocsvc.ProcessingRequest) *extprocsvc.ProcessingResponse
}

func (p *processor) Process(s extprocsvc.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(p.respond(req)); err != nil {
			return err
		}
	}
}

func serveProcessor(t *testing.T, p *processor) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocsvc.RegisterExternalProcessorServer(gs, p)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().(*net.TCPAddr).Port
}

func setHeader(k, v string) *extprocsvc.HeaderMutation {
	return &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}}}
}

// echo passes a full-duplex streamed body chunk through unchanged.
func echo(b *extprocsvc.HttpBody) *extprocsvc.BodyResponse {
	return &extprocsvc.BodyResponse{Response: &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{
		Mutation: &extprocsvc.BodyMutation_StreamedResponse{StreamedResponse: &extprocsvc.StreamedBodyResponse{
			Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}
}

func staticCluster(name string, port int, h2 bool) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       &endpointv3.ClusterLoadAssignment{ClusterName: name},
	}
	if port > 0 {
		c.LoadAssignment.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}}},
		}}}}
	}
	if h2 {
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})}
	}
	return c
}

// TestEnvoyRunsThePickerOnlyForThePoolsShare runs the real Envoy on
// resources shaped as Envoy Gateway makes them (its gate off in the chain,
// on per route; a rule split between an InferencePool and its hosted
// backup; a catch-all), after the hooks: the gate (a stand-in that routes
// by the x-model header, clearing the route cache) picks the route, and
// the picker runs for, and only for, the requests the split sends to the
// pool, which reach the pod it named. A request for an unknown host never
// reaches the picker.
func TestEnvoyRunsThePickerOnlyForThePoolsShare(t *testing.T) {
	var mu sync.Mutex
	picked := map[string]bool{} // request id → the picker saw it
	served := map[string]string{}
	serve := func(who string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			served[r.Header.Get("x-request-id")] = who + " " + r.Header.Get(DestinationHeader)
			mu.Unlock()
			io.WriteString(w, who)
		}))
		t.Cleanup(s.Close)
		return s
	}
	pod, backup := serve("pod"), serve("backup")
	podAddr := strings.TrimPrefix(pod.URL, "http://")
	port := func(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }

	gatePort := serveProcessor(t, &processor{respond: func(r *extprocsvc.ProcessingRequest) *extprocsvc.ProcessingResponse {
		model := ""
		for _, h := range r.GetRequestHeaders().GetHeaders().GetHeaders() {
			if h.GetKey() == "x-model" {
				model = string(h.GetRawValue())
			}
		}
		return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{
			Response: &extprocsvc.CommonResponse{HeaderMutation: setHeader("x-infergate-model", model), ClearRouteCache: true}}}}
	}})
	pickerPort := serveProcessor(t, &processor{respond: func(r *extprocsvc.ProcessingRequest) *extprocsvc.ProcessingResponse {
		switch m := r.GetRequest().(type) {
		case *extprocsvc.ProcessingRequest_RequestHeaders:
			for _, h := range m.RequestHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == "x-request-id" {
					mu.Lock()
					picked[string(h.GetRawValue())] = true
					mu.Unlock()
				}
			}
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{
				Response: &extprocsvc.CommonResponse{HeaderMutation: setHeader(DestinationHeader, podAddr)}}}}
		case *extprocsvc.ProcessingRequest_RequestBody:
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestBody{RequestBody: echo(m.RequestBody)}}
		case *extprocsvc.ProcessingRequest_ResponseBody:
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseBody{ResponseBody: echo(m.ResponseBody)}}
		case *extprocsvc.ProcessingRequest_ResponseHeaders:
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocsvc.HeadersResponse{}}}
		case *extprocsvc.ProcessingRequest_RequestTrailers:
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocsvc.TrailersResponse{}}}
		default:
			return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocsvc.TrailersResponse{}}}
		}
	}})

	// Envoy Gateway's resources, the gate and meter as its
	// EnvoyExtensionPolicy makes them.
	egFilter := func(name string) *hcmv3.HttpFilter {
		return &hcmv3.HttpFilter{Name: name, Disabled: true, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&extprocv3.ExternalProcessor{
			GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "envoyextensionpolicy/llm/infergate/extproc/0"}}},
			ProcessingMode: &extprocv3.ProcessingMode{RequestHeaderMode: extprocv3.ProcessingMode_SEND, ResponseHeaderMode: extprocv3.ProcessingMode_SKIP,
				RequestTrailerMode: extprocv3.ProcessingMode_SKIP, ResponseTrailerMode: extprocv3.ProcessingMode_SKIP},
		})}}
	}
	gateOn := func() map[string]*anypb.Any {
		return map[string]*anypb.Any{gateFilter: mustAny(&routev3.FilterConfig{Config: &anypb.Any{}})}
	}
	onModel := func(name, model string, action *routev3.RouteAction) *routev3.Route {
		return &routev3.Route{Name: name, TypedPerFilterConfig: gateOn(),
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: []*routev3.HeaderMatcher{{
				Name: "x-infergate-model", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Exact{Exact: model}}}}}},
			Action: &routev3.Route_Route{Route: action}}
	}
	// As Envoy Gateway v1.9.1 makes the rule's split: the Service's entry
	// alone (it leaves the custom backend out); the hooks put the pool's
	// back, 80 to the Service's 20, as the route's backendRefs say.
	split := &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{
		Clusters: []*routev3.WeightedCluster_ClusterWeight{{Name: backupCluster, Weight: wrapperspb.UInt32(20)}}}}}
	rc := &routev3.RouteConfiguration{Name: routeConfig, VirtualHosts: []*routev3.VirtualHost{{
		Name: "llm", Domains: []string{"llm.example.com"}, Routes: []*routev3.Route{
			onModel("httproute/llm/infergate/rule/0/match/0/llm_example_com", "split", split),
			onModel("hosted", "hosted", &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: otherCluster}}),
			{Name: "catch-all", TypedPerFilterConfig: gateOn(), Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}}},
		}}}}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:                "http",
		PreserveExternalRequestId: true,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: routeConfig,
			ConfigSource: &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}},
		HttpFilters: []*hcmv3.HttpFilter{egFilter(gateFilter), egFilter(meterFilter),
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}},
	}
	listener := &listenerv3.Listener{Name: routeConfig,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{Name: hcmFilter,
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)}}}}}}
	clusters := []*clusterv3.Cluster{
		staticCluster(poolCluster, 0, false), // a custom backend: no endpoints
		staticCluster(backupCluster, port(backup), false),
		staticCluster(otherCluster, port(backup), false),
		staticCluster("envoyextensionpolicy/llm/infergate/extproc/0", gatePort, true),
	}

	// The hooks.
	res := translated{Clusters: clusters, Listeners: []*listenerv3.Listener{listener}, Routes: []*routev3.RouteConfiguration{rc}}
	clusterHook(t, res)
	o := testOptions
	o.PickerTLS = false
	out, err := o.Translate(res.Clusters, res.Listeners, res.Routes)
	if err != nil {
		t.Fatal(err)
	}
	// The picker's Service name resolves in a cluster only: here it is
	// the stand-in's address.
	sa := find(t, out, PickerClusterName(testPool)).GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	sa.Address, sa.PortSpecifier = "127.0.0.1", &corev3.SocketAddress_PortValue{PortValue: uint32(pickerPort)}
	// The routes inline: Envoy Gateway serves them over ADS.
	if err := listener.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}
	listener.GetFilterChains()[0].GetFilters()[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)}
	doc, err := protojson.Marshal(&bootstrapv3.Bootstrap{
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}}},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Listeners: res.Listeners, Clusters: out},
	})
	if err != nil {
		t.Fatal(err)
	}
	envoy := envoytest.Start(t, string(doc))

	callHeader := func(host, model, id string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, envoy.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("x-model", model)
		req.Header.Set("x-request-id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	call := func(host, model, id string) (int, string) {
		t.Helper()
		code, body, _ := callHeader(host, model, id)
		return code, body
	}
	bySide := map[string]int{}
	for i := range 80 { // all 80 to one side of an 80:20 split: one in fifty million
		id := fmt.Sprintf("split-%d", i)
		code, body, hdr := callHeader("llm.example.com", "split", id)
		if pool := hdr.Get("x-infergate-pool"); (body == "pod") != (pool == "vllm-a100") {
			t.Errorf("%s served by %s with x-infergate-pool %q: the pool's backendRef filter sets it on the pool's share only", id, body, pool)
		}
		mu.Lock()
		p, s := picked[id], served[id]
		mu.Unlock()
		switch {
		case code != http.StatusOK:
			t.Fatalf("%s: %d %s (picked %v, served %q)", id, code, body, p, s)
		case body == "pod" && (!p || s != "pod "+podAddr):
			t.Errorf("%s reached the pod without the picker's choice (picked %v, served %q)", id, p, s)
		case body == "backup" && (p || s != "backup "):
			t.Errorf("%s went to the backup through the picker (picked %v, served %q)", id, p, s)
		}
		bySide[body]++
	}
	if bySide["pod"] == 0 || bySide["backup"] == 0 {
		t.Fatalf("the 80:20 split served %v: both sides must be seen", bySide)
	}
	if code, body := call("llm.example.com", "hosted", "hosted"); code != http.StatusOK || body != "backup" || picked["hosted"] {
		t.Errorf("hosted model: %d %q, picker ran %v", code, body, picked["hosted"])
	}
	if code, _ := call("other.example.com", "split", "unknown-host"); code != http.StatusForbidden || picked["unknown-host"] {
		t.Errorf("a request no route matches: %d, picker ran %v; want 403 before any picker", code, picked["unknown-host"])
	}
	t.Logf("split served %v", bySide)
}
