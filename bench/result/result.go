// Package result is the data model of an `infergate-bench bench` run: what the
// load generator measures, what --json writes, what the HTML report draws
// and what --baseline compares against.
//
// The JSON encoding is a stable, documented interface (docs/bench-json.md):
// fields are only ever added, and SchemaVersion changes if one ever has to
// change meaning. Latencies are milliseconds (float64), rates per second.
package result

import "time"

// SchemaVersion is written to Report.SchemaVersion.
const SchemaVersion = 1

// Report is one run.
type Report struct {
	SchemaVersion int        `json:"schema_version"`
	Tool          string     `json:"tool"`    // "infergate bench"
	Version       string     `json:"version"` // infergate version
	StartedAt     time.Time  `json:"started_at"`
	DurationS     float64    `json:"duration_s"` // wall time of the whole run, warm-up and cool-down included
	Parameters    Parameters `json:"parameters"`

	// Metrics is the first target's measurement window (the only target in
	// the basic call), so `jq .metrics.ttft_ms.p99` works on every report.
	// For a sweep, the knee level's (the first level's if none met the SLO).
	Metrics Metrics `json:"metrics"`
	// Targets holds every target's metrics, in --target order (for a
	// sweep, the same level's as Metrics).
	Targets []TargetResult `json:"targets"`

	Sweep   *Sweep   `json:"sweep,omitempty"`   // --sweep
	Join    *Join    `json:"join,omitempty"`    // --join: the gateway target's requests, joined with the gateway's records
	Compare *Compare `json:"compare,omitempty"` // two targets (--compare-targets, or two --target)
	// Baseline is the outcome of --baseline, if given.
	Baseline *BaselineCheck `json:"baseline,omitempty"`
}

// Parameters records how the run was configured, enough to reproduce it.
type Parameters struct {
	Targets     []Target `json:"targets"`
	Mode        string   `json:"mode"`                  // "closed" (concurrency) or "open" (request rate)
	Concurrency int      `json:"concurrency,omitempty"` // closed loop: users (per target); open loop: cap on items in flight, 0 = none
	RatePerS    float64  `json:"rate_per_s,omitempty"`  // open loop: mean arrival rate (per target: each arrival goes to every target)
	Arrival     string   `json:"arrival,omitempty"`     // open loop: "constant", "poisson" or "gamma"
	Burstiness  float64  `json:"burstiness,omitempty"`  // gamma shape (1 = Poisson, <1 burstier)
	RampUp      string   `json:"ramp_up,omitempty"`     // e.g. "10 users/s" or "linear 0→50 req/s over 30s"
	Requests    int      `json:"requests,omitempty"`    // per target; 0 when the run is bounded by duration
	DurationS   float64  `json:"duration_s,omitempty"`  // measurement window, when bounded by duration
	WarmupS     float64  `json:"warmup_s"`
	CooldownS   float64  `json:"cooldown_s"`
	// WarmupRequests and CooldownRequests are set when those phases are
	// bounded by a request count instead of (or as well as) seconds.
	WarmupRequests   int      `json:"warmup_requests,omitempty"`
	CooldownRequests int      `json:"cooldown_requests,omitempty"`
	Stream           bool     `json:"stream"`
	LengthHints      bool     `json:"length_hints"` // min_tokens and ignore_eos sent
	Models           []Weight `json:"models"`
	// Tenants are the API-key mix by label; the keys themselves are never written.
	Tenants []Weight `json:"tenants,omitempty"`
	// HeaderMixes are per-request header choices, each value "name: value".
	HeaderMixes  []Weight `json:"header_mixes,omitempty"`
	InputTokens  Range    `json:"input_tokens"`
	OutputTokens Range    `json:"output_tokens"`
	SharedPrefix *Prefix  `json:"shared_prefix,omitempty"`
	Dataset      string   `json:"dataset,omitempty"` // JSONL file, if used instead of synthetic prompts
	Seed         int64    `json:"seed"`
	SLO          SLO      `json:"slo"`
	TimeoutS     float64  `json:"timeout_s"`
}

// Target is one endpoint under test.
type Target struct {
	Name string `json:"name"`
	URL  string `json:"url"`
}

// Weight is one entry of a weighted mix.
type Weight struct {
	Value  string  `json:"value"`
	Weight float64 `json:"weight"`
}

// Range is a token-count distribution.
type Range struct {
	Min    int     `json:"min"`
	Max    int     `json:"max"`
	Dist   string  `json:"dist"`             // "uniform" or "normal" (normal: mean and stddev, clamped to [min,max])
	Mean   float64 `json:"mean,omitempty"`   // normal only
	StdDev float64 `json:"stddev,omitempty"` // normal only
}

// Prefix describes prompts sharing a common prefix (to exercise prefix caches).
type Prefix struct {
	Share  float64 `json:"share"`  // fraction of requests that start with the shared prefix
	Tokens int     `json:"tokens"` // its length
}

// SLO is what a request must meet to count toward goodput and what a sweep's
// knee is judged against. Zero fields are not checked.
type SLO struct {
	TTFTMs float64 `json:"ttft_ms,omitempty"` // per request
	ITLMs  float64 `json:"itl_ms,omitempty"`  // per request: its TPOT, (E2E − TTFT)/(tokens − 1), as vLLM and AIPerf judge ITL
	E2EMs  float64 `json:"e2e_ms,omitempty"`  // per request
	// Percentile at which a load level must meet TTFT/ITL/E2E for a sweep's
	// knee (default 99); failed requests count as missing every SLO. Goodput
	// is per request and ignores it.
	Percentile float64 `json:"percentile,omitempty"`
}

// TargetResult is one target's metrics plus what the charts need.
type TargetResult struct {
	Name    string  `json:"name"`
	URL     string  `json:"url"`
	Metrics Metrics `json:"metrics"`
	// Timeline is per-second buckets over the whole run (warm-up and
	// cool-down included, flagged), for the over-time charts.
	Timeline []Bucket `json:"timeline"`
	// CDF holds latency CDFs (a few hundred points each) for the charts.
	CDF CDFs `json:"cdf"`
}

// Metrics are the measurement window's numbers for one target. Latency
// percentiles cover successful requests only.
type Metrics struct {
	Requests Counts `json:"requests"`

	TTFTMs Dist `json:"ttft_ms"` // send → first content token (from the actual send time)
	// TTFTIntendedMs is TTFT measured from the *intended* send time (open
	// loop and ramp schedules): it includes the time a late generator kept
	// the request waiting, so an overloaded target cannot hide behind
	// coordinated omission. In a closed loop the intended time is when the
	// user became free, so it exceeds TTFTMs only by the generator's own lag.
	TTFTIntendedMs Dist `json:"ttft_intended_ms"`
	ITLMs          Dist `json:"itl_ms"`  // every gap between content events, pooled over requests
	TPOTMs         Dist `json:"tpot_ms"` // per request: (E2E − TTFT) / (output tokens − 1)
	E2EMs          Dist `json:"e2e_ms"`  // send → end of response
	E2EIntendedMs  Dist `json:"e2e_intended_ms"`
	MaxStallMs     Dist `json:"max_stall_ms"`    // per request: its longest gap
	QueueMs        Dist `json:"queue_ms"`        // client queue: intended send → a concurrency slot free (open loop with a cap; else 0)
	ScheduleLagMs  Dist `json:"schedule_lag_ms"` // intended send → actual send: queue plus the generator's own lateness (all sent requests)

	Throughput Throughput `json:"throughput"`
	Goodput    Goodput    `json:"goodput"`
	Errors     Errors     `json:"errors"`
	// TokenSource says how output tokens were counted: "usage" (the
	// server's usage object, every request), "events" (content events,
	// no usage chunk), "words" (non-streaming without usage: words of the
	// content) or "mixed".
	TokenSource  string  `json:"token_source"`
	InputTokens  int64   `json:"input_tokens"`  // sum over successful requests
	OutputTokens int64   `json:"output_tokens"` // sum over successful requests
	WindowS      float64 `json:"window_s"`      // first measured send → last measured response: what the rates divide by
}

// Counts of requests in the measurement window.
type Counts struct {
	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
}

// Dist summarises a latency distribution (HDR histogram, 3 significant
// digits). All zero when N is zero.
type Dist struct {
	N    int64   `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Min  float64 `json:"min"`
}

// Throughput over the measurement window.
type Throughput struct {
	RequestsPerS     float64 `json:"requests_per_s"`      // successful requests
	SentPerS         float64 `json:"sent_per_s"`          // requests sent, failed ones included (compare with parameters.rate_per_s)
	OutputTokensPerS float64 `json:"output_tokens_per_s"` // successful requests' output tokens
	TotalTokensPerS  float64 `json:"total_tokens_per_s"`  // input + output
	// PeakConcurrency is the most requests to this target in flight at
	// once during the window (warm-up and cool-down requests included).
	PeakConcurrency int `json:"peak_concurrency"`
}

// Goodput counts requests that met every SLO field set.
type Goodput struct {
	RequestsPerS float64 `json:"requests_per_s"`
	Fraction     float64 `json:"fraction"` // of sent requests
	Requests     int     `json:"requests"`
}

// Errors by class: "http_4xx", "http_429", "http_5xx", "timeout",
// "connection", "stream" (malformed or truncated stream), "other".
type Errors struct {
	Total   int            `json:"total"`
	ByClass map[string]int `json:"by_class"`
	// Examples holds the first message seen per class.
	Examples map[string]string `json:"examples,omitempty"`
}

// Bucket is one second of the run.
type Bucket struct {
	TS               float64 `json:"t_s"`                 // seconds since the run started (bucket start)
	Phase            string  `json:"phase"`               // "warmup", "measure" or "cooldown", in force at the bucket's start
	Completed        int     `json:"completed"`           // requests that succeeded, by completion time
	Errors           int     `json:"errors"`              // requests that failed, by completion time
	OutputTokensPerS float64 `json:"output_tokens_per_s"` // each request's tokens spread evenly from its first token to its end
	InFlight         int     `json:"in_flight"`           // at the end of the bucket
	TTFTP50Ms        float64 `json:"ttft_p50_ms"`         // successful requests sent in the bucket (0 if none)
	TTFTP99Ms        float64 `json:"ttft_p99_ms"`
}

// CDFs are [value_ms, quantile] pairs, quantile rising 0..1.
type CDFs struct {
	TTFTMs [][2]float64 `json:"ttft_ms"`
	ITLMs  [][2]float64 `json:"itl_ms"`
	E2EMs  [][2]float64 `json:"e2e_ms"`
}

// Sweep is a --sweep run: one measurement per load level.
type Sweep struct {
	Variable string       `json:"variable"` // "concurrency" or "rate"
	Points   []SweepPoint `json:"points"`
	// Knee is the index in Points of the highest load that met the SLO,
	// or -1 if none did.
	Knee int `json:"knee"`
	// KneeLoad is Points[Knee].Load (0 when Knee is -1).
	KneeLoad float64 `json:"knee_load"`
}

// SweepPoint is one load level.
type SweepPoint struct {
	Load     float64 `json:"load"` // concurrency or req/s
	Metrics  Metrics `json:"metrics"`
	MeetsSLO bool    `json:"meets_slo"`
	// Why names the SLO field that failed ("ttft_ms p99 312.4 > 250"), empty when met.
	Why string `json:"why,omitempty"`
}

// Compare is a --compare-targets run: the same seeded schedule sent to A and
// B, interleaved, and the per-request differences B − A.
type Compare struct {
	A     string `json:"a"`
	B     string `json:"b"`
	Pairs int    `json:"pairs"` // requests that succeeded on both
	// Deltas are distributions of B − A per pair (may be negative).
	DeltaTTFTMs Delta `json:"delta_ttft_ms"`
	DeltaITLMs  Delta `json:"delta_itl_ms"` // per pair: difference of the pair's mean gaps
	DeltaE2EMs  Delta `json:"delta_e2e_ms"`
}

// Delta summarises paired differences with a 95% confidence interval of the
// median (and of the mean), so "the gateway adds 1.2 ms [0.9, 1.5]" can be
// stated honestly.
type Delta struct {
	N        int        `json:"n"`
	Mean     float64    `json:"mean"`
	MeanCI95 [2]float64 `json:"mean_ci95"`
	P50      float64    `json:"p50"`
	P50CI95  [2]float64 `json:"p50_ci95"`
	P90      float64    `json:"p90"`
	P99      float64    `json:"p99"`
	Min      float64    `json:"min"`
	Max      float64    `json:"max"`
	// Histogram of the differences for the chart: bucket lower edges and counts.
	Edges  []float64 `json:"edges"`
	Counts []int     `json:"counts"`
}

// BaselineCheck is the outcome of --baseline FILE --tolerance ….
type BaselineCheck struct {
	File   string           `json:"file"`
	Passed bool             `json:"passed"`
	Checks []BaselineMetric `json:"checks"`
}

// BaselineMetric compares one metric with the baseline's.
type BaselineMetric struct {
	Target    string  `json:"target"` // target name (the baseline's target of the same name, or the only one)
	Metric    string  `json:"metric"` // e.g. "ttft_ms.p99"
	Baseline  float64 `json:"baseline"`
	Current   float64 `json:"current"`
	Tolerance float64 `json:"tolerance"` // allowed relative worsening, e.g. 0.10
	// HigherIsBetter is true for rates (worse means lower), false for
	// latencies and counts of failures (worse means higher).
	HigherIsBetter bool `json:"higher_is_better"`
	Passed         bool `json:"passed"`
}

// Join is the client's view of each request joined with the gateway's
// record of it (--join ADMIN_URL): one breakdown per request, client →
// gateway → upstream → first token → done. Outside is the client's E2E
// less the gateway's total: network both ways, the client's own stack and
// Envoy's response path. Distributions cover the joined requests.
type Join struct {
	Source               string          `json:"source"`   // the admin URL the records came from
	Target               string          `json:"target"`   // the target joined: the one whose responses carry x-request-id
	Requests             int             `json:"requests"` // successful, measured requests of that target
	Joined               int             `json:"joined"`   // of those, found among the gateway's recent records
	ClientMs             Dist            `json:"client_ms"`
	GatewayMs            Dist            `json:"gateway_ms"`
	ModerationMs         Dist            `json:"moderation_ms"`
	UpstreamFirstTokenMs Dist            `json:"upstream_first_token_ms"` // request left the gateway → first token
	DecodeMs             Dist            `json:"decode_ms"`               // first token → last byte
	OutsideMs            Dist            `json:"outside_ms"`
	Samples              []JoinedRequest `json:"samples,omitempty"` // per request (up to 10,000)
}

// JoinedRequest is one request's breakdown, in milliseconds.
type JoinedRequest struct {
	RequestID            string  `json:"request_id"`
	TraceID              string  `json:"trace_id,omitempty"`
	ClientMs             float64 `json:"client_ms"`
	ClientTTFTMs         float64 `json:"client_ttft_ms"`
	GatewayMs            float64 `json:"gateway_ms"`
	ModerationMs         float64 `json:"moderation_ms"`
	UpstreamFirstTokenMs float64 `json:"upstream_first_token_ms"`
	DecodeMs             float64 `json:"decode_ms"`
	OutsideMs            float64 `json:"outside_ms"`
}
