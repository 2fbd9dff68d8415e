package loadgen

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/stats"
)

// Joining the client's view with the gateway's.
//
// infergate keeps its recent requests' stamps on the admin port
// (/debug/requests?format=json: gateway, moderation and model time, the
// upstream's TTFT). Join pairs each sample with its record by request id
// (or trace id) and splits the client's E2E into: the gateway's own work,
// moderation, the wait for the upstream's first token, its decode, and
// what is outside the gateway's clock (the network both ways, the client's
// own stack, Envoy's response path).

func newTraceID() string { return randomHex(16) }
func newSpanID() string  { return randomHex(8) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// gatewayRecord is the part of a /debug/requests record Join reads.
type gatewayRecord struct {
	RequestID    string  `json:"request_id"`
	TraceID      string  `json:"trace_id"`
	TotalMs      float64 `json:"total_ms"`
	GatewayMs    float64 `json:"gateway_ms"`
	ModerationMs float64 `json:"moderation_ms"`
	ModelMs      float64 `json:"model_ms"`
	TTFTMs       float64 `json:"ttft_ms"`
}

// maxJoinBody bounds the records fetched (the page keeps a bounded ring).
const maxJoinBody = 64 << 20

// FetchRecords reads the gateway's recent request records from adminURL.
func FetchRecords(ctx context.Context, client *http.Client, adminURL string) ([]gatewayRecord, error) {
	url := strings.TrimSuffix(adminURL, "/") + "/debug/requests?format=json"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("join: %s: status %d (are admin.debug.enabled true and admin.recentRequests > 0?)", url, resp.StatusCode)
	}
	var recs []gatewayRecord
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJoinBody)).Decode(&recs); err != nil {
		return nil, fmt.Errorf("join: %s: %w", url, err)
	}
	return recs, nil
}

// Join pairs the measured, successful samples with the gateway's records.
func Join(source string, samples []Sample, recs []gatewayRecord) *result.Join {
	byID := make(map[string]*gatewayRecord, 2*len(recs))
	for i := range recs {
		if r := &recs[i]; r.RequestID != "" {
			byID[r.RequestID] = r
		}
		if r := &recs[i]; r.TraceID != "" {
			byID[r.TraceID] = r
		}
	}
	j := &result.Join{Source: source}
	client, gateway, moderation, first, decode, outside := newHist(), newHist(), newHist(), newHist(), newHist(), newHist()
	d := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for i := range samples {
		s := &samples[i]
		if s.Phase != Measure || !s.OK() {
			continue
		}
		j.Requests++
		r := byID[s.RequestID]
		if r == nil && s.TraceID != "" {
			r = byID[s.TraceID]
		}
		if r == nil {
			continue
		}
		j.Joined++
		client.record(s.E2E)
		gateway.record(d(r.GatewayMs))
		moderation.record(d(r.ModerationMs))
		first.record(d(r.TTFTMs))
		decode.record(d(r.ModelMs - r.TTFTMs))
		outside.record(s.E2E - d(r.TotalMs))
		if len(j.Samples) < maxJoinSamples {
			j.Samples = append(j.Samples, result.JoinedRequest{
				RequestID: s.RequestID, TraceID: s.TraceID, ClientMs: stats.Ms(s.E2E), ClientTTFTMs: stats.Ms(s.TTFT),
				GatewayMs: r.GatewayMs, ModerationMs: r.ModerationMs, UpstreamFirstTokenMs: r.TTFTMs,
				DecodeMs: r.ModelMs - r.TTFTMs, OutsideMs: stats.Ms(s.E2E) - r.TotalMs,
			})
		}
	}
	j.ClientMs, j.GatewayMs, j.ModerationMs = client.dist(), gateway.dist(), moderation.dist()
	j.UpstreamFirstTokenMs, j.DecodeMs, j.OutsideMs = first.dist(), decode.dist(), outside.dist()
	return j
}

// GatewayTarget picks the target to join: the one whose responses carried
// an x-request-id (a gateway's), the first on a tie (a direct model server
// sends none).
func GatewayTarget(samples [][]Sample) int {
	best, bestN := 0, -1
	for i, ss := range samples {
		n := 0
		for j := range ss {
			if ss[j].RequestID != "" {
				n++
			}
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	return best
}

// maxJoinSamples bounds the per-request breakdowns kept in the report.
const maxJoinSamples = 10000

// writeJoin prints the breakdown: where each request's time went.
func writeJoin(w io.Writer, j *result.Join) {
	fmt.Fprintf(w, "\nWhere the time went (%s: %d of %d requests joined with %s/debug/requests):\n", j.Target, j.Joined, j.Requests, j.Source)
	if j.Joined == 0 {
		fmt.Fprintln(w, "  none: the gateway keeps its last admin.recentRequests records, and requests must carry x-request-id back")
		return
	}
	rows := [][]string{{"phase", "p50", "p90", "p99", "mean"}}
	for _, p := range []struct {
		label string
		d     result.Dist
	}{
		{"client E2E", j.ClientMs},
		{"  gateway (auth, policy, limits, routing)", j.GatewayMs},
		{"  moderation", j.ModerationMs},
		{"  upstream to first token", j.UpstreamFirstTokenMs},
		{"  decode (first token to last byte)", j.DecodeMs},
		{"  outside the gateway (network, client)", j.OutsideMs},
	} {
		rows = append(rows, []string{p.label, fmtMs(p.d.P50, false), fmtMs(p.d.P90, false), fmtMs(p.d.P99, false), fmtMs(p.d.Mean, false)})
	}
	writeAligned(w, rows)
}
