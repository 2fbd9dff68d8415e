package meter

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// stampView is what TestStampOf checks of a stamp, times in ms from t0.
type stampView struct {
	complete              bool
	start, sent, end      float64
	timing                request.Timing
	ttft, e2e, gw, total  float64
	source                string
	prompt, completion    int
	events, unread        int
	p50, p95              float64
	decision, tenant, who string
	unverified            bool
	pool, poolsTried      string
	model                 string
}

// StampOf and SettlementOf, branch by branch, on fixed times: the meter's
// facts as it read them (a tally fed chunk by chunk), how the response
// ended, and what the stamp and the settlement say.
func TestStampOf(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	msOf := func(tm time.Time) float64 { return float64(tm.Sub(t0)) / float64(time.Millisecond) }
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	content := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n"
	done := "data: [DONE]\n\n"
	// A chat stream: tokens at 100, 130 and 140 ms (gaps 30 and 10), its
	// usage and [DONE] at 141.
	stream := []timedEvent{{100, content}, {130, content}, {140, content}, {141, usageChunk + done}}
	pools := func(p string) string { return "pool-" + p }
	settled := func(end request.End, edit func(*request.Settlement)) *request.Settlement {
		s := &request.Settlement{RequestID: "req-1", Tenant: "acme", Reservation: "r-1", API: openai.APIChat, Status: 200,
			Origin: request.OriginPool, SSE: true, End: end, Terminal: true, UsageRead: true, PromptTokens: 7, CompletionTokens: 3,
			InputReported: true, Events: 3, Principal: "key-1", Model: "m", Pool: "pool-b"}
		if edit != nil {
			edit(s)
		}
		return s
	}
	// timed is the view of `stream` stamped as it ended at 142 ms, complete,
	// sent at 0, Envoy's start 3 ms before.
	timed := stampView{complete: true, start: -3, sent: 0, end: 142, timing: request.TimingOK, ttft: 100, e2e: 142, gw: 3, total: 145,
		source: "usage", prompt: 7, completion: 3, events: 3, p50: 10, p95: 30, decision: "allow", tenant: "acme", who: "key-1",
		pool: "pool-b", poolsTried: "pool-a,pool-b", model: "m"}
	for name, c := range map[string]struct {
		events  []timedEvent
		nonSSE  string // a non-streamed body, read at end
		facts   func(m *Request)
		end     float64
		ended   func(e *End)
		want    stampView
		settles *request.Settlement // nil: none
	}{
		"a stream, timed": {events: stream, end: 142, want: timed, settles: settled(request.EndComplete, nil)},
		"the client left at [DONE]": {events: stream, end: 300, ended: func(e *End) { e.Complete = false },
			want: with(timed, func(v *stampView) { v.end, v.e2e, v.total = 141, 141, 144 }), settles: settled(request.EndComplete, nil)},
		"complete: [DONE] does not move the end": {events: stream, end: 300,
			want: with(timed, func(v *stampView) { v.end, v.e2e, v.total = 300, 300, 303 }), settles: settled(request.EndComplete, nil)},
		"cut before its end, counted by its events": {events: stream[:2], end: 135, facts: func(m *Request) { m.Cut = true },
			ended: func(e *End) { e.Complete = false },
			want: with(timed, func(v *stampView) {
				v.complete, v.end, v.e2e, v.total, v.source, v.prompt, v.completion, v.events, v.p50, v.p95 = false, 135, 135, 138, "events", 9, 2, 2, 30, 30
			}),
			settles: settled(request.EndCut, func(s *request.Settlement) {
				s.Terminal, s.UsageRead, s.PromptTokens, s.CompletionTokens, s.InputReported, s.Events = false, false, 9, 0, false, 2
			})},
		"lost: neither whole nor cut": {events: stream[:1], end: 120, ended: func(e *End) { e.Complete = false },
			want: with(timed, func(v *stampView) {
				v.complete, v.end, v.e2e, v.total, v.source, v.prompt, v.completion, v.events, v.p50, v.p95 = false, 120, 120, 123, "events", 9, 1, 1, 0, 0
			}),
			settles: settled(request.EndLost, func(s *request.Settlement) {
				s.Terminal, s.UsageRead, s.PromptTokens, s.CompletionTokens, s.InputReported, s.Events = false, false, 9, 0, false, 1
			})},
		"an input reported ahead replaces the estimate": {events: stream[:3], end: 142,
			facts: func(m *Request) {
				m.Tally.Input, m.Tally.HasInput = 25, true
				m.Tally.Usage, m.Tally.OutputOnly = &openai.Usage{PromptTokens: 1, CompletionTokens: 4}, true
			},
			want: with(timed, func(v *stampView) { v.prompt, v.completion = 25, 4 }),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.Terminal, s.PromptTokens, s.CompletionTokens = false, 25, 4
			})},
		"an output reported alone takes the estimate as its input": {events: stream[:3], end: 142,
			facts: func(m *Request) {
				m.Tally.Usage, m.Tally.OutputOnly = &openai.Usage{PromptTokens: 1, CompletionTokens: 4}, true
			},
			want: with(timed, func(v *stampView) { v.prompt, v.completion = 9, 4 }),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.Terminal, s.PromptTokens, s.CompletionTokens, s.InputReported = false, 9, 4, false
			})},
		"counts out of range are absent": {events: stream[:3], end: 142,
			facts: func(m *Request) {
				m.Tally.Input, m.Tally.HasInput = -5, true
				m.Tally.Usage = &openai.Usage{PromptTokens: MaxTokens + 1, CompletionTokens: -1}
			},
			want: with(timed, func(v *stampView) { v.prompt, v.completion = 0, 0 }),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.Terminal, s.PromptTokens, s.CompletionTokens = false, 0, 0
			})},
		"the in-Envoy meter's end": {events: stream[:3], end: 142, facts: func(m *Request) { m.Ended = true },
			want: with(timed, func(v *stampView) { v.source, v.prompt, v.completion = "events", 9, 3 }),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.UsageRead, s.PromptTokens, s.CompletionTokens, s.InputReported = false, 9, 0, false
			})},
		"a non-streamed body: one event at its end": {nonSSE: `{"model":"m-1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`,
			end: 40,
			want: with(timed, func(v *stampView) {
				v.end, v.ttft, v.e2e, v.total, v.prompt, v.completion, v.events, v.p50, v.p95 = 40, 40, 40, 43, 5, 2, 1, 0, 0
			}),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.SSE, s.Terminal, s.PromptTokens, s.CompletionTokens, s.Events = false, false, 5, 2, 1
			})},
		"a body without usage nor content": {nonSSE: `{"error":"x"}`, end: 40,
			want: with(timed, func(v *stampView) {
				v.end, v.ttft, v.e2e, v.total, v.source, v.prompt, v.completion, v.events, v.p50, v.p95 = 40, 0, 40, 43, "", 9, 0, 0, 0, 0
			}),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.SSE, s.Terminal, s.UsageRead, s.PromptTokens, s.CompletionTokens, s.InputReported, s.Events = false, false, false, 9, 0, false, 0
			})},
		"events it could not read": {events: append([]timedEvent{{90, "data: {bad\n\n"}}, stream...), end: 142,
			want: with(timed, func(v *stampView) { v.unread = 1 }), settles: settled(request.EndComplete, nil)},
		"a field that is not trusted: no one's, settles nothing": {events: stream, end: 142, ended: func(e *End) { e.Trusted = false },
			want: with(timed, func(v *stampView) { v.decision, v.tenant, v.who, v.unverified = "unverified", "", "", true })},
		"a denial settles nothing": {events: stream, end: 142, facts: func(m *Request) { m.Stamp.Decision = "deny" },
			want: with(timed, func(v *stampView) { v.decision = "deny" })},
		"no decision reads allow": {events: stream, end: 142, facts: func(m *Request) { m.Stamp.Decision = "" },
			want: timed, settles: settled(request.EndComplete, nil)},
		"bounded before it is used": {events: stream, end: 142,
			facts: func(m *Request) { m.Stamp.Model = strings.Repeat("m", 2*request.MaxStampField) },
			want: with(timed, func(v *stampView) {
				v.model = request.Truncate(strings.Repeat("m", 2*request.MaxStampField), request.MaxStampField)
			}),
			settles: settled(request.EndComplete, func(s *request.Settlement) {
				s.Model = request.Truncate(strings.Repeat("m", 2*request.MaxStampField), request.MaxStampField)
			})},
		"Envoy's start after the departure: no gateway time": {events: stream, end: 142,
			facts: func(m *Request) { m.EnvoyStart = at(0.064) },
			want:  with(timed, func(v *stampView) { v.start, v.gw, v.total = 0, 0, 142 }), settles: settled(request.EndComplete, nil)},
		"checks longer than the clocks allow move the start": {events: stream, end: 142,
			facts: func(m *Request) { m.EnvoyStart, m.Stamp.Gateway.Checks = at(-1), 2*time.Millisecond },
			want:  with(timed, func(v *stampView) { v.start, v.gw, v.total = -2, 0, 144 }), settles: settled(request.EndComplete, nil)},
		"without Envoy's start: from the departure": {events: stream, end: 142, facts: func(m *Request) { m.EnvoyStart = time.Time{} },
			want: with(timed, func(v *stampView) { v.start, v.gw, v.total = 0, 0, 142 }), settles: settled(request.EndComplete, nil)},
		"a late read: sent at the gate's answer": {events: stream, end: 142,
			facts:   func(m *Request) { m.Sent, m.GateSent = at(95), at(0) },
			want:    with(timed, func(v *stampView) { v.timing = request.TimingLateRead }),
			settles: settled(request.EndComplete, nil)},
		"a read within the hand-off stands": {events: stream, end: 142,
			facts:   func(m *Request) { m.Sent, m.GateSent = at(1), at(0) },
			want:    with(timed, func(v *stampView) { v.sent, v.ttft, v.e2e, v.gw = 1, 99, 141, 4 }),
			settles: settled(request.EndComplete, nil)},
		"a stall before the first token": {events: stream, end: 142,
			ended: func(e *End) { e.Stalls = []Stall{{at(50), at(95)}} },
			want:  with(timed, func(v *stampView) { v.timing = request.TimingLateRead }), settles: settled(request.EndComplete, nil)},
		"a stall after the first token": {events: stream, end: 142,
			ended: func(e *End) { e.Stalls = []Stall{{at(110), at(125)}} },
			want:  with(timed, func(v *stampView) { v.timing = request.TimingLateStream }), settles: settled(request.EndComplete, nil)},
		"Envoy timed it: no stall of ours counts": {events: stream, end: 142,
			facts: func(m *Request) { m.EnvoyTimed, m.GateSent, m.Sent = true, at(-50), at(0) },
			ended: func(e *End) { e.Stalls = []Stall{{at(50), at(95)}} },
			want:  timed, settles: settled(request.EndComplete, nil)},
	} {
		t.Run(name, func(t *testing.T) {
			m := &Request{Sent: at(0), EnvoyStart: at(-3), Reservation: "r-1", Origin: request.OriginPool}
			m.Stamp = request.Stamp{RequestID: "req-1", Model: "m", Decision: "allow", Tenant: "acme", Principal: "key-1",
				Reason: "ok", Status: 200, PoolsTried: []string{"a", "b"}, Pool: "b", PromptTokens: 9}
			m.Tally.API, m.Tally.MaxGaps, m.Tally.SSE = openai.APIChat, 100, c.nonSSE == ""
			for _, ev := range c.events {
				m.Tally.Body([]byte(ev.body), at(float64(ev.at)))
			}
			if c.nonSSE != "" {
				m.Tally.Body([]byte(c.nonSSE), at(c.end))
			}
			if c.facts != nil {
				c.facts(m)
			}
			m.Tally.End(at(c.end))
			e := End{At: at(c.end), Complete: true, Trusted: true, PoolName: pools}
			if c.ended != nil {
				c.ended(&e)
			}
			before := *m
			o := StampOf(m, e)
			st := o.Stamp
			got := stampView{complete: st.Complete, start: msOf(st.Start), sent: msOf(o.Sent), end: msOf(o.End), timing: st.Timing,
				ttft: ms(st.TTFT), e2e: ms(st.E2E), gw: ms(st.Gateway.Total), total: ms(st.Total), source: st.TokenSource,
				prompt: st.PromptTokens, completion: st.CompletionTokens, events: st.ContentEvents, unread: st.UnreadEvents,
				p50: ms(st.ITLP50), p95: ms(st.ITLP95), decision: st.Decision, tenant: st.Tenant, who: st.Principal,
				unverified: st.Unverified, pool: st.Pool, poolsTried: strings.Join(st.PoolsTried, ","), model: st.Model}
			if got != c.want {
				t.Errorf("stamp\n got %+v\nwant %+v", got, c.want)
			}
			if !st.Sent.Equal(o.Sent) || st.Total != st.Gateway.Total+st.Gateway.Checks+st.E2E {
				t.Errorf("sent %v (outcome %v), total %v: not the sum of its parts", st.Sent, o.Sent, st.Total)
			}
			if st.Unverified && (st.Reason != "" || o.Reservation != "") {
				t.Errorf("an untrusted stamp keeps reason %q, reservation %q", st.Reason, o.Reservation)
			}
			s := SettlementOf(m, &o)
			if (s == nil) != (c.settles == nil) || s != nil && *s != *c.settles {
				t.Errorf("settlement\n got %+v\nwant %+v", s, c.settles)
			}
			// Pure: m is as it was.
			if !slices.Equal(m.Stamp.PoolsTried, []string{"a", "b"}) || m.Stamp.Pool != "b" || !m.Sent.Equal(before.Sent) ||
				m.Cut != before.Cut || m.Reservation != before.Reservation || m.Stamp.Decision != before.Stamp.Decision ||
				m.Stamp.TTFT != 0 || m.Stamp.Timing != "" {
				t.Errorf("stampOf changed its facts: %+v", m.Stamp)
			}
		})
	}
}

func with(v stampView, edit func(*stampView)) stampView {
	edit(&v)
	return v
}

// timedEvent is a chunk of a response body and its arrival, in ms.
type timedEvent struct {
	at   int
	body string
}

const usageChunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n"
