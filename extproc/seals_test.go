package extproc

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
	"github.com/infergate/infergate/internal/testutil/redisserver"
	"github.com/infergate/infergate/internal/testutil/slowproxy"
)

// tenantPolicy admits every request for the tenant its x-test-tenant
// header names, with a reservation of that tenant's.
type tenantPolicy struct{ capPolicy }

func (p *tenantPolicy) Decide(_ context.Context, a *request.Admission) request.Verdict {
	t := a.Headers["x-test-tenant"]
	return request.Verdict{Tenant: t, Principal: "k-" + t, Reservation: "res-" + t}
}

// admitFor runs one chat request through the gate for tenant: its
// answers.
func admitFor(s *Server, tenant string) []*extprocv3.ProcessingResponse {
	g := &gateRequest{started: time.Now(), eager: true}
	s.gateStep(context.Background(), g, headersMsg(false, append(slices.Clone(chatHeaders), "x-test-tenant", tenant)...))
	return s.gateStep(context.Background(), g, bodyMsg(`{"model":"pool-a","messages":[]}`, true))
}

// meterWith runs the meter over one response whose request carried the
// gate's field: the stamp recorded.
func meterWith(s *Server, sink *captureSink, field string) *request.Stamp {
	start := time.Now()
	m := s.newMeterRequest()
	m.observe(headersMsg(false, "x-request-id", "req-1", request.ModelHeader, "pool-a"), start)
	resp := respHeadersWith("application/json", field, time.Time{})
	resp.Attributes[attributesKey].Fields["xds.cluster_name"] = structpb.NewStringValue("pool-a")
	m.observe(resp, time.Now())
	m.observe(respBody(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`, true), time.Now())
	s.finish(context.Background(), m, time.Now(), true)
	return sink.stamps[len(sink.stamps)-1]
}

// fieldOf is the meter's field the gate wrote into an admitted request's
// metadata.
func fieldOf(out []*extprocv3.ProcessingResponse) string {
	return out[0].GetDynamicMetadata().GetFields()[request.MeterNamespace].GetStructValue().GetFields()[request.MeterKey].GetStringValue()
}

// One tenant holding its whole share of sealed fields (requests Envoy
// refused after the gate admitted them, never metered) has its next
// request refused 429 too_many_requests_in_flight, its reservation given
// back; another tenant's request is admitted, and its stamp names it and
// settles as before. Before, one table for all: once full, every
// tenant's stamp read unverified, under no tenant.
func TestFullTenantShareRefusedAtTheGate(t *testing.T) {
	s, sink, _, _ := alsServer(t)
	policy := &tenantPolicy{}
	s.policy = policy
	s.sealer = seal.Fields{Ring: processKeys(), Once: &seal.MemoryOnce{PerTenant: 2, Now: time.Now}, Longest: time.Hour}
	for range 2 { // leaked: admitted, never metered
		if out := admitFor(s, "greedy"); len(out) != 2 || fieldOf(out) == "" {
			t.Fatalf("within the share: %v", out)
		}
	}
	out := admitFor(s, "greedy")
	im := out[len(out)-1].GetImmediateResponse()
	if im == nil || im.GetStatus().GetCode() != http.StatusTooManyRequests || !strings.Contains(string(im.GetBody()), `"too_many_requests_in_flight"`) {
		t.Fatalf("past the share: %v", out)
	}
	if !slices.Contains(policy.released, "req-1 res-greedy") {
		t.Errorf("the refused request's reservation was not given back: %v", policy.released)
	}
	other := admitFor(s, "other")
	if len(other) != 2 {
		t.Fatalf("another tenant's request: %v", other)
	}
	st := meterWith(s, sink, fieldOf(other))
	if st.Tenant != "other" || st.Unverified || st.Verification != "" || len(policy.settled) != 1 ||
		policy.settled[0].Reservation != "res-other" || policy.settled[0].ClaimUncertain {
		t.Errorf("another tenant's stamp: tenant %q unverified %v verification %q; settled %+v", st.Tenant, st.Unverified, st.Verification, policy.settled)
	}
}

// A Redis slower than every try of the field's claim: the stamp keeps
// the tenant the sealed field named (marked claim_uncertain, counted), and
// its settlement keeps the reservation whole. Before, the request was
// recorded unverified, under no tenant, settling nothing.
func TestUncertainClaimKeepsTheTenant(t *testing.T) {
	srv := redisserver.Start(t)
	proxy := slowproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	s, sink, _, reader := alsServer(t)
	policy := &tenantPolicy{}
	s.policy = policy
	s.sealer = seal.Fields{Ring: processKeys(), Longest: time.Hour,
		Once: seal.RedisOnce{Client: rdb, Now: time.Now, Retry: seal.Retry{Attempts: 2, PerAttempt: time.Second, Total: time.Second}}}
	out := admitFor(s, "acme")
	if len(out) != 2 {
		t.Fatalf("admission: %v", out)
	}
	proxy.HoldAll(200 * time.Millisecond)
	st := meterWith(s, sink, fieldOf(out))
	proxy.Hold("", 0, 0)
	if st.Tenant != "acme" || st.Principal != "k-acme" || st.Unverified || st.Verification != request.ClaimUncertain {
		t.Errorf("stamp: tenant %q principal %q unverified %v verification %q", st.Tenant, st.Principal, st.Unverified, st.Verification)
	}
	if len(policy.settled) != 1 || !policy.settled[0].ClaimUncertain || policy.settled[0].Tenant != "acme" || policy.settled[0].Reservation != "res-acme" {
		t.Errorf("settlements %+v, want one of acme's, claim uncertain", policy.settled)
	}
	if n := meterErrors(t, reader, request.ClaimUncertain); n != 1 {
		t.Errorf("infergate.meter.errors{reason=claim_uncertain} = %d, want 1", n)
	}
}
