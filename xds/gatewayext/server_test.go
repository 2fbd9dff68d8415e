package gatewayext

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"

	"github.com/infergate/infergate/xds/server"
	"github.com/infergate/infergate/xds/weightsink"
)

// routesFunc is a Routes of fixed rules.
type routesFunc func(namespace, name string) ([][]BackendRef, error)

func (f routesFunc) BackendRefs(_ context.Context, namespace, name string) ([][]BackendRef, error) {
	return f(namespace, name)
}

// dial serves s on a loopback port, as infergate serves it on xds.listen,
// and returns a client of it.
func dial(t *testing.T, s *Server) pb.EnvoyGatewayExtensionClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.ServeGRPC(ctx, lis, server.GRPCOptions{}, s.Register) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewEnvoyGatewayExtensionClient(conn)
}

// TestHooksOverGRPC calls the hooks as Envoy Gateway does: PostClusterModify
// for every cluster of the route with the InferencePool, then
// PostTranslateModify with everything.
func TestHooksOverGRPC(t *testing.T) {
	var reads []string
	client := dial(t, &Server{Options: testOptions, Log: slog.New(slog.DiscardHandler),
		Routes: routesFunc(func(ns, name string) ([][]BackendRef, error) {
			reads = append(reads, ns+"/"+name)
			return testRules, nil
		})})
	ctx := context.Background()
	res := loadTranslated(t)
	pool := []*pb.ExtensionResource{{UnstructuredBytes: poolJSON(`,"failureMode":"FailOpen"`)}}
	for i, c := range res.Clusters {
		if _, ok := ParseClusterName(c.GetName()); !ok {
			continue
		}
		resp, err := client.PostClusterModify(ctx, &pb.PostClusterModifyRequest{Cluster: c,
			PostClusterContext: &pb.PostClusterExtensionContext{BackendExtensionResources: pool}})
		if err != nil {
			t.Fatalf("PostClusterModify %s: %v", c.GetName(), err)
		}
		res.Clusters[i] = resp.GetCluster()
	}
	if got := find(t, res.Clusters, poolCluster).GetType(); got != clusterv3.Cluster_ORIGINAL_DST {
		t.Errorf("pool cluster type %v, want ORIGINAL_DST", got)
	}
	if got := find(t, res.Clusters, backupCluster).GetType(); got != clusterv3.Cluster_EDS {
		t.Errorf("backup cluster type %v, want Envoy Gateway's EDS", got)
	}
	if !slices.Equal(reads, []string{"llm/infergate", "llm/infergate", "llm/infergate"}) {
		t.Errorf("HTTPRoute reads = %q", reads)
	}

	secret := &tlsv3.Secret{Name: "envoy-gateway-system/eg/https"}
	resp, err := client.PostTranslateModify(ctx, &pb.PostTranslateModifyRequest{
		Clusters: res.Clusters, Listeners: res.Listeners, Routes: res.Routes, Secrets: []*tlsv3.Secret{secret}})
	if err != nil {
		t.Fatalf("PostTranslateModify: %v", err)
	}
	// Envoy Gateway takes the lists back as the final ones: nothing lost.
	if len(resp.GetSecrets()) != 1 || len(resp.GetListeners()) != len(res.Listeners) || len(resp.GetRoutes()) != len(res.Routes) ||
		len(resp.GetClusters()) != len(res.Clusters)+1 {
		t.Fatalf("response: %d clusters, %d secrets, %d listeners, %d routes", len(resp.GetClusters()), len(resp.GetSecrets()),
			len(resp.GetListeners()), len(resp.GetRoutes()))
	}
	fs := httpFilters(t, find(t, resp.GetListeners(), routeConfig))
	if got := filterNames(fs); !slices.Equal(got, []string{gateFilter, NoRouteFilterName, pickerFilter, meterFilter, "envoy.filters.http.router"}) {
		t.Errorf("http filters = %q", got)
	}
	find(t, resp.GetClusters(), PickerClusterName(testPool))
}

func TestHooksRefuseWhatTheyCannotProve(t *testing.T) {
	client := dial(t, &Server{Options: testOptions, Log: slog.New(slog.DiscardHandler),
		Routes: routesFunc(func(string, string) ([][]BackendRef, error) { return testRules[:1], nil })})
	ctx := context.Background()
	pool := []*pb.ExtensionResource{{UnstructuredBytes: poolJSON("")}}
	for _, name := range []string{
		"httproute/llm/infergate/rule/1/backend/0", // a rule the route no longer has
		"grpcroute/llm/infergate/rule/0",           // not an HTTPRoute's
	} {
		_, err := client.PostClusterModify(ctx, &pb.PostClusterModifyRequest{Cluster: &clusterv3.Cluster{Name: name},
			PostClusterContext: &pb.PostClusterExtensionContext{BackendExtensionResources: pool}})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: err = %v, want FailedPrecondition", name, err)
		}
	}
	// Clusters of routes without an InferencePool are not looked at.
	c := &clusterv3.Cluster{Name: "grpcroute/llm/x/rule/0"}
	resp, err := client.PostClusterModify(ctx, &pb.PostClusterModifyRequest{Cluster: c})
	if err != nil || resp.GetCluster().GetName() != c.GetName() {
		t.Errorf("cluster without a pool: %v, %v", resp, err)
	}
	res := loadTranslated(t)
	clusterHook(t, res)
	if _, err := client.PostTranslateModify(ctx, &pb.PostTranslateModifyRequest{Clusters: res.Clusters}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("PostTranslateModify without listeners: err = %v, want FailedPrecondition", err)
	}
}

// TestKubeRoutesSpellsOutDefaults reads an HTTPRoute from an API server
// (an HTTP server answering as one) and fills in what the API defaults.
func TestKubeRoutesSpellsOutDefaults(t *testing.T) {
	const route = `{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute",
		"metadata":{"namespace":"llm","name":"infergate"},
		"spec":{"rules":[
			{"backendRefs":[{"group":"inference.networking.k8s.io","kind":"InferencePool","name":"vllm-a100","weight":80,"filters":[
			                  {"type":"ResponseHeaderModifier","responseHeaderModifier":{"set":[{"name":"x-infergate-pool","value":"vllm-a100"}]}},
			                  {"type":"RequestMirror","requestMirror":{"backendRef":{"name":"shadow"}}}]},
			                {"name":"vllm-h100","port":8000,"weight":20}]},
			{"backendRefs":[{"name":"sglang-l4","namespace":"other","port":8000}]}]}}`
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/gateway.networking.k8s.io/v1/namespaces/llm/httproutes/infergate" {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, route)
	}))
	defer api.Close()
	kube, err := weightsink.NewKube(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	k := KubeRoutes{Client: kube.Client}
	rules, err := k.BackendRefs(context.Background(), "llm", "infergate")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]BackendRef{
		{{Group: PoolGroup, Kind: PoolKind, Namespace: "llm", Name: "vllm-a100", Weight: 80,
			Headers:     Headers{Response: HeaderEdit{Set: []NameValue{{Name: "x-infergate-pool", Value: "vllm-a100"}}}},
			Unsupported: []string{"RequestMirror"}},
			{Kind: "Service", Namespace: "llm", Name: "vllm-h100", Weight: 20}},
		{{Kind: "Service", Namespace: "other", Name: "sglang-l4", Weight: 1}},
	}
	if !reflect.DeepEqual(rules, want) {
		t.Errorf("rules = %+v, want %+v", rules, want)
	}
	if _, err := k.BackendRefs(context.Background(), "llm", "missing"); err == nil {
		t.Error("a missing HTTPRoute read without error")
	}
}
