// Package server is infergate's xDS control plane. It owns the RDS
// RouteConfiguration that spreads each virtual model over its pools and,
// for virtual models that fall back across pools, the aggregate clusters
// those routes name (CDS; see AggregateName). It serves them over gRPC
// (RDS, CDS and ADS, state-of-the-world and delta) to any Envoy, whatever
// its node id.
//
// Everything else in Envoy's configuration (listeners, clusters, the
// ext_proc filter) stays the operator's: the route configuration only
// names clusters, so those must exist in Envoy's static config or come
// from another control plane.
//
// Resources carry no TTL and the snapshot cache does not heartbeat, so
// when this server is down or unreachable Envoy keeps routing with the
// last configuration it accepted, and picks up the current one when its
// xDS stream reconnects.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/infergate/infergate/internal/request"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
)

// nodeGroup is the single snapshot-cache key every Envoy node maps to.
const nodeGroup = "infergate"

// constantHash maps every Envoy node to nodeGroup, so all Envoys, whatever
// their node id, get the same snapshot.
type constantHash struct{}

func (constantHash) ID(*corev3.Node) string { return nodeGroup }

// Options configures a Server.
type Options struct {
	// RouteConfigName is the RDS resource name Envoy's HCM asks for;
	// default "infergate".
	RouteConfigName string
	// ExtraRoutes are Envoy routes appended verbatim after the virtual
	// models and before the fallback, e.g. a model name routed to one
	// cluster with options Route cannot express.
	ExtraRoutes []*routev3.Route
	// ResponseHeadersToAdd go on the virtual host, e.g. OpenAI's
	// x-ratelimit-* headers formatted from the gate's dynamic metadata.
	ResponseHeadersToAdd []*corev3.HeaderValueOption
	// NoFallback404 drops the final route that answers 404 with an
	// OpenAI-style JSON body for unknown models (on by default).
	NoFallback404 bool
	// ShutdownTimeout bounds the graceful stop once Serve's context is
	// done; default 5s.
	ShutdownTimeout time.Duration
	// MaxConcurrentStreams per gRPC connection; default 100.
	MaxConcurrentStreams uint32
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Server serves the infergate RouteConfiguration over xDS.
type Server struct {
	name     string
	extra    []*routev3.Route
	headers  []*corev3.HeaderValueOption
	fallback bool
	shutdown time.Duration
	streams  uint32
	log      *slog.Logger
	cache    cache.SnapshotCache

	mu      sync.Mutex
	version string
}

// New returns a Server with no routes yet: Envoys that connect wait until
// the first SetRoutes.
func New(opts Options) *Server {
	s := &Server{
		name:     opts.RouteConfigName,
		extra:    opts.ExtraRoutes,
		headers:  opts.ResponseHeadersToAdd,
		fallback: !opts.NoFallback404,
		shutdown: opts.ShutdownTimeout,
		streams:  opts.MaxConcurrentStreams,
		log:      opts.Logger,
	}
	if s.name == "" {
		s.name = DefaultRouteConfigName
	}
	if s.shutdown <= 0 {
		s.shutdown = 5 * time.Second
	}
	if s.streams == 0 {
		s.streams = 100
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "xds")
	s.cache = cache.NewSnapshotCache(false, constantHash{}, cacheLogger{s.log})
	return s
}

// Version is the version of the current snapshot, "" before the first
// successful SetRoutes.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// SetRoutes validates routes, builds the RouteConfiguration and publishes
// it to every connected and future Envoy. The version is a hash of the
// resource's content: identical routes give the same version and publish
// nothing. On error the previous snapshot stays in place.
func (s *Server) SetRoutes(routes []Route) (string, error) {
	rc, clusters, version, err := s.build(routes)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if version == s.version {
		return version, nil
	}
	res := map[resource.Type][]types.Resource{resource.RouteType: {rc}}
	// Always present, even empty: an Envoy taking CDS from us must hear
	// "no clusters" rather than wait.
	res[resource.ClusterType] = make([]types.Resource, 0, len(clusters))
	for _, c := range clusters {
		res[resource.ClusterType] = append(res[resource.ClusterType], c)
	}
	snap, err := cache.NewSnapshot(version, res)
	if err != nil {
		return "", fmt.Errorf("xds: snapshot: %w", err)
	}
	if err := consistent(snap, s.name); err != nil {
		return "", err
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeGroup, snap); err != nil {
		return "", fmt.Errorf("xds: set snapshot: %w", err)
	}
	s.log.Info("xds routes updated", "version", version, "virtual_models", len(routes))
	s.version = version
	return version, nil
}

// build is SetRoutes without side effects: the route configuration and
// the fallback aggregates it refers to, validated, and their version.
func (s *Server) build(routes []Route) (*routev3.RouteConfiguration, []*clusterv3.Cluster, string, error) {
	if err := ValidateRoutes(routes); err != nil {
		return nil, nil, "", fmt.Errorf("xds: invalid routes: %w", err)
	}
	rc := BuildRouteConfiguration(s.name, routes, s.fallback, s.extra...)
	rc.VirtualHosts[0].ResponseHeadersToAdd = s.headers
	if err := rc.ValidateAll(); err != nil {
		return nil, nil, "", fmt.Errorf("xds: invalid route configuration: %w", err)
	}
	var clusters []*clusterv3.Cluster
	for _, r := range routes {
		if len(r.Fallback) > 0 {
			clusters = append(clusters, aggregateClusters(r)...)
		}
	}
	slices.SortFunc(clusters, func(a, b *clusterv3.Cluster) int { return strings.Compare(a.Name, b.Name) })
	msgs := []proto.Message{rc}
	for _, c := range clusters {
		if err := c.ValidateAll(); err != nil {
			return nil, nil, "", fmt.Errorf("xds: invalid cluster %q: %w", c.Name, err)
		}
		msgs = append(msgs, c)
	}
	version, err := contentVersion(msgs...)
	if err != nil {
		return nil, nil, "", err
	}
	return rc, clusters, version, nil
}

// contentVersion hashes the deterministic encoding of msgs.
func contentVersion(msgs ...proto.Message) (string, error) {
	h := sha256.New()
	for _, m := range msgs {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return "", fmt.Errorf("xds: marshal: %w", err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// consistent checks the snapshot holds exactly the one route configuration
// Envoy's listeners ask for, plus the aggregate clusters its routes name
// and no others. The snapshot's own Consistent() cannot be used: it
// requires every RDS resource to be referenced by an LDS resource of the
// same snapshot, and the listeners are not ours.
func consistent(snap *cache.Snapshot, name string) error {
	for typ, res := range snap.Resources {
		switch types.ResponseType(typ) {
		case types.Route, types.Cluster:
		default:
			if len(res.Items) != 0 {
				return fmt.Errorf("xds: inconsistent snapshot: unexpected resources of type %d", typ)
			}
		}
	}
	routes := snap.GetResources(resource.RouteType)
	rc, ok := routes[name].(*routev3.RouteConfiguration)
	if !ok || len(routes) != 1 {
		return fmt.Errorf("xds: inconsistent snapshot: want exactly route configuration %q, have %d", name, len(routes))
	}
	clusters := snap.GetResources(resource.ClusterType)
	referenced := 0
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
				if !strings.HasPrefix(wc.GetName(), request.AggregatePrefix) {
					continue
				}
				if _, ok := clusters[wc.GetName()]; !ok {
					return fmt.Errorf("xds: inconsistent snapshot: route %q names cluster %q, which is missing", r.GetName(), wc.GetName())
				}
				referenced++
			}
		}
	}
	if referenced != len(clusters) {
		return fmt.Errorf("xds: inconsistent snapshot: %d clusters, %d referenced", len(clusters), referenced)
	}
	return nil
}

// Serve serves xDS on lis until ctx is done, then stops gracefully within
// ShutdownTimeout (xDS streams are closed first, so this is quick), and
// returns nil. It registers RDS and ADS, so Envoy may use either, and the
// services extra registers on the same server (Envoy Gateway's extension).
func (s *Server) Serve(ctx context.Context, lis net.Listener, extra ...func(grpc.ServiceRegistrar)) error {
	// The xDS streams end with ctx, before the graceful stop waits for them.
	xs := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typ string) error {
			s.log.Debug("xds stream open", "stream", id, "type", typ)
			return nil
		},
		StreamClosedFunc: func(id int64, node *corev3.Node) {
			s.log.Debug("xds stream closed", "stream", id, "node", node.GetId())
		},
		DeltaStreamOpenFunc: func(_ context.Context, id int64, typ string) error {
			s.log.Debug("xds delta stream open", "stream", id, "type", typ)
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, node *corev3.Node) {
			s.log.Debug("xds delta stream closed", "stream", id, "node", node.GetId())
		},
	})
	s.log.Info("xds serving", "addr", lis.Addr().String(), "route_config", s.name)
	return ServeGRPC(ctx, lis, GRPCOptions{MaxConcurrentStreams: s.streams, ShutdownTimeout: s.shutdown, Logger: s.log},
		append([]func(grpc.ServiceRegistrar){func(gs grpc.ServiceRegistrar) {
			discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xs)
			routeservice.RegisterRouteDiscoveryServiceServer(gs, xs)
			clusterservice.RegisterClusterDiscoveryServiceServer(gs, xs)
		}}, extra...)...)
}

// GRPCOptions are the control plane's gRPC server's; zero values are
// Options' defaults.
type GRPCOptions struct {
	MaxConcurrentStreams uint32
	ShutdownTimeout      time.Duration
	Logger               *slog.Logger
}

// ServeGRPC serves the services register adds on lis, with the control
// plane's keepalive, until ctx is done; then it stops gracefully within
// ShutdownTimeout and returns nil.
func ServeGRPC(ctx context.Context, lis net.Listener, o GRPCOptions, register ...func(grpc.ServiceRegistrar)) error {
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = 100
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	gs := grpc.NewServer(
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		// Envoy's HTTP/2 keepalive pings (connection_keepalive) are
		// welcome down to 10s, even with no stream open.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		// Detect dead Envoys so their watches are released.
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    30 * time.Second,
			Timeout: 10 * time.Second,
		}),
	)
	for _, r := range register {
		r(gs)
	}
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(o.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		o.Logger.Warn("xds graceful stop timed out; closing connections")
		gs.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	o.Logger.Info("xds stopped")
	return nil
}

// cacheLogger adapts slog to go-control-plane's logger.
type cacheLogger struct{ l *slog.Logger }

func (c cacheLogger) Debugf(format string, args ...any) {
	c.l.Debug(fmt.Sprintf(format, args...))
}

func (c cacheLogger) Infof(format string, args ...any) {
	c.l.Debug(fmt.Sprintf(format, args...))
}

func (c cacheLogger) Warnf(format string, args ...any) {
	c.l.Warn(fmt.Sprintf(format, args...))
}

func (c cacheLogger) Errorf(format string, args ...any) {
	c.l.Error(fmt.Sprintf(format, args...))
}
