package server

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestBuildRouteConfigurationSmall(t *testing.T) {
	got := BuildRouteConfiguration("infergate", []Route{
		{VirtualModel: "llama", Weights: map[string]uint32{"pool-b": 0, "pool-a": 100}},
	}, false)
	want := &routev3.RouteConfiguration{
		Name: "infergate",
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "infergate",
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Name: "llama",
				Match: &routev3.RouteMatch{
					PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
					Headers: []*routev3.HeaderMatcher{{
						Name: "x-infergate-model",
						HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
							MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "llama"},
						}},
					}},
				},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{
						Clusters: []*routev3.WeightedCluster_ClusterWeight{
							{Name: "pool-a", Weight: wrapperspb.UInt32(100)},
							{Name: "pool-b", Weight: wrapperspb.UInt32(0)},
						},
					}},
					Timeout:              durationpb.New(0),
					HostRewriteSpecifier: &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)},
				}},
			}},
		}},
	}
	if !proto.Equal(want, got) {
		t.Fatalf("route configuration:\n%s\nwant:\n%s", prototext.Format(got), prototext.Format(want))
	}
	if err := got.ValidateAll(); err != nil {
		t.Fatal(err)
	}
}

// A pool behind an Endpoint Picker keeps its picker; the other pools' share
// of the route turns it off, so a request sent to the backup is not picked
// a pod for.
func TestBuildRoutePickersOffForOtherPools(t *testing.T) {
	rc := BuildRouteConfiguration("infergate", []Route{{
		VirtualModel: "llama",
		Weights:      map[string]uint32{"inference-pool": 60, "backup": 40},
		Pickers:      map[string]string{"inference-pool": "inference-pool.epp"},
	}}, false)
	if err := rc.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, cw := range rc.VirtualHosts[0].Routes[0].GetRoute().GetWeightedClusters().GetClusters() {
		for filter, cfg := range cw.TypedPerFilterConfig {
			var pr extprocv3.ExtProcPerRoute
			if err := cfg.UnmarshalTo(&pr); err != nil || !pr.GetDisabled() {
				t.Errorf("%s: %s's config %v is not ext_proc disabled (%v)", cw.Name, filter, cfg, err)
			}
			got[cw.Name] = append(got[cw.Name], filter)
		}
	}
	if want := map[string][]string{"backup": {"inference-pool.epp"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("filters turned off per cluster: %v, want %v", got, want)
	}
}

func TestBuildRouteConfigurationOrderRetryFallback(t *testing.T) {
	extra := &routev3.Route{
		Name:   "pinned",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "pool-a"}}},
	}
	rc := BuildRouteConfiguration("llm", []Route{
		{VirtualModel: "zeta", Weights: map[string]uint32{"b": 1}, Timeout: 30 * time.Second,
			Retry: &Retry{Attempts: 2, PerTryTimeout: 5 * time.Second}},
		{VirtualModel: "alpha", Weights: map[string]uint32{"a": 1}},
	}, true, extra)
	if err := rc.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	var names []string
	for _, r := range routes {
		names = append(names, r.GetName())
	}
	if got := strings.Join(names, ","); got != "alpha,zeta,pinned,"+FallbackRouteName {
		t.Fatalf("route order %s", got)
	}
	zeta := routes[1].GetRoute()
	if zeta.GetTimeout().AsDuration() != 30*time.Second {
		t.Errorf("timeout %v", zeta.GetTimeout())
	}
	rp := zeta.GetRetryPolicy()
	if rp.GetRetryOn() != DefaultRetryOn || rp.GetNumRetries().GetValue() != 2 ||
		rp.GetPerTryTimeout().AsDuration() != 5*time.Second ||
		!slices.Equal(rp.GetRetriableStatusCodes(), []uint32{429}) ||
		len(rp.GetRetryHostPredicate()) != 1 ||
		rp.GetRetryHostPredicate()[0].GetName() != "envoy.retry_host_predicates.previous_hosts" {
		t.Errorf("retry policy %v", rp)
	}
	if routes[0].GetRoute().GetRetryPolicy() != nil {
		t.Error("retry policy without Retry")
	}
	fb := routes[3]
	if fb.GetMatch().GetHeaders() != nil || fb.GetDirectResponse().GetStatus() != 404 ||
		fb.GetDirectResponse().GetBodyFormat().GetContentType() != "application/json" {
		t.Errorf("fallback %v", fb)
	}
	// Nothing may expire while the control plane is away.
	b, _ := protojson.Marshal(rc)
	if strings.Contains(strings.ToLower(string(b)), "ttl") {
		t.Errorf("TTL in route configuration: %s", b)
	}
}

func TestRetryCustom(t *testing.T) {
	rp := buildRetry(&Retry{Attempts: 1, On: "connect-failure"})
	if rp.GetRetryOn() != "connect-failure" || rp.GetRetriableStatusCodes() != nil || rp.GetPerTryTimeout() != nil {
		t.Errorf("retry policy %v", rp)
	}
	rp = buildRetry(&Retry{Attempts: 1, On: "retriable-status-codes", RetriableStatusCodes: []uint32{503, 429}})
	if !slices.Equal(rp.GetRetriableStatusCodes(), []uint32{503, 429}) {
		t.Errorf("retry policy %v", rp)
	}
}

func TestValidateRoutes(t *testing.T) {
	ok := map[string]uint32{"a": 1}
	for _, tc := range []struct {
		name   string
		routes []Route
		want   string // substring of the error; "" = valid
	}{
		{"valid", []Route{{VirtualModel: "m", Weights: map[string]uint32{"a": 0, "b": 3}}}, ""},
		{"no routes", nil, ""},
		{"empty model", []Route{{Weights: ok}}, "empty virtual model"},
		{"duplicate", []Route{{VirtualModel: "m", Weights: ok}, {VirtualModel: "m", Weights: ok}}, "duplicate"},
		{"no clusters", []Route{{VirtualModel: "m"}}, "no clusters"},
		{"zero total", []Route{{VirtualModel: "m", Weights: map[string]uint32{"a": 0, "b": 0}}}, "total 0"},
		{"overflow", []Route{{VirtualModel: "m", Weights: map[string]uint32{"a": 1 << 31, "b": 1 << 31}}}, "overflows"},
		{"empty cluster", []Route{{VirtualModel: "m", Weights: map[string]uint32{"": 1}}}, "empty cluster"},
		{"negative timeout", []Route{{VirtualModel: "m", Weights: ok, Timeout: -time.Second}}, "negative timeout"},
		{"picker", []Route{{VirtualModel: "m", Weights: map[string]uint32{"a": 1, "b": 0}, Pickers: map[string]string{"a": "a.epp"}}}, ""},
		{"picker of no pool", []Route{{VirtualModel: "m", Weights: ok, Pickers: map[string]string{"b": "b.epp"}}}, "the pool must be in the route"},
		{"picker unnamed", []Route{{VirtualModel: "m", Weights: ok, Pickers: map[string]string{"a": ""}}}, "the filter named"},
		{"picker with fallback", []Route{{VirtualModel: "m", Weights: ok, Fallback: []string{"a"}, Pickers: map[string]string{"a": "a.epp"}}}, "cannot go to the next pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRoutes(tc.routes)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSetRoutesVersion(t *testing.T) {
	s := New(Options{})
	if s.Version() != "" {
		t.Fatal("version before SetRoutes")
	}
	routes := []Route{
		{VirtualModel: "b", Weights: map[string]uint32{"x": 1, "y": 2, "z": 3}},
		{VirtualModel: "a", Weights: map[string]uint32{"x": 1}},
	}
	v1, err := s.SetRoutes(routes)
	if err != nil || v1 == "" {
		t.Fatal(v1, err)
	}
	// Same content in another order: same version, from this server and
	// from a fresh one.
	v2, err := s.SetRoutes([]Route{routes[1], routes[0]})
	if err != nil || v2 != v1 {
		t.Fatalf("identical routes: version %q then %q (%v)", v1, v2, err)
	}
	v3, _ := New(Options{}).SetRoutes(routes)
	if v3 != v1 {
		t.Fatalf("fresh server: version %q, want %q", v3, v1)
	}
	routes[1].Weights = map[string]uint32{"x": 2}
	v4, err := s.SetRoutes(routes)
	if err != nil || v4 == v1 {
		t.Fatalf("changed routes: version %q (%v)", v4, err)
	}
	// Invalid routes leave the current snapshot alone.
	if _, err := s.SetRoutes([]Route{{VirtualModel: "m"}}); err == nil {
		t.Fatal("invalid routes accepted")
	}
	if s.Version() != v4 {
		t.Fatalf("version %q after invalid routes, want %q", s.Version(), v4)
	}
	snap, err := s.cache.GetSnapshot("any-node-maps-to-the-group-key-not-this")
	if err == nil || snap != nil {
		t.Fatal("snapshot stored under a node id")
	}
	if _, err := s.cache.GetSnapshot(constantHash{}.ID(nil)); err != nil {
		t.Fatal(err)
	}
	// The name and fallback options change the resource.
	v5, _ := New(Options{RouteConfigName: "other"}).SetRoutes(routes)
	v6, _ := New(Options{NoFallback404: true}).SetRoutes(routes)
	if v5 == v4 || v6 == v4 || v5 == v6 {
		t.Fatalf("versions %q %q %q", v4, v5, v6)
	}
}

func TestUnknownModelBodyIsJSONFormat(t *testing.T) {
	body := unknownModelRoute().GetDirectResponse().GetBodyFormat().GetJsonFormat()
	b, err := json.Marshal(body.AsMap())
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Error struct{ Code, Type, Param string }
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Error.Code != "model_not_found" || v.Error.Param != "model" {
		t.Fatalf("%s: %v", b, err)
	}
}
