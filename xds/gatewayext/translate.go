package gatewayext

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfigv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Options are what the translation hook needs besides Envoy Gateway's
// resources.
type Options struct {
	// PolicyNamespace and PolicyName name the EnvoyExtensionPolicy whose
	// extProc 0 is infergate's gate and extProc 1 its meter.
	PolicyNamespace, PolicyName string
	// ClusterDomain is the cluster's DNS domain (cluster.local).
	ClusterDomain string
	// PickerTLS connects to the pickers over TLS, their certificate not
	// verified; false is plaintext.
	PickerTLS bool
}

// GateFilterName and MeterFilterName are Envoy Gateway's names for the
// policy's ext_proc filters (internal/gatewayapi irConfigNameForExtProc,
// prefixed with the filter type).
func (o Options) GateFilterName() string  { return o.extProcFilter(0) }
func (o Options) MeterFilterName() string { return o.extProcFilter(1) }

func (o Options) extProcFilter(i int) string {
	return fmt.Sprintf("envoy.filters.http.ext_proc/envoyextensionpolicy/%s/%s/extproc/%d", o.PolicyNamespace, o.PolicyName, i)
}

const hcmFilter = "envoy.filters.network.http_connection_manager"

// pickerOff turns a picker's filter off for a route or a weighted cluster.
// ext_proc reads it when the request headers reach it, after the gate has
// re-resolved the route, so the route the gate chose decides.
var pickerOff = mustAny(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})

// NoRouteFilterName is the filter that, right after the gate, refuses a
// request no route matches before it reaches a picker: Envoy Gateway's gate
// runs only where a route enables it, and a picker's filter runs wherever
// no route turns it off, so without it a request for an unknown host would
// reach the pickers ungated. Every route of the configuration turns it off.
const NoRouteFilterName = "infergate.endpoint-picker/no-route"

var (
	noRouteOff = mustAny(&rbacv3.RBACPerRoute{})
	noRoute    = mustAny(&rbacv3.RBAC{Rules: &rbacconfigv3.RBAC{
		Action: rbacconfigv3.RBAC_DENY,
		Policies: map[string]*rbacconfigv3.Policy{"no-route": {
			Permissions: []*rbacconfigv3.Permission{{Rule: &rbacconfigv3.Permission_Any{Any: true}}},
			Principals:  []*rbacconfigv3.Principal{{Identifier: &rbacconfigv3.Principal_Any{Any: true}}},
		}},
	}})
)

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// Translate puts each InferencePool's Endpoint Picker in front of it, in
// the resources Envoy Gateway translated (its PostTranslateModify hook):
// the pools' clusters are those PostClusterModify made ORIGINAL_DST. Every
// HTTP connection manager whose routes reach a pool gets the pool's picker
// right after infergate's gate (and so before its meter), on in the chain
// and off on every route and weighted cluster that goes elsewhere; each
// picker gets its gRPC cluster. listeners and routes are changed in place;
// the clusters are returned, the pickers' added. Without a pool cluster
// nothing changes. A chain that reaches a pool without the gate in it, or
// resources Envoy Gateway left out (its translation hook passes listeners
// and routes only with includeAll), is an error: no picker goes unguarded.
func (o Options) Translate(clusters []*clusterv3.Cluster, listeners []*listenerv3.Listener, routes []*routev3.RouteConfiguration) ([]*clusterv3.Cluster, error) {
	pools := map[string]Pool{} // by cluster name
	for _, c := range clusters {
		if p, ok := poolOf(c); ok {
			pools[c.GetName()] = p
		}
	}
	if len(pools) == 0 {
		return clusters, nil
	}
	if len(routes) == 0 || len(listeners) == 0 {
		return nil, errors.New("InferencePool clusters but no routes or listeners passed: Envoy Gateway's " +
			"extensionManager.hooks.xdsTranslator.translation needs listener and route includeAll: true")
	}
	// The pools each route configuration reaches, their pickers turned off
	// on its routes to elsewhere.
	reached := map[string][]Pool{}
	rcs := map[string]*routev3.RouteConfiguration{}
	for _, rc := range routes {
		rcs[rc.GetName()] = rc
		restoreBackends(rc, pools)
		ps, err := pickersOff(rc, pools)
		if err != nil {
			return nil, err
		}
		if len(ps) > 0 {
			reached[rc.GetName()] = ps
		}
	}
	served := map[string]bool{}
	for _, l := range listeners {
		for _, fc := range append(slices.Clone(l.GetFilterChains()), l.GetDefaultFilterChain()) {
			for _, f := range fc.GetFilters() {
				if f.GetName() != hcmFilter || f.GetTypedConfig() == nil {
					continue
				}
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					return nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
				}
				rc, ps := rcs[hcm.GetRds().GetRouteConfigName()], reached[hcm.GetRds().GetRouteConfigName()]
				if inline := hcm.GetRouteConfig(); inline != nil {
					var err error
					rc = inline
					restoreBackends(inline, pools)
					if ps, err = pickersOff(inline, pools); err != nil {
						return nil, err
					}
				}
				if len(ps) == 0 {
					continue
				}
				gateOff, err := o.insertPickers(hcm, ps)
				if err != nil {
					return nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
				}
				if gateOff {
					if err := o.gateOnPoolRoutes(rc, pools); err != nil {
						return nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
					}
				}
				a, err := anypb.New(hcm)
				if err != nil {
					return nil, err
				}
				f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
				served[hcm.GetRds().GetRouteConfigName()] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(reached)) {
		if !served[name] {
			return nil, fmt.Errorf("route configuration %q reaches an InferencePool but no listener passed uses it "+
				"(Envoy Gateway's translation hook needs listener includeAll: true)", name)
		}
	}
	out := slices.Clone(clusters)
	have := map[string]bool{}
	for _, c := range clusters {
		have[c.GetName()] = true
	}
	for _, cname := range slices.Sorted(maps.Keys(pools)) {
		p := pools[cname]
		if name := PickerClusterName(p); !have[name] {
			have[name] = true
			pc, err := o.pickerCluster(p)
			if err != nil {
				return nil, err
			}
			out = append(out, pc)
		}
	}
	return out, nil
}

// pickersOff turns each reached pool's picker off on rc's routes and
// weighted clusters that go elsewhere, and returns the pools rc reaches
// (sorted). A route whose cluster only the request can tell (a cluster
// header, a plugin) in a configuration that reaches a pool is an error.
func pickersOff(rc *routev3.RouteConfiguration, pools map[string]Pool) ([]Pool, error) {
	byKey := map[string]Pool{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, c := range routeClusters(r) {
				if p, ok := pools[c]; ok {
					byKey[p.key()] = p
				}
			}
		}
	}
	if len(byKey) == 0 {
		return nil, nil
	}
	reached := make([]Pool, 0, len(byKey))
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		reached = append(reached, byKey[k])
	}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.TypedPerFilterConfig == nil {
				r.TypedPerFilterConfig = map[string]*anypb.Any{}
			}
			r.TypedPerFilterConfig[NoRouteFilterName] = noRouteOff
			action := r.GetRoute()
			switch {
			case action.GetClusterHeader() != "" || action.GetClusterSpecifierPlugin() != "" || action.GetInlineClusterSpecifierPlugin() != nil:
				return nil, fmt.Errorf("route configuration %q route %q: its cluster is chosen per request; cannot tell whether it reaches an InferencePool",
					rc.GetName(), r.GetName())
			case action.GetWeightedClusters() != nil:
				for _, cw := range action.GetWeightedClusters().GetClusters() {
					for _, p := range reached {
						if q, ok := pools[cw.GetName()]; !ok || q.key() != p.key() {
							cw.TypedPerFilterConfig = withPickerOff(cw.TypedPerFilterConfig, p)
						}
					}
				}
			default: // one cluster, or no upstream (a redirect, a direct response)
				for _, p := range reached {
					if q, ok := pools[action.GetCluster()]; !ok || q.key() != p.key() {
						r.TypedPerFilterConfig = withPickerOff(r.TypedPerFilterConfig, p)
					}
				}
			}
		}
	}
	return reached, nil
}

func routeClusters(r *routev3.Route) []string {
	action := r.GetRoute()
	if c := action.GetCluster(); c != "" {
		return []string{c}
	}
	var out []string
	for _, cw := range action.GetWeightedClusters().GetClusters() {
		out = append(out, cw.GetName())
	}
	return out
}

func withPickerOff(m map[string]*anypb.Any, p Pool) map[string]*anypb.Any {
	if m == nil {
		m = map[string]*anypb.Any{}
	}
	m[PickerFilterName(p)] = pickerOff
	return m
}

// gateOnPoolRoutes checks that every route of rc that reaches a pool turns
// the gate on, where the chain has it off (Envoy Gateway enables a
// policy's filters per route): a route to a pool that another HTTPRoute,
// one the gate's policy does not target, brings to the same listener would
// otherwise reach the picker ungated.
func (o Options) gateOnPoolRoutes(rc *routev3.RouteConfiguration, pools map[string]Pool) error {
	gate := o.GateFilterName()
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if !slices.ContainsFunc(routeClusters(r), func(c string) bool { _, ok := pools[c]; return ok }) {
				continue
			}
			cfg := r.GetTypedPerFilterConfig()[gate]
			if cfg == nil {
				cfg = vh.GetTypedPerFilterConfig()[gate]
			}
			if !turnsOn(cfg) {
				return fmt.Errorf("route %q reaches an InferencePool but infergate's gate (%s) is off on it: "+
					"the EnvoyExtensionPolicy must target the route", r.GetName(), gate)
			}
		}
	}
	return nil
}

// turnsOn reports whether a per-route config turns on a filter that is off
// in the chain: any config but one that disables it.
func turnsOn(a *anypb.Any) bool {
	if a == nil {
		return false
	}
	fc := &routev3.FilterConfig{}
	if a.MessageIs(fc) {
		if a.UnmarshalTo(fc) != nil || fc.GetDisabled() {
			return false
		}
		a = fc.GetConfig()
		if a == nil || a.GetTypeUrl() == "" {
			return true
		}
	}
	pr := &extprocv3.ExtProcPerRoute{}
	if a.MessageIs(pr) {
		return a.UnmarshalTo(pr) == nil && !pr.GetDisabled()
	}
	return true
}

// insertPickers puts the no-route guard and the pools' pickers right after
// the gate, in order, and reports whether the gate is off in the chain.
func (o Options) insertPickers(hcm *hcmv3.HttpConnectionManager, pools []Pool) (gateOff bool, err error) {
	filters := hcm.GetHttpFilters()
	gate, meter := -1, -1
	for i, f := range filters {
		switch f.GetName() {
		case o.GateFilterName():
			gate = i
		case o.MeterFilterName():
			meter = i
		}
	}
	if gate < 0 {
		return false, fmt.Errorf("its routes reach InferencePool %s but infergate's gate (%s) is not in its chain: "+
			"no picker without the gate in front (is gatewayExtension.policy the EnvoyExtensionPolicy that targets the route?)",
			pools[0].key(), o.GateFilterName())
	}
	if meter >= 0 && meter < gate {
		return false, fmt.Errorf("infergate's meter (%s) comes before its gate", o.MeterFilterName())
	}
	var add []*hcmv3.HttpFilter
	if !slices.ContainsFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == NoRouteFilterName }) {
		add = append(add, &hcmv3.HttpFilter{Name: NoRouteFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: noRoute}})
	}
	for _, p := range pools {
		if slices.ContainsFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == PickerFilterName(p) }) {
			continue
		}
		f, err := o.pickerFilter(p)
		if err != nil {
			return false, err
		}
		add = append(add, f)
	}
	hcm.HttpFilters = slices.Insert(slices.Clone(filters), gate+1, add...)
	return filters[gate].GetDisabled(), nil
}

// pickerTimeout bounds one message to the picker: with a streamed body the
// picker holds the request until it has read enough of it to choose, and
// then passes the stream through (the Inference Extension's own Envoy
// configuration allows 1000s).
const pickerTimeout = 1000 * time.Second

// pickerFilter is the pool's Endpoint Picker, as the Inference Extension
// runs it: headers, both bodies full-duplex streamed and the trailers.
func (o Options) pickerFilter(p Pool) (*hcmv3.HttpFilter, error) {
	a, err := anypb.New(&extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: PickerClusterName(p), Authority: o.pickerHost(p)}},
		},
		FailureModeAllow: p.FailOpen,
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
			ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
			ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
		},
		MessageTimeout: durationpb.New(pickerTimeout),
	})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: PickerFilterName(p), ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}, nil
}

func (o Options) pickerHost(p Pool) string {
	return p.Picker + "." + p.Namespace + ".svc." + o.ClusterDomain
}

// pickerCluster is the picker's Service, by its cluster DNS name, over
// HTTP/2; TLS (h2 by ALPN, as gRPC servers require) without verifying the
// certificate unless o says plaintext.
func (o Options) pickerCluster(p Pool) (*clusterv3.Cluster, error) {
	h2, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, err
	}
	name := PickerClusterName(p)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
					Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: o.pickerHost(p), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: p.PickerPort}}}}}},
			}}}},
		},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2},
	}
	if o.PickerTLS {
		tc, err := anypb.New(&tlsv3.UpstreamTlsContext{
			Sni:              o.pickerHost(p),
			CommonTlsContext: &tlsv3.CommonTlsContext{AlpnProtocols: []string{"h2"}},
		})
		if err != nil {
			return nil, err
		}
		c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tc}}
	}
	return c, nil
}
