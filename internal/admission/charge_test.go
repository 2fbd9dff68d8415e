package admission

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
)

// The accounting rule, case by case: the charge falls only on proof.
func TestCharge(t *testing.T) {
	reserved := ratelimit.Cost{Requests: 1, InputTokens: 12, OutputTokens: 16000}
	usage := func(s request.Settlement) request.Settlement {
		s.UsageRead, s.PromptTokens, s.CompletionTokens, s.InputReported = true, 4000, 3500, true
		return s
	}
	pool := request.Settlement{Status: 200, Origin: request.OriginPool, End: request.EndComplete, PromptTokens: 12}
	sse := pool
	sse.SSE = true
	with := func(s request.Settlement, f func(*request.Settlement)) request.Settlement { f(&s); return s }
	for _, tc := range []struct {
		name string
		s    request.Settlement
		want ratelimit.Cost // ignored when keep
		keep bool
	}{
		// Proof: the pool's own usage, read whole.
		{"non-streamed, usage read", usage(pool), ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 3500}, false},
		{"non-streamed, usage read, the origin unknown", usage(with(pool, func(s *request.Settlement) { s.Origin = request.OriginUnknown })),
			ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 3500}, false},
		{"non-streamed, usage read, then the client hung up", usage(with(pool, func(s *request.Settlement) { s.End = request.EndCut })),
			ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 3500}, false},
		{"non-streamed, usage read on an error the pool answered", usage(with(pool, func(s *request.Settlement) { s.Status = 400 })),
			ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 3500}, false},
		{"streamed, usage read, [DONE]", usage(with(sse, func(s *request.Settlement) { s.Terminal = true })),
			ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 3500}, false},
		{"streamed, usage read, cut before [DONE] (a running usage)", usage(with(sse, func(s *request.Settlement) { s.End = request.EndCut })), reserved, true},
		{"streamed, usage read, no [DONE]", usage(sse), reserved, true},
		// Proof: a stream counted to its end.
		{"streamed, no usage, [DONE]", with(sse, func(s *request.Settlement) { s.Terminal, s.Events = true, 40 }),
			ratelimit.Cost{Requests: 1, InputTokens: 12, OutputTokens: 40}, false},
		{"streamed, no usage, [DONE] seen before the client left", with(sse, func(s *request.Settlement) { s.Terminal, s.Events, s.End = true, 40, request.EndCut }),
			ratelimit.Cost{Requests: 1, InputTokens: 12, OutputTokens: 40}, false},
		// No proof: the reservation stays.
		{"streamed, no usage, cut", with(sse, func(s *request.Settlement) { s.Events, s.End = 40, request.EndCut }), reserved, true},
		{"streamed, no usage, ended without [DONE]", with(sse, func(s *request.Settlement) { s.Events = 40 }), reserved, true},
		{"non-streamed, no usage", pool, reserved, true},
		{"non-streamed, the client hung up before the body", with(pool, func(s *request.Settlement) { s.End, s.Status = request.EndCut, 0 }), reserved, true},
		{"non-streamed, the client hung up mid-body, no usage yet", with(pool, func(s *request.Settlement) { s.End = request.EndCut }), reserved, true},
		{"lost, with usage", usage(with(pool, func(s *request.Settlement) { s.End = request.EndLost })), reserved, true},
		{"lost, streamed, [DONE]", with(sse, func(s *request.Settlement) { s.End, s.Terminal = request.EndLost, true }), reserved, true},
		{"the zero settlement", request.Settlement{}, reserved, true},
		{"Envoy's 408", with(pool, func(s *request.Settlement) { s.Status, s.Origin = 408, request.OriginEnvoy }), reserved, true},
		{"Envoy's 504 (upstream timeout)", with(pool, func(s *request.Settlement) { s.Status, s.Origin = 504, request.OriginEnvoy }), reserved, true},
		{"Envoy's reply carrying a usage-shaped body", usage(with(pool, func(s *request.Settlement) { s.Status, s.Origin = 504, request.OriginEnvoy })), reserved, true},
		{"an error of unknown origin, no usage", with(pool, func(s *request.Settlement) { s.Status, s.Origin = 503, request.OriginUnknown }), reserved, true},
		{"an error the pool answered, cut", with(pool, func(s *request.Settlement) { s.Status, s.End = 503, request.EndCut }), reserved, true},
		{"a streamed error the pool answered", with(sse, func(s *request.Settlement) { s.Status = 500 }), reserved, true},
		{"usage out of range", with(usage(pool), func(s *request.Settlement) { s.CompletionTokens = maxUsage + 1 }), reserved, true},
		{"usage negative", with(usage(pool), func(s *request.Settlement) { s.PromptTokens = -1 }), reserved, true},
		// The stated exceptions.
		{"an error the pool answered, read whole, no usage", with(pool, func(s *request.Settlement) { s.Status = 503 }), ratelimit.Cost{Requests: 1}, false},
		{"count_tokens", with(pool, func(s *request.Settlement) { s.API = openai.APICountTokens }), ratelimit.Cost{Requests: 1}, false},
		{"count_tokens, cut", with(pool, func(s *request.Settlement) { s.API, s.End = openai.APICountTokens, request.EndCut }), ratelimit.Cost{Requests: 1}, false},
		// Without sealed bounds: reserved + maxOverReservation, whatever the pool says.
		{"usage past the bound", with(usage(pool), func(s *request.Settlement) { s.PromptTokens, s.CompletionTokens = maxUsage, maxUsage }),
			ratelimit.Cost{Requests: 1, InputTokens: 16012 + maxOverReservation}, false},
		{"output past the bound", with(usage(pool), func(s *request.Settlement) { s.CompletionTokens = maxUsage }),
			ratelimit.Cost{Requests: 1, InputTokens: 4000, OutputTokens: 16012 + maxOverReservation - 4000}, false},
	} {
		got, keep, _ := charge(&tc.s, reserved, unknownBounds)
		if keep != tc.keep || got != tc.want {
			t.Errorf("%s: charge = %+v, keep %v; want %+v, keep %v", tc.name, got, keep, tc.want, tc.keep)
		}
	}
}

// Every combination of the facts: the reservation is lowered only on a
// proof (the pool's usage, read whole and final; a stream counted to its
// end; an error the pool itself answered; count_tokens), never for what
// Envoy answered or a stream the meter lost, and never past the bound.
func TestChargeEveryCombination(t *testing.T) {
	reserved := ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 1000}
	n := 0
	for _, api := range []openai.API{"", openai.APIChat, openai.APIMessages, openai.APIEmbeddings, openai.APICountTokens} {
		for _, end := range []request.End{request.EndLost, request.EndCut, request.EndComplete} {
			for _, origin := range []request.Origin{request.OriginUnknown, request.OriginPool, request.OriginEnvoy} {
				for _, status := range []int{0, 200, 400, 408, 500, 504} {
					for bits := range 8 {
						for _, tokens := range []int{0, 50, 5000, maxUsage, maxUsage + 1} {
							n++
							s := request.Settlement{API: api, End: end, Origin: origin, Status: status,
								SSE: bits&1 != 0, Terminal: bits&2 != 0, UsageRead: bits&4 != 0,
								PromptTokens: 60, CompletionTokens: tokens, Events: tokens}
							got, keep, _ := charge(&s, reserved, unknownBounds)
							inRange := tokens <= maxUsage
							proof := end != request.EndLost && origin != request.OriginEnvoy &&
								(s.UsageRead && (!s.SSE || s.Terminal) && inRange ||
									s.SSE && s.Terminal && !s.UsageRead && inRange)
							poolError := !s.SSE && !s.UsageRead && end == request.EndComplete && origin == request.OriginPool && status >= 400
							switch {
							case api == openai.APICountTokens:
								if keep || got != (ratelimit.Cost{Requests: 1}) {
									t.Fatalf("%+v: count_tokens charged %+v, keep %v", s, got, keep)
								}
							case proof:
								want := min(int64(tokens), reserved.InputTokens+reserved.OutputTokens+maxOverReservation-60)
								if keep || got != (ratelimit.Cost{Requests: 1, InputTokens: 60, OutputTokens: want}) {
									t.Fatalf("%+v: proved %d output, charged %+v, keep %v", s, want, got, keep)
								}
							case poolError:
								if keep || got != (ratelimit.Cost{Requests: 1}) {
									t.Fatalf("%+v: the pool's error charged %+v, keep %v", s, got, keep)
								}
							default:
								if !keep || got != reserved {
									t.Fatalf("%+v: no proof, yet charged %+v (keep %v)", s, got, keep)
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d combinations", n)
}

// The bounds a request's admission proves: output at most the cap sent
// upstream × choices, input at most what the body can hold, output never
// below what the meter counted; each held charge is named.
func TestChargeBounds(t *testing.T) {
	reserved := ratelimit.Cost{Requests: 1, InputTokens: 100, OutputTokens: 1000}
	b := proofBounds{MaxOutput: 1000, MaxInput: 5000}
	stream := func(prompt, completion, events int) request.Settlement {
		return request.Settlement{Status: 200, Origin: request.OriginPool, End: request.EndComplete, SSE: true, Terminal: true,
			UsageRead: true, PromptTokens: prompt, CompletionTokens: completion, Events: events}
	}
	body := func(prompt, completion int) request.Settlement {
		return request.Settlement{Status: 200, Origin: request.OriginPool, End: request.EndComplete,
			UsageRead: true, PromptTokens: prompt, CompletionTokens: completion}
	}
	counted := func(prompt, events int) request.Settlement {
		s := stream(prompt, 0, events)
		s.UsageRead = false
		return s
	}
	cost := func(in, out int64) ratelimit.Cost {
		return ratelimit.Cost{Requests: 1, InputTokens: in, OutputTokens: out}
	}
	for _, tc := range []struct {
		name    string
		s       request.Settlement
		b       proofBounds
		want    ratelimit.Cost
		bounded string
	}{
		{"within both", body(4000, 900), b, cost(4000, 900), ""},
		{"at both", body(5000, 1000), b, cost(5000, 1000), ""},
		{"output one past the cap", body(4000, 1001), b, cost(4000, 1000), "output"},
		{"output at the largest usage", body(4000, maxUsage), b, cost(4000, 1000), "output"},
		{"input one past what the body holds", body(5001, 10), b, cost(5000, 10), "input"},
		{"both at the largest usage", body(maxUsage, maxUsage), b, cost(5000, 1000), "input,output"},
		{"a cap of zero (embeddings)", body(40, 7), proofBounds{MaxOutput: 0, MaxInput: 5000}, cost(40, 0), "output"},
		{"a stream's usage below what was counted", stream(40, 3, 30), b, cost(40, 30), "counted"},
		{"a stream's usage of zero, counted", stream(40, 0, 1), b, cost(40, 1), "counted"},
		{"counted above the cap: the cap", stream(40, 3, 2000), b, cost(40, 1000), "counted,output"},
		{"a stream's usage above what was counted", stream(40, 300, 30), b, cost(40, 300), ""},
		{"a body's usage: no events to count", body(40, 3), b, cost(40, 3), ""},
		{"counted, no usage, within", counted(40, 30), b, cost(40, 30), ""},
		{"counted, no usage, past the cap", counted(40, 3000), b, cost(40, 1000), "output"},
		{"input unbounded: reserved + maxOverReservation", body(maxUsage, 10), proofBounds{MaxOutput: 1000, MaxInput: -1},
			cost(1100+maxOverReservation, 10), "input"},
		{"output unbounded: the rest of reserved + maxOverReservation", body(4000, maxUsage), proofBounds{MaxOutput: -1, MaxInput: 5000},
			cost(4000, 1100+maxOverReservation-4000), "output"},
		{"the largest bounds", body(maxUsage, maxUsage), proofBounds{MaxOutput: maxBound, MaxInput: maxBound}, cost(maxUsage, maxUsage), ""},
	} {
		got, keep, bounded := charge(&tc.s, reserved, tc.b)
		if keep || got != tc.want || bounded != tc.bounded {
			t.Errorf("%s: charge = %+v, keep %v, bounded %q; want %+v, %q", tc.name, got, keep, bounded, tc.want, tc.bounded)
		}
	}
}

// The reserved cost is read back from a reservation's counters.
func TestReservedCost(t *testing.T) {
	for _, tc := range []struct {
		entries []ratelimit.Entry
		want    ratelimit.Cost
	}{
		{nil, ratelimit.Cost{Requests: 1}},
		{[]ratelimit.Entry{{Unit: ratelimit.Requests, Reserved: 1}, {Unit: ratelimit.InputTokens, Reserved: 10}, {Unit: ratelimit.OutputTokens, Reserved: 90}},
			ratelimit.Cost{Requests: 1, InputTokens: 10, OutputTokens: 90}},
		{[]ratelimit.Entry{{Unit: ratelimit.TotalTokens, Reserved: 100}}, ratelimit.Cost{Requests: 1, InputTokens: 100}},
		{[]ratelimit.Entry{{Unit: ratelimit.OutputTokens, Reserved: 90}, {Unit: ratelimit.TotalTokens, Reserved: 100}, {Unit: ratelimit.TotalTokens, Reserved: 100}},
			ratelimit.Cost{Requests: 1, InputTokens: 10, OutputTokens: 90}},
	} {
		if got := reservedCost(ratelimit.Reservation{Entries: tc.entries}); got != tc.want {
			t.Errorf("reservedCost(%+v) = %+v, want %+v", tc.entries, got, tc.want)
		}
	}
}

// Release gives a sealed reservation back whole; a forged one moves no
// counter.
func TestReleaseGivesTheReservationBack(t *testing.T) {
	c := newController(t)
	now := time.Unix(1_700_000_000, 0)
	c.Limiter = ratelimit.NewMemory(func() time.Time { return now })
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 300, Window: time.Minute}}}}
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}
	v := c.Decide(ctx, chat(hdr)) // 120 reserved
	c.Release(ctx, "r", "forged."+v.Reservation)
	v2 := c.Decide(ctx, chat(hdr))
	if got := v2.Metadata["x-ratelimit-remaining-tokens"]; got != "60" {
		t.Fatalf("after a forged release: remaining %v, want 60", got)
	}
	c.Release(ctx, "r", v.Reservation)
	c.Release(ctx, "r", v2.Reservation)
	if got := c.Decide(ctx, chat(hdr)).Metadata["x-ratelimit-remaining-tokens"]; got != "180" {
		t.Errorf("after releasing both: remaining %v, want 180", got)
	}
}
