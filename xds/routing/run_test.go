package routing

import (
	"context"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/xds/controller"
)

// Run serves the extra gRPC services (Envoy Gateway's extension) on the
// xDS listener, next to xDS itself.
func TestRunServesExtraServicesWithXDS(t *testing.T) {
	r, _, _ := testService(t, llama(controller.SLA{TTFTP95: time.Second}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- r.Run(ctx, lis, func(gs grpc.ServiceRegistrar) { healthpb.RegisterHealthServer(gs, health.NewServer()) })
	}()
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
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the extra service on the xDS listener: %v, %v", resp, err)
	}
	stream, err := routeservice.NewRouteDiscoveryServiceClient(conn).StreamRoutes(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "test"},
		TypeUrl: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", ResourceNames: []string{"infergate"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("xDS next to the extra service: %v, %v", resp, err)
	}
}
