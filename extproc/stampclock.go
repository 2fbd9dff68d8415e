package extproc

import (
	"time"

	"github.com/infergate/infergate/internal/request"
)

// maxHandoff bounds how long after the gate answered the meter may read
// the request headers and still vouch for the read: Envoy hands them on
// as the request goes upstream, 0.4–0.9 ms after the gate's answer on a
// loaded 2-CPU machine. A later read was held up in infergate (its CPU
// starved, the process stopped, its streams backlogged), not in Envoy.
const maxHandoff = 10 * time.Millisecond

// clockFacts are what the meter knows of one request's times, each on the
// clock it was read from: Envoy's, the gate's, the meter's reads.
type clockFacts struct {
	envoyStart  time.Time // Envoy received the request (request.time); zero: unknown
	gateSent    time.Time // the gate answered (its field); zero: unknown
	headersRead time.Time // the meter read the request headers; zero: skipped
	firstRead   time.Time // the meter read the first content token (or the body's end); zero: none
	endRead     time.Time // the meter read the response's end
}

// clockVerdict is when the request left the gateway, and whether the meter
// can vouch for the times it stamps from there.
type clockVerdict struct {
	sent   time.Time
	timing request.Timing
}

// stampClock dates the request's departure from the meter's read of the
// request headers, checked against the gate's answer: the request cannot
// leave before the gate answered, and Envoy hands the meter its headers
// within maxHandoff of that. A read later than that was late: the request
// left at the gate's answer (right within maxHandoff), and whatever the
// meter read in the backlog that followed (within maxHandoff of the late
// read) may have passed Envoy at any time since, so its TTFT and E2E are
// only upper bounds and the stamp is marked late_read. A gate's answer
// that runs ahead of the read, or before Envoy had the request, is another
// replica's skewed clock (as is one over the hour before it, which no
// gate writes): not comparable, so the read stands unchecked.
// A meter that skipped the request headers has nothing to check here (its
// departure is the gate's answer, see departure).
func stampClock(f clockFacts) clockVerdict {
	read := f.headersRead
	if read.IsZero() || f.gateSent.IsZero() || f.gateSent.After(read) ||
		!f.envoyStart.IsZero() && f.gateSent.Before(f.envoyStart) || read.Sub(f.gateSent) > time.Hour ||
		read.Sub(f.gateSent) <= maxHandoff {
		return clockVerdict{sent: read, timing: request.TimingOK}
	}
	v := clockVerdict{sent: f.gateSent, timing: request.TimingOK}
	next := f.firstRead
	if next.IsZero() {
		next = f.endRead
	}
	if !next.After(read.Add(maxHandoff)) {
		v.timing = request.TimingLateRead
	}
	return v
}
