package wasmmeter

import (
	"strings"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/sse"
)

// bodyKeep bounds what is kept of a non-streamed response: one that fits
// is read whole (usage, model, content); a longer one only for its model
// (and it carries content). extproc's meter also reads a longer one's usage
// from its tail; here it is charged its reservation instead (rare: a
// response over 64 KiB is logprobs-heavy).
const bodyKeep = 64 << 10

// Recorder is one response as the meter sees it, fed as Envoy's callbacks
// arrive. It does what extproc's meter does per chunk (meterRequest.observe
// and onEvent) and no more; the rest (percentiles, labels, settlement) is
// infergate's, from the summary. Everything it holds is bounded: the SSE
// carry-over (MaxLine), the gaps (MaxGaps), the body (64 KiB).
type Recorder struct {
	// MaxLine bounds an SSE line or event (default sse.DefaultMaxLine).
	MaxLine int

	sum     Summary
	parser  sse.Parser
	emit    func(sse.Event)
	chunkAt time.Time
	first   time.Time
	last    time.Time
	body    []byte
	total   int
	ended   bool
}

// Start is when the request left the gateway: the filter, placed after the
// gate, sees the request headers once the gate has answered.
func (r *Recorder) Start(at time.Time) {
	r.sum.Start = at
	r.parser.MaxLine = r.MaxLine
	r.emit = r.onEvent
}

// Started reports whether Start was called: the filter saw the request.
func (r *Recorder) Started() bool { return !r.sum.Start.IsZero() }

// ResponseHeaders takes the response's content type.
func (r *Recorder) ResponseHeaders(contentType string) {
	r.sum.SSE = strings.HasPrefix(contentType, "text/event-stream")
}

// Body takes one chunk of the response body as it passes, at its arrival.
// chunk is only read during the call.
func (r *Recorder) Body(chunk []byte, at time.Time) {
	r.chunkAt = at
	if r.sum.SSE {
		r.parser.Feed(chunk, r.emit)
		return
	}
	r.total += len(chunk)
	if room := bodyKeep - len(r.body); room > 0 {
		r.body = append(r.body, chunk[:min(room, len(chunk))]...)
	}
}

// onEvent is extproc's meterRequest.onEvent.
func (r *Recorder) onEvent(ev sse.Event) {
	if ev.Done {
		return
	}
	c, err := openai.ParseChunk(ev.Data)
	if err != nil {
		r.sum.BadEvents++
		return
	}
	if c.Usage != nil {
		u := *c.Usage
		r.sum.Usage = &u
	}
	if r.sum.ResponseModel == "" {
		r.sum.ResponseModel = openai.ChunkModel(ev.Data)
	}
	if !c.Content {
		return
	}
	r.sum.ContentEvents++
	if r.first.IsZero() {
		r.first = r.chunkAt
	} else {
		gap := r.chunkAt.Sub(r.last)
		r.sum.ITLMax = max(r.sum.ITLMax, gap)
		if len(r.sum.Gaps) < MaxGaps {
			r.sum.Gaps = append(r.sum.Gaps, gap)
		}
	}
	r.last = r.chunkAt
}

// End closes the record at `at`: complete when the response reached its
// end, else Envoy cut it (a client or pool reset). Only the first call
// counts; ok is false for it too when Start was never called (a response
// the gate answered itself, stamped there).
func (r *Recorder) End(complete bool, at time.Time) (s *Summary, ok bool) {
	if r.ended || !r.Started() {
		return nil, false
	}
	r.ended = true
	s = &r.sum
	s.Complete = complete
	if s.SSE {
		r.parser.Flush(r.emit)
	} else if r.total > 0 {
		r.readBody(at)
	}
	s.Dropped, s.Overflowed = r.parser.Dropped, r.parser.Overflowed
	s.E2E = at.Sub(s.Start)
	if !r.first.IsZero() {
		s.HasFirst, s.TTFT = true, r.first.Sub(s.Start)
	}
	return s, true
}

// readBody reads a non-streamed response as extproc's jsonBody does: whole
// when it was kept whole.
func (r *Recorder) readBody(at time.Time) {
	if r.total > len(r.body) {
		r.sum.ResponseModel = openai.ChunkModel(r.body)
		r.sum.ContentEvents, r.first = 1, at
		return
	}
	c, err := openai.ParseChunk(r.body)
	if err != nil {
		return
	}
	r.sum.Usage, r.sum.ResponseModel = c.Usage, openai.ChunkModel(r.body)
	if c.Content {
		r.sum.ContentEvents, r.first = 1, at
	}
}
