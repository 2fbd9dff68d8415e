// Package requestlog keeps the most recent requests' stamps in memory and
// serves them on the admin port: /debug/requests lists them (filterable),
// /debug/requests/{id} draws one request's phases as a waterfall with its
// inter-token latency distribution. Both answer JSON with ?format=json,
// which is what `infergate-bench bench --join` reads. Server-rendered, no
// external assets: readable without any tracing backend.
//
// The phases, as the stamp defines them:
//
//	total      Envoy received the request → the response's last byte
//	gateway    Envoy and infergate before the request left for the upstream
//	           (auth, policy, rate limits, routing), moderation excluded
//	moderation external checks the policy required
//	model      request left the gateway → last byte: first token (upstream
//	           queueing + prefill) then stream (decode)
//
// so total ≈ gateway + moderation + model.
package requestlog

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

// Ring is an request.Sink keeping the last N stamps.
type Ring struct {
	mu   sync.Mutex
	buf  []request.Stamp
	next int
	full bool
}

// NewRing keeps up to n stamps.
func NewRing(n int) *Ring { return &Ring{buf: make([]request.Stamp, n)} }

// maxKeptGaps bounds the inter-token gaps the ring keeps per request (a
// 16k-token answer has 16k of them): enough for the page's histogram, so
// the ring stays a few MiB at its default size, whatever pools stream.
const maxKeptGaps = 512

// Record implements request.Sink.
func (r *Ring) Record(_ context.Context, s *request.Stamp) {
	st := *s
	st.Gaps = sampleGaps(s.Gaps, maxKeptGaps)
	r.mu.Lock()
	r.buf[r.next] = st
	r.next = (r.next + 1) % len(r.buf)
	r.full = r.full || r.next == 0
	r.mu.Unlock()
}

// sampleGaps returns gaps itself when it has at most n, else n of them
// evenly spread (the distribution's shape, in order), in a copy.
func sampleGaps(gaps []time.Duration, n int) []time.Duration {
	if len(gaps) <= n {
		return gaps
	}
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = gaps[i*len(gaps)/n]
	}
	return out
}

// Recent returns the kept stamps, newest first, that pass keep.
func (r *Ring) Recent(keep func(*request.Stamp) bool) []request.Stamp {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.next
	if r.full {
		n = len(r.buf)
	}
	out := make([]request.Stamp, 0, n)
	for i := range n {
		s := &r.buf[(r.next-1-i+len(r.buf))%len(r.buf)]
		if keep == nil || keep(s) {
			out = append(out, *s)
		}
	}
	return out
}

// Find returns the newest stamp with the request id (or trace id).
func (r *Ring) Find(id string) (request.Stamp, bool) {
	found := r.Recent(func(s *request.Stamp) bool { return s.RequestID == id || (s.TraceID != "" && s.TraceID == id) })
	if len(found) == 0 {
		return request.Stamp{}, false
	}
	return found[0], true
}

// Filter selects requests; zero fields match everything.
type Filter struct {
	Model, Pool, Tenant, Decision string
	// Status is an exact code ("429") or a class ("5xx").
	Status string
	// Slow keeps requests whose total time is at least this.
	Slow time.Duration
}

// Match reports whether s passes f.
func (f Filter) Match(s *request.Stamp) bool {
	switch {
	case f.Model != "" && s.Model != f.Model,
		f.Pool != "" && s.Pool != f.Pool,
		f.Tenant != "" && s.Tenant != f.Tenant,
		f.Decision != "" && s.Decision != f.Decision,
		f.Slow > 0 && s.Total < f.Slow:
		return false
	}
	if f.Status != "" {
		code := strconv.Itoa(s.Status)
		if class, ok := strings.CutSuffix(strings.ToLower(f.Status), "xx"); ok {
			return len(code) == 3 && code[:1] == class
		}
		return code == f.Status
	}
	return true
}

// Record is a stamp as the JSON API shows it (milliseconds).
type Record struct {
	RequestID        string    `json:"request_id"`
	TraceID          string    `json:"trace_id,omitempty"`
	Start            time.Time `json:"start"`
	Model            string    `json:"model"`
	API              string    `json:"api,omitempty"`
	Pool             string    `json:"pool,omitempty"`
	PoolsTried       []string  `json:"pools_tried,omitempty"`
	Attempts         int       `json:"attempts,omitempty"`
	Upstream         string    `json:"upstream,omitempty"`
	Endpoint         string    `json:"endpoint,omitempty"` // an Endpoint Picker's choice
	Tenant           string    `json:"tenant,omitempty"`
	Principal        string    `json:"principal,omitempty"`
	Status           int       `json:"status"`
	Decision         string    `json:"decision"`
	Reason           string    `json:"reason,omitempty"`
	Verification     string    `json:"verification,omitempty"` // request.ClaimUncertain: the field's claim was not answered
	Stream           bool      `json:"stream"`
	Complete         bool      `json:"complete"`
	Timing           string    `json:"timing,omitempty"` // request.Timing: "late_read" times are bounds; "late_stream" gaps and E2E are
	PromptTokens     int       `json:"prompt_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	CachedTokens     int       `json:"cached_tokens,omitempty"`
	Cost             string    `json:"cost,omitempty"` // an exact decimal of Currency
	Currency         string    `json:"currency,omitempty"`
	TotalMs          float64   `json:"total_ms"`
	GatewayMs        float64   `json:"gateway_ms"`
	GateMs           float64   `json:"gate_ms"`
	PickerMs         float64   `json:"picker_ms,omitempty"`
	AuthMs           float64   `json:"auth_ms"`
	PolicyMs         float64   `json:"policy_ms"`
	RateLimitMs      float64   `json:"ratelimit_ms"`
	ModerationMs     float64   `json:"moderation_ms"`
	ModelMs          float64   `json:"model_ms"`
	TTFTMs           float64   `json:"ttft_ms"`
	ITLP50Ms         float64   `json:"itl_p50_ms"`
	ITLP95Ms         float64   `json:"itl_p95_ms"`
	ITLMaxMs         float64   `json:"itl_max_ms"`
	GapsMs           []float64 `json:"gaps_ms,omitempty"` // detail only
}

// NewRecord converts a stamp; gaps are included when withGaps.
func NewRecord(s *request.Stamp, withGaps bool) Record {
	r := Record{
		RequestID: s.RequestID, TraceID: s.TraceID, Start: s.Start, Model: s.Model, API: string(s.API), Pool: s.Pool,
		PoolsTried: s.PoolsTried, Attempts: s.Attempts, Upstream: s.Upstream, Endpoint: s.Endpoint, Tenant: s.Tenant,
		Principal: s.Principal, Status: s.Status, Decision: s.Decision, Reason: s.Reason, Verification: s.Verification,
		Stream: s.Stream, Complete: s.Complete, Timing: string(s.Timing), PromptTokens: s.PromptTokens, CompletionTokens: s.CompletionTokens,
		TotalMs: stats.Ms(s.Total), GatewayMs: stats.Ms(s.Gateway.Total), GateMs: stats.Ms(s.Gateway.Gate), PickerMs: stats.Ms(s.Gateway.Picker),
		AuthMs: stats.Ms(s.Gateway.Auth), PolicyMs: stats.Ms(s.Gateway.Policy), RateLimitMs: stats.Ms(s.Gateway.RateLimit),
		ModerationMs: stats.Ms(s.Gateway.Checks), ModelMs: stats.Ms(s.E2E), TTFTMs: stats.Ms(s.TTFT),
		ITLP50Ms: stats.Ms(s.ITLP50), ITLP95Ms: stats.Ms(s.ITLP95), ITLMaxMs: stats.Ms(s.ITLMax),
	}
	if s.Cost.Currency != "" {
		r.Cost, r.Currency = price.FormatCost(s.Cost.Amount), s.Cost.Currency
	}
	r.CachedTokens = s.CachedTokens
	if withGaps {
		r.GapsMs = make([]float64, len(s.Gaps))
		for i, g := range s.Gaps {
			r.GapsMs[i] = stats.Ms(g)
		}
	}
	return r
}

// Phase is one bar of the waterfall, in milliseconds from the start.
type Phase struct {
	Name     string
	Kind     string // gateway, moderation, model
	Depth    int    // 1: a part of the phase above it
	FromMs   float64
	DurMs    float64
	LeftPct  float64
	WidthPct float64
	// The label goes after the bar, before it (LabelRight: its right edge
	// at LabelAt) when the bar ends near the right, or inside a long bar.
	LabelRight  bool
	LabelInside bool
	LabelAt     float64
}

// Phases lays out a request's waterfall.
func Phases(s *request.Stamp) []Phase {
	total := stats.Ms(s.Total)
	var ps []Phase
	add := func(name, kind string, depth int, from, dur float64) {
		if dur <= 0 && depth > 0 {
			return
		}
		ps = append(ps, Phase{Name: name, Kind: kind, Depth: depth, FromMs: from, DurMs: dur})
	}
	gw, gate := stats.Ms(s.Gateway.Total), stats.Ms(s.Gateway.Gate)
	add("gateway", "gateway", 0, 0, gw)
	// The gate's stages run back to back at the end of the gate's time,
	// which ends where the request leaves (minus moderation).
	at := max(0, gw-gate)
	add("gate", "gateway", 1, at, gate)
	for _, st := range []struct {
		name string
		d    time.Duration
	}{{"auth", s.Gateway.Auth}, {"policy", s.Gateway.Policy}, {"rate limit", s.Gateway.RateLimit}} {
		add(st.name, "gateway", 2, at, stats.Ms(st.d))
		at += stats.Ms(st.d)
	}
	add("moderation", "moderation", 0, gw, stats.Ms(s.Gateway.Checks))
	if !s.Sent.IsZero() {
		sent := gw + stats.Ms(s.Gateway.Checks)
		add("model", "model", 0, sent, stats.Ms(s.E2E))
		if s.TTFT > 0 {
			add("first token (queue + prefill)", "model", 1, sent, stats.Ms(s.TTFT))
			add("stream (decode)", "model", 1, sent+stats.Ms(s.TTFT), stats.Ms(s.E2E-s.TTFT))
		}
	}
	if total <= 0 {
		total = 1
	}
	for i := range ps {
		p := &ps[i]
		p.LeftPct = min(100, 100*p.FromMs/total)
		p.WidthPct = max(0.3, min(100-p.LeftPct, 100*p.DurMs/total))
		switch end := p.LeftPct + p.WidthPct; {
		case end <= 75:
			p.LabelAt = end
		case p.LeftPct >= 25:
			p.LabelRight, p.LabelAt = true, 100-p.LeftPct
		default:
			p.LabelInside, p.LabelAt = true, p.LeftPct
		}
	}
	return ps
}

// Bin is one bar of the ITL histogram.
type Bin struct {
	FromMs, ToMs float64
	Count        int
	HeightPct    float64
}

// Histogram bins gaps into at most n equal-width bins.
func Histogram(gaps []time.Duration, n int) []Bin {
	if len(gaps) == 0 {
		return nil
	}
	lo, hi := stats.Ms(slices.Min(gaps)), stats.Ms(slices.Max(gaps))
	width := (hi - lo) / float64(n)
	if width <= 0 {
		return []Bin{{FromMs: lo, ToMs: hi, Count: len(gaps), HeightPct: 100}}
	}
	bins := make([]Bin, n)
	for i := range bins {
		bins[i].FromMs, bins[i].ToMs = lo+float64(i)*width, lo+float64(i+1)*width
	}
	most := 0
	for _, g := range gaps {
		i := min(int((stats.Ms(g)-lo)/width), n-1)
		bins[i].Count++
		most = max(most, bins[i].Count)
	}
	for i := range bins {
		bins[i].HeightPct = 100 * float64(bins[i].Count) / float64(most)
	}
	return bins
}
