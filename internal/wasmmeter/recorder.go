package wasmmeter

import (
	"strings"
	"time"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/tally"
)

// Recorder is one response as the meter sees it, fed as Envoy's callbacks
// arrive. It counts what extproc's meter counts (internal/tally, the same
// code) and no more; the rest (percentiles, labels, settlement) is
// infergate's, from the summary. Everything it holds is bounded (see
// tally.Response): gaps to MaxGaps.
type Recorder struct {
	// MaxLine bounds an SSE line or event (default sse.DefaultMaxLine).
	MaxLine int

	start time.Time
	t     tally.Response
	sum   Summary
	ended bool
}

// Start is when the request left the gateway: the filter, placed after the
// gate, sees the request headers once the gate has answered. api is the
// request's (from its path; "" when it names none: then the response's).
func (r *Recorder) Start(at time.Time, api openai.API) {
	r.start = at
	r.t.API, r.t.MaxGaps, r.t.Parser.MaxLine = api, MaxGaps, r.MaxLine
}

// Started reports whether Start was called: the filter saw the request.
func (r *Recorder) Started() bool { return !r.start.IsZero() }

// ResponseHeaders takes the response's content type.
func (r *Recorder) ResponseHeaders(contentType string) {
	r.t.SSE = strings.HasPrefix(contentType, "text/event-stream")
}

// Body takes one chunk of the response body as it passes, at its arrival.
// chunk is only read during the call.
func (r *Recorder) Body(chunk []byte, at time.Time) { r.t.Body(chunk, at) }

// End closes the record at `at`: complete when the response reached its
// end, else Envoy cut it (a client or pool reset). Only the first call
// counts; ok is false for it too when Start was never called (a response
// the gate answered itself, stamped there).
func (r *Recorder) End(complete bool, at time.Time) (s *Summary, ok bool) {
	if r.ended || !r.Started() {
		return nil, false
	}
	r.ended = true
	t := &r.t
	t.End(at)
	if done, ok := t.Terminal(); ok && !complete { // the client left at [DONE]
		complete, at = true, done
	}
	r.sum = Summary{
		Start: r.start, Complete: complete, SSE: t.SSE, API: t.API, E2E: at.Sub(r.start),
		ContentEvents: t.ContentEvents, Usage: t.Usage, OutputOnly: t.OutputOnly, Input: t.Input, HasInput: t.HasInput,
		BadEvents: t.BadEvents, Dropped: t.Parser.Dropped, Overflowed: t.Parser.Overflowed,
		ITLMax: t.ITLMax, ResponseModel: t.Model, Gaps: t.Gaps,
	}
	if !t.First.IsZero() {
		r.sum.HasFirst, r.sum.TTFT = true, t.First.Sub(r.start)
	}
	return &r.sum, true
}
