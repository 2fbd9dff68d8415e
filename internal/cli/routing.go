package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/xds/gatewayext"
	"github.com/infergate/infergate/xds/routing"
	"github.com/infergate/infergate/xds/server"
	"github.com/infergate/infergate/xds/weightsink"
)

// newRouting builds the SLA routing of cfg's virtual models (nil without
// any); see routing.New.
func newRouting(ctx context.Context, cfg *config.Config, log *slog.Logger, meter metric.Meter, store redis.UniversalClient) (*routing.Service, error) {
	o := routingOptions(cfg)
	if len(o.VirtualModels) > 0 && (o.WeightSink.Type == "httpRoute" || o.WeightSink.Type == "virtualService") {
		klog.SetSlogLogger(log) // client-go logs through klog: one log, one format
	}
	return routing.New(ctx, o, log, meter, store)
}

// routingOptions are the routing's part of cfg.
func routingOptions(cfg *config.Config) routing.Options {
	o := routing.Options{RouteConfigName: cfg.XDS.RouteConfigName, WeightSink: routing.WeightSinkOptions{
		Type: cfg.WeightSink.Type, File: cfg.WeightSink.HTTPRoute.File,
		Namespace: cfg.WeightSink.HTTPRoute.Namespace, Name: cfg.WeightSink.HTTPRoute.Name}}
	if cfg.WeightSink.Type == "virtualService" {
		vs := cfg.WeightSink.VirtualService
		o.WeightSink.Namespace, o.WeightSink.Name = vs.Namespace, vs.Name
	}
	for _, vm := range cfg.VirtualModels {
		m := routing.VirtualModel{Name: vm.Name, SLA: vm.SLA, Tuning: vm.Tuning, RetriesAcrossPools: vm.RetriesAcrossPools()}
		for _, p := range vm.Pools {
			m.Pools = append(m.Pools, routing.Pool{Cluster: p.Cluster, Priority: p.Priority, Metrics: p.Metrics, EndpointPicker: p.EndpointPicker})
		}
		if vm.Retry != nil {
			m.Retry = &server.Retry{Attempts: vm.Retry.Attempts, On: vm.Retry.On, RetriableStatusCodes: vm.Retry.StatusCodes}
		}
		o.VirtualModels = append(o.VirtualModels, m)
	}
	return o
}

// newGatewayExtension is Envoy Gateway's extension server of
// cfg.gatewayExtension, to serve on the xDS listener: nil when it is off.
func newGatewayExtension(cfg *config.Config, log *slog.Logger) ([]func(grpc.ServiceRegistrar), error) {
	ge := cfg.GatewayExtension
	if !ge.Enabled {
		return nil, nil
	}
	kube, err := weightsink.Connect()
	if err != nil {
		return nil, fmt.Errorf("gatewayExtension: %w", err)
	}
	klog.SetSlogLogger(log)
	srv := &gatewayext.Server{
		Options: gatewayext.Options{PolicyNamespace: ge.Policy.Namespace, PolicyName: ge.Policy.Name,
			ClusterDomain: ge.ClusterDomain, PickerTLS: *ge.EndpointPickerTLS},
		Routes: gatewayext.KubeRoutes{Client: kube.Client},
		Log:    log.With("component", "gateway-extension"),
	}
	return []func(grpc.ServiceRegistrar){srv.Register}, nil
}
