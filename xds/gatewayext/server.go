// Package gatewayext is infergate as Envoy Gateway's extension server for
// InferencePool backends: Envoy Gateway (v1.9) routes an HTTPRoute to an
// InferencePool only through an extension that claims the kind, and hands
// it the pool's cluster and, after translating, all its resources. The
// pure core (cluster.go, translate.go) turns the pool's cluster into the
// ORIGINAL_DST one the pool's Endpoint Picker names the pod for, and puts
// the picker between infergate's gate and meter; Server is its gRPC
// adapter.
package gatewayext

import (
	"context"
	"fmt"
	"log/slog"

	pb "github.com/envoyproxy/gateway/proto/extension"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Routes reads an HTTPRoute's rules, each the backendRefs it lists (the
// namespace filled in, an unset weight 1).
type Routes interface {
	BackendRefs(ctx context.Context, namespace, name string) ([][]BackendRef, error)
}

// Server serves envoygateway.extension.EnvoyGatewayExtension. Envoy
// Gateway's hooks must be Cluster (PostClusterModify) and Translation
// (PostTranslateModify, with listener and route includeAll); the others
// answer "unchanged". An error makes Envoy Gateway keep its last good
// configuration (unless its extensionManager fails open).
type Server struct {
	pb.UnimplementedEnvoyGatewayExtensionServer
	Options Options
	Routes  Routes
	Log     *slog.Logger
}

// Register adds the service to gs.
func (s *Server) Register(gs grpc.ServiceRegistrar) { pb.RegisterEnvoyGatewayExtensionServer(gs, s) }

func (s *Server) fail(hook string, err error) error {
	s.Log.Error("envoy gateway extension: refused; Envoy Gateway keeps its last good configuration", "hook", hook, "err", err)
	return status.Error(codes.FailedPrecondition, err.Error())
}

// PostClusterModify makes an InferencePool's cluster ORIGINAL_DST. Envoy
// Gateway calls it for every cluster of a route with an extension
// resource, the route's Services' included: which backend a cluster is
// comes from its name and the HTTPRoute's backendRefs.
func (s *Server) PostClusterModify(ctx context.Context, req *pb.PostClusterModifyRequest) (*pb.PostClusterModifyResponse, error) {
	c := req.GetCluster()
	var pools []Pool
	for _, r := range req.GetPostClusterContext().GetBackendExtensionResources() {
		p, ok, err := ParsePool(r.GetUnstructuredBytes())
		if err != nil {
			return nil, s.fail("PostClusterModify", fmt.Errorf("cluster %q: %w", c.GetName(), err))
		}
		if ok {
			pools = append(pools, p)
		}
	}
	if len(pools) == 0 || c == nil {
		return &pb.PostClusterModifyResponse{Cluster: c}, nil
	}
	ref, ok := ParseClusterName(c.GetName())
	if !ok {
		return nil, s.fail("PostClusterModify", fmt.Errorf("cluster %q with an InferencePool is not an HTTPRoute's (httproute/<ns>/<name>/rule/<i>[/backend/<j>])", c.GetName()))
	}
	rules, err := s.Routes.BackendRefs(ctx, ref.Namespace, ref.Route)
	if err != nil {
		return nil, s.fail("PostClusterModify", fmt.Errorf("cluster %q: %w", c.GetName(), err))
	}
	p, ok, err := PoolOfCluster(ref, rules, pools)
	if err != nil {
		return nil, s.fail("PostClusterModify", fmt.Errorf("cluster %q: %w", c.GetName(), err))
	}
	if ok {
		OriginalDst(c, p)
		s.Log.Debug("envoy gateway extension: InferencePool cluster", "cluster", c.GetName(), "pool", p.key())
	}
	return &pb.PostClusterModifyResponse{Cluster: c}, nil
}

// PostTranslateModify puts the pools' pickers in the chains (Translate).
// Envoy Gateway takes the lists it returns as the final ones, the secrets
// included, so everything it passed goes back.
func (s *Server) PostTranslateModify(_ context.Context, req *pb.PostTranslateModifyRequest) (*pb.PostTranslateModifyResponse, error) {
	clusters, err := s.Options.Translate(req.GetClusters(), req.GetListeners(), req.GetRoutes())
	if err != nil {
		return nil, s.fail("PostTranslateModify", err)
	}
	return &pb.PostTranslateModifyResponse{Clusters: clusters, Secrets: req.GetSecrets(), Listeners: req.GetListeners(), Routes: req.GetRoutes()}, nil
}

// The hooks infergate does not need leave their resource as it is: a
// configuration that lists them still works.

func (s *Server) PostRouteModify(_ context.Context, req *pb.PostRouteModifyRequest) (*pb.PostRouteModifyResponse, error) {
	return &pb.PostRouteModifyResponse{Route: req.GetRoute()}, nil
}

func (s *Server) PostVirtualHostModify(_ context.Context, req *pb.PostVirtualHostModifyRequest) (*pb.PostVirtualHostModifyResponse, error) {
	return &pb.PostVirtualHostModifyResponse{VirtualHost: req.GetVirtualHost()}, nil
}

func (s *Server) PostHTTPListenerModify(_ context.Context, req *pb.PostHTTPListenerModifyRequest) (*pb.PostHTTPListenerModifyResponse, error) {
	return &pb.PostHTTPListenerModifyResponse{Listener: req.GetListener()}, nil
}

func (s *Server) PostEndpointsModify(_ context.Context, req *pb.PostEndpointsModifyRequest) (*pb.PostEndpointsModifyResponse, error) {
	return &pb.PostEndpointsModifyResponse{LoadAssignment: req.GetLoadAssignment()}, nil
}
