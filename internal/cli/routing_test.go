package cli

import (
	"reflect"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/routing"
	"github.com/infergate/infergate/xds/server"
)

// The routing gets every field of the configuration it acts on.
func TestRoutingOptions(t *testing.T) {
	no := false
	pools := []config.PoolRef{{Cluster: "a", Metrics: []string{"http://a/metrics"}, EndpointPicker: "a.epp"}, {Cluster: "b", Priority: 1}}
	cfg := &config.Config{
		XDS:        config.XDS{RouteConfigName: "routes"},
		WeightSink: config.WeightSink{Type: "virtualService", HTTPRoute: config.HTTPRouteFile{File: "f", Namespace: "hn", Name: "h"}, VirtualService: config.Resource{Namespace: "vn", Name: "v"}},
		VirtualModels: []config.VirtualModel{
			{Name: "across", Pools: pools, SLA: controller.SLA{ErrorRate: 0.1}, Tuning: controller.Tuning{Interval: time.Second},
				Retry: &config.RetryRule{Attempts: 2, On: "5xx", StatusCodes: []uint32{503}}},
			{Name: "within", Pools: pools, Retry: &config.RetryRule{Attempts: 1, AcrossPools: &no}},
			{Name: "none", Pools: pools[:1]},
		},
	}
	rpools := []routing.Pool{{Cluster: "a", Metrics: []string{"http://a/metrics"}, EndpointPicker: "a.epp"}, {Cluster: "b", Priority: 1}}
	want := routing.Options{
		RouteConfigName: "routes",
		WeightSink:      routing.WeightSinkOptions{Type: "virtualService", File: "f", Namespace: "vn", Name: "v"},
		VirtualModels: []routing.VirtualModel{
			{Name: "across", Pools: rpools, SLA: controller.SLA{ErrorRate: 0.1}, Tuning: controller.Tuning{Interval: time.Second},
				Retry: &server.Retry{Attempts: 2, On: "5xx", RetriableStatusCodes: []uint32{503}}, RetriesAcrossPools: true},
			{Name: "within", Pools: rpools, Retry: &server.Retry{Attempts: 1}},
			{Name: "none", Pools: rpools[:1]},
		},
	}
	if got := routingOptions(cfg); !reflect.DeepEqual(got, want) {
		t.Errorf("routingOptions:\n got %+v\nwant %+v", got, want)
	}
	cfg.WeightSink.Type = "httpRoute"
	if got := routingOptions(cfg).WeightSink; got != (routing.WeightSinkOptions{Type: "httpRoute", File: "f", Namespace: "hn", Name: "h"}) {
		t.Errorf("an httpRoute sink is %+v", got)
	}
}
