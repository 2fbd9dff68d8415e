package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/testutil"
)

// unsentRoutes edits the demo so that admitted requests can fail inside
// Envoy before any pool is asked: model "nowhere" matches no route
// (route_not_found), "ghost" names a cluster that does not exist
// (cluster_not_found), "empty" a cluster with no hosts
// (no_healthy_upstream).
func unsentRoutes(t *testing.T, rendered string) string {
	t.Helper()
	rendered = replaceOnce(`              - match: {prefix: "/", headers: [{name: x-infergate-model, present_match: true}]}`,
		`              - match: {prefix: "/", headers: [{name: x-infergate-model, string_match: {exact: empty}}]}
                route: {cluster: empty, timeout: 0s}
              - match: {prefix: "/", headers: [{name: x-infergate-model, string_match: {exact: ghost}}]}
                route: {cluster_header: x-infergate-model, timeout: 0s}
              - match: {prefix: "/", headers: [{name: x-infergate-model, string_match: {exact: virtual}}]}`)(t, rendered)
	rendered = replaceOnce(`              - match: {prefix: "/"}
                direct_response:
                  status: 404
                  body: {inline_string: "no model route"}
`, "")(t, rendered)
	return replaceOnce("\n  clusters:\n", `
  clusters:
  - name: empty
    type: STATIC
    connect_timeout: 1s
    load_assignment: {cluster_name: empty, endpoints: []}
`)(t, rendered)
}

// A request the gate admitted and Envoy then answered itself, before any
// pool was asked (no route, no cluster, no host), gets its reservation
// back whole: Envoy's own response.code_details, read by the meter, prove
// it. Counted by details in infergate.meter.unsent. A model the gate would
// put in a header that Envoy refuses (a control character) is refused 400
// before anything is reserved. Through the real Envoy and the money
// budget: the dollars charged between two identical requests are those of
// the first alone, whatever was refused in between.
func TestEnvoyRefusalAfterAdmissionIsReleased(t *testing.T) {
	inOneWindow(t)
	prices := `
prices:
  currency: USD
  models:
    pool-a: {input: 100, output: 400}
    nowhere: {input: 10, output: 40}
    ghost: {input: 10, output: 40}
    empty: {input: 10, output: 40}
`
	config := policyConfig(moneyKeys(t), moneyPolicies(t), prices)
	s := startStackFor(t, "", func(*stack) string { return config }, 1)
	s.Envoy = startEnvoy(t, "envoy/demo.yaml", []string{s.Gateway.ExtProcAddr}, s.Gateway.XDSAddr, s.PoolA.Addr, s.PoolB.Addr, unsentRoutes)
	hdr := map[string]string{"authorization": "Bearer sk-moneya", "x-mock-ttft-ms": "0", "x-mock-itl-ms": "0"}
	settled := func(n int) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() bool {
			return metricSum(t, s.Gateway.AdminURL, "infergate_ratelimit_reservations_total", `state="settled"`) == float64(n)
		}, "every reservation so far to be settled or released")
	}
	remaining := func() int64 {
		t.Helper()
		r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody("pool-a", 8, false, ""), hdr)
		if r.Status != 200 {
			t.Fatalf("a pool-a request: %d %s", r.Status, r.Body)
		}
		return pico(t, r.Header.Get("x-ratelimit-remaining-money"))
	}
	first := remaining()
	settled(1)
	second := remaining()
	settled(2)
	oneRequest := first - second // what a pool-a request is charged, once settled

	for _, tc := range []struct {
		model  string
		status int
	}{{"nowhere", 404}, {"ghost", 503}, {"empty", 503}} {
		r := stream(t, s.Envoy.URL+"/v1/chat/completions", chatBody(tc.model, 64, false, ""), hdr)
		if r.Status != tc.status {
			t.Errorf("model %s: %d %s, want Envoy's %d", tc.model, r.Status, r.Body, tc.status)
		}
		// No route: OpenAI's error for a model not served, naming it (the
		// demo's local_reply_config), not an empty message.
		if body := string(r.Body); tc.model == "nowhere" && (!strings.Contains(body, `"code":"model_not_found"`) || !strings.Contains(body, "`nowhere` does not exist")) {
			t.Errorf("model %s: body %s, want model_not_found naming it", tc.model, r.Body)
		}
	}
	r := stream(t, s.Envoy.URL+"/v1/chat/completions", strings.Replace(chatBody("pool-a", 64, false, ""), `"pool-a"`, `"pool-a\u0001x"`, 1), hdr)
	if r.Status != http.StatusBadRequest {
		t.Errorf("a model with a control character: %d %s, want 400", r.Status, r.Body)
	}
	settled(5) // the three refused by Envoy, released; nothing reserved for the 400
	third := remaining()
	if second-third != oneRequest {
		t.Errorf("between two pool-a requests the budget moved by %s, want %s (the first's charge alone: nothing kept for Envoy's refusals)",
			price.FormatCost(second-third), price.FormatCost(oneRequest))
	}
	for _, details := range []string{"route_not_found", "cluster_not_found", "no_healthy_upstream"} {
		if n := metricSum(t, s.Gateway.AdminURL, "infergate_meter_unsent_total", `details="`+details+`"`); n != 1 {
			t.Errorf("infergate_meter_unsent_total{details=%q} = %v, want 1", details, n)
		}
	}
}
