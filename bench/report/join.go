package report

import (
	"fmt"

	"github.com/infergate/infergate/bench/result"
)

// joinView is the "where the time went" table of a --join run.
type joinView struct {
	Source  string
	Summary string
	Rows    []joinRow
}

type joinRow struct {
	Phase, Note          string
	P50, P90, P99, Mean  string
	Indent               bool
	SharePct, ShareLabel string // of the client's mean E2E: bar width (px of 100) and label
}

func join(j *result.Join) *joinView {
	if j == nil {
		return nil
	}
	v := &joinView{Source: j.Source, Summary: fmt.Sprintf("%d of %d requests joined with the gateway's records", j.Joined, j.Requests)}
	total := j.ClientMs.Mean
	for _, p := range []struct {
		phase, note string
		d           result.Dist
		indent      bool
	}{
		{"client E2E", "as the load generator saw it", j.ClientMs, false},
		{"gateway", "Envoy and infergate before the request left: auth, policy, limits, routing", j.GatewayMs, true},
		{"moderation", "external checks the policy required", j.ModerationMs, true},
		{"upstream to first token", "queueing and prefill at the model server", j.UpstreamFirstTokenMs, true},
		{"decode", "first token to the last byte", j.DecodeMs, true},
		{"outside the gateway", "network both ways, the client's own stack, Envoy's response path", j.OutsideMs, true},
	} {
		r := joinRow{Phase: p.phase, Note: p.note, Indent: p.indent,
			P50: num(p.d.P50), P90: num(p.d.P90), P99: num(p.d.P99), Mean: num(p.d.Mean)}
		if p.indent && total > 0 && finite(p.d.Mean) {
			share := max(0, min(100, 100*p.d.Mean/total))
			r.SharePct, r.ShareLabel = fmt.Sprintf("%.1fpx", share), fmt.Sprintf("%.1f%%", share) // a 100 px track
		}
		v.Rows = append(v.Rows, r)
	}
	return v
}
