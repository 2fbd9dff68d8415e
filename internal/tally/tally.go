// Package tally is what a meter counts of one response as it passes, the
// same for every API: content events, the first one's arrival and every
// gap after it, the usage, the response's model, unreadable events. Both
// meters use it: extproc's (fed by ext_proc messages) and the in-Envoy one
// (internal/wasmmeter, fed by Envoy's callbacks), so it builds for wasip1:
// only the standard library, internal/sse and internal/openai.
package tally

import (
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/sse"
)

// Response is one response's count. Set API (the gate's, when known),
// SSE and MaxGaps, feed it with Body, close it with End. Everything it
// holds is bounded: the SSE carry-over (Parser.MaxLine), the gaps
// (MaxGaps), a non-streamed body (its first 64 KiB, its usage and model).
type Response struct {
	// API is the response's API: the gate's when the caller knows it,
	// else the stream's own, from its first event that tells (or a body's
	// start).
	API     openai.API
	SSE     bool // a text/event-stream response
	MaxGaps int  // the gaps kept; ITLMax still sees every one
	Parser  sse.Parser

	ContentEvents int
	First         time.Time // the first content event's arrival (zero: none)
	Gaps          []time.Duration
	ITLMax        time.Duration
	Model         string // the model the response names
	// Usage is the last usage reported, merged as Anthropic reports it:
	// the input first (Input), the output at the end. OutputOnly: Usage's
	// input is not the response's own (an output count with no input
	// before it): the caller's estimate stands for it.
	Usage      *openai.Usage
	OutputOnly bool
	// Input is an input count reported ahead of the output (Anthropic's
	// message_start), HasInput whether one was: it replaces the gate's
	// estimate at once, so that a stream cut before its output's count
	// still settles the real input.
	// InputCached and InputCacheWrite are its prompt-cache parts.
	Input                        int
	InputCached, InputCacheWrite int
	HasInput                     bool
	BadEvents                    int // events that could not be read

	emit     func(sse.Event) // bound once: no closure per chunk
	chunkAt  time.Time
	terminal time.Time // the arrival of the stream's [DONE]
	ended    bool      // the stream's terminal event was seen
	last     time.Time
	body     jsonBody
}

// Body takes one chunk of the response body, arrived at `at`. chunk is only
// read during the call.
func (r *Response) Body(chunk []byte, at time.Time) {
	r.chunkAt = at
	if !r.SSE {
		r.body.write(chunk)
		return
	}
	if r.emit == nil {
		r.emit = r.onEvent
	}
	r.Parser.Feed(chunk, r.emit)
}

// End closes the count when the response ended at `at`: an event left
// without its blank line is read, a non-streamed body is read whole (its
// one "event" arrives at its end). Call it once.
func (r *Response) End(at time.Time) {
	if r.SSE {
		if r.emit == nil {
			r.emit = r.onEvent
		}
		r.Parser.Flush(r.emit)
		return
	}
	if usage, model, content := r.body.read(&r.API); model != "" || usage != nil || content {
		r.Usage, r.Model = usage, model
		if content {
			r.ContentEvents, r.First = 1, at
		}
	}
}

// Terminal reports when the stream's terminal event ([DONE]) arrived. A
// client may leave right then, before the response's end reaches Envoy
// (the official OpenAI SDKs close the response on [DONE]): it had the
// whole response, so the meters count it complete, ended then.
func (r *Response) Terminal() (time.Time, bool) { return r.terminal, !r.terminal.IsZero() }

// Ended reports whether the stream ended properly: its [DONE], or its
// API's terminal event (response.completed, .incomplete or .failed;
// message_stop), was seen.
func (r *Response) Ended() bool { return r.ended }

// MaxKept is the most a Response holds of a non-streamed body.
const MaxKept = jsonKeep + maxUsageValue + maxModelValue

// Kept is how much of a non-streamed body r holds.
func (r *Response) Kept() int {
	return len(r.body.head) + len(r.body.scan.usage.buf) + len(r.body.scan.model.buf)
}

// Unread is what could not be read: bad events, overlong lines and events.
func (r *Response) Unread() int { return r.BadEvents + r.Parser.Dropped + r.Parser.Overflowed }

// onEvent is the per-event hot path: decode the few fields needed, time
// content-bearing events.
func (r *Response) onEvent(ev sse.Event) {
	if ev.Done {
		r.terminal, r.ended = r.chunkAt, true
		return
	}
	if r.API == "" {
		r.API = openai.StreamAPI(ev.Name, ev.Data)
	}
	var c openai.Chunk
	var err error
	switch r.API {
	case openai.APIResponses, openai.APIMessages:
		c, err = openai.ParseEvent(r.API, ev.Name, ev.Data)
	default: // chat and text completions: each chunk names the model
		if c, err = openai.ParseChunk(ev.Data); err == nil && r.Model == "" {
			c.Model = openai.ChunkModel(ev.Data)
		}
	}
	if err != nil {
		r.BadEvents++
		return
	}
	switch string(ev.Name) {
	case "response.completed", "response.incomplete", "response.failed":
		r.ended = r.ended || r.API == openai.APIResponses
	case "message_stop":
		r.ended = r.ended || r.API == openai.APIMessages
	}
	if c.Usage != nil {
		r.takeUsage(&c)
	}
	if r.Model == "" {
		r.Model = c.Model
	}
	if !c.Content {
		return
	}
	r.ContentEvents++
	if r.First.IsZero() {
		r.First = r.chunkAt
	} else {
		gap := r.chunkAt.Sub(r.last)
		r.ITLMax = max(r.ITLMax, gap)
		if len(r.Gaps) < r.MaxGaps {
			r.Gaps = append(r.Gaps, gap)
		}
	}
	r.last = r.chunkAt
}

// takeUsage keeps what an event reports of the usage. An output-only
// count takes its input from the usage before it, else from an input-only
// event, else it is left to the caller's estimate (OutputOnly).
func (r *Response) takeUsage(c *openai.Chunk) {
	u := *c.Usage
	switch {
	case c.InputOnly:
		r.Input, r.InputCached, r.InputCacheWrite, r.HasInput = u.PromptTokens, u.CachedTokens, u.CacheWriteTokens, true
		return
	case c.OutputOnly:
		switch {
		case r.Usage != nil:
			u.PromptTokens, u.CachedTokens, u.CacheWriteTokens = r.Usage.PromptTokens, r.Usage.CachedTokens, r.Usage.CacheWriteTokens
		case r.HasInput:
			u.PromptTokens, u.CachedTokens, u.CacheWriteTokens, r.OutputOnly = r.Input, r.InputCached, r.InputCacheWrite, false
		default:
			u.PromptTokens, r.OutputOnly = 0, true
		}
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
	default:
		r.OutputOnly = false
	}
	r.Usage = &u
}
