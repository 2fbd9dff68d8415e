package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/wasmmeter"
	"github.com/infergate/infergate/xds/controller"
	"github.com/infergate/infergate/xds/feed"
)

// observations counts what a stamp would feed the SLA controller.
type observations struct{ n int }

func (o *observations) Record(_ context.Context, st *request.Stamp) {
	feed.Observations(st, func(controller.Observation) { o.n++ })
}

// Only a sealed gate field that verifies, once, says who called: a field
// with its tenant changed, an unsealed one naming a tenant, or a replay of
// a genuine one is recorded under no tenant, settles nothing, feeds no
// controller observation nor the GenAI metrics, and is counted. Both ways a stamp arrives: the
// in-Envoy meter's access-log summary and the ext_proc meter's stream.
// Before, the field was free text and every one of them was believed.
func TestForgedGateFieldIsNotTrusted(t *testing.T) {
	start := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	sum := wasmmeter.Summary{Start: start.Add(time.Millisecond), Complete: true, Usage: &openai.Usage{PromptTokens: 1, CompletionTokens: 1},
		E2E: 10 * time.Millisecond}

	for _, via := range []string{"access log", "ext_proc"} {
		t.Run(via, func(t *testing.T) {
			genuine := sealed(&gateField{sent: start.UnixMicro(), decision: "allow", requestID: "r", model: "pool-a",
				tenant: "t1", principal: "k1", reservation: "r-1"})
			forged := strings.Replace(genuine, "|t1|k1|", "|t2|k2|", 1)
			if forged == genuine {
				t.Fatal("the tenant is not where the test looks for it")
			}
			unsealed := (&gateField{decision: "allow", requestID: "r", model: "pool-a", tenant: "t2", principal: "k2", reservation: "r-1"}).encode()
			s, sink, policy, reader := alsServer(t)
			obs := &observations{}
			s.sinks = append(s.sinks, obs)
			stamp := func(field string) *request.Stamp {
				t.Helper()
				if via == "access log" {
					e := entryWith(t, sum.Encode(), start, nil)
					e.CommonProperties.Metadata.FilterMetadata[request.MeterNamespace].Fields[request.MeterKey] = structpb.NewStringValue(field)
					s.meterEntry(context.Background(), e)
				} else {
					m := s.newMeterRequest()
					// Read as the gate answered: a read a second later would be a late one.
					m.observe(headersMsg(false, "x-request-id", "r", request.ModelHeader, "pool-a"), start.Add(time.Millisecond))
					resp := respHeadersWith("application/json", field, time.Time{})
					resp.Attributes[attributesKey].Fields["xds.cluster_name"] = structpb.NewStringValue("pool-a")
					m.observe(resp, time.Now())
					m.observe(respBody(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`, true), time.Now())
					s.finish(context.Background(), m, time.Now(), true)
				}
				return sink.stamps[len(sink.stamps)-1]
			}

			if st := stamp(genuine); st.Tenant != "t1" || st.Principal != "k1" || st.Unverified || len(policy.settled) != 1 || obs.n != 1 {
				t.Fatalf("genuine field: tenant %q principal %q unverified %v, %d settlements, %d observations", st.Tenant, st.Principal,
					st.Unverified, len(policy.settled), obs.n)
			}
			usage := histogramCount(t, reader, "gen_ai.server.request.duration")
			if usage == 0 {
				t.Fatal("the genuine stamp is not in gen_ai.server.request.duration")
			}
			for i, field := range []string{forged, unsealed, genuine /* a replay */, ""} {
				st := stamp(field)
				if st.Tenant != "" || st.Principal != "" || !st.Unverified || st.Decision != "unverified" {
					t.Errorf("field %d: recorded as tenant %q principal %q decision %q", i, st.Tenant, st.Principal, st.Decision)
				}
				if len(policy.settled) != 1 || obs.n != 1 {
					t.Errorf("field %d: %d settlements, %d observations; want the genuine one's alone", i, len(policy.settled), obs.n)
				}
				if got := histogramCount(t, reader, "gen_ai.server.request.duration"); got != usage {
					t.Errorf("field %d: gen_ai.server.request.duration holds %d values, the genuine stamp's %d", i, got, usage)
				}
				if got := meterErrors(t, reader, "unverified"); got != int64(i+1) {
					t.Errorf("field %d: %d counted unverified", i, got)
				}
			}
		})
	}
}
