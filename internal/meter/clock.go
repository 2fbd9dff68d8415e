package meter

import (
	"time"

	"github.com/infergate/infergate/internal/request"
)

// MaxHandoff bounds how long after the gate answered the meter may read
// the request headers and still vouch for the read: Envoy hands them on
// as the request goes upstream, 0.4–0.9 ms after the gate's answer on a
// loaded 2-CPU machine. A later read was held up in infergate (its CPU
// starved, the process stopped, its streams backlogged), not in Envoy. It
// bounds, the same way, how soon after a stall the meter drains what
// queued during it.
const MaxHandoff = 10 * time.Millisecond

// clockFacts are what the meter knows of one request's times, each on the
// clock it was read from: Envoy's, the gate's, the meter's reads.
type clockFacts struct {
	envoyStart time.Time // Envoy received the request (request.time); zero: unknown
	gateSent   time.Time // the gate answered (its field); zero: unknown
	// departed is the meter's read of the request headers, or for a meter
	// that skips them the gate's answer as departure bounds it.
	departed time.Time
	// picked: an Endpoint Picker sat between the gate and the meter (the
	// request headers carried its choice): the read may come long after
	// the gate's answer, the picker's time.
	picked    bool
	firstRead time.Time // the meter read the first content token (or the body's end); zero: none
	endRead   time.Time // the meter read the response's end
	stalls    []Stall   // when infergate did not run (StallWatch)
}

// clockVerdict is when the request left the gateway, and whether the meter
// can vouch for the times it stamps from there.
type clockVerdict struct {
	sent   time.Time
	timing request.Timing
	picker time.Duration // the picker's time (clockFacts.picked); 0: not measured
}

// stampClock dates the request's departure and says whether the meter can
// vouch for its times.
//
// The departure is the meter's read of the request headers, checked
// against the gate's answer: the request cannot leave before the gate
// answered, and Envoy hands the meter its headers within MaxHandoff of
// that. A later read was late: the request left at the gate's answer
// (right within MaxHandoff), and whatever the meter read in the backlog
// that followed (within MaxHandoff of the late read) may have passed Envoy
// at any time since. A gate's answer that runs ahead of the read, or
// before Envoy had the request, or over an hour before, is another
// replica's skewed clock or no gate's: not comparable, the read stands.
//
// With an Endpoint Picker between them (picked), the read comes after the
// picker chose, as long after the gate's answer as the picker took: it is
// the departure, and that span the picker's time, unless a stall of
// infergate's overlapped it (then the picker's time is not measured and
// the departure is the gate's answer, as for a late read).
//
// The response's reads have no Envoy time to be checked against (Envoy
// stamps none on a message): a stall of infergate's that ended less than
// MaxHandoff before the first token's read (the end's, without one) may
// have held it up, and the stamp is late_read: its TTFT and E2E are upper
// bounds, its gaps not the stream's. A stall after that read, before the
// end, held up only what followed: late_stream, its TTFT measured, its
// gaps and E2E not.
func stampClock(f clockFacts) clockVerdict {
	v := clockVerdict{sent: f.departed, timing: request.TimingOK}
	next := f.firstRead
	if next.IsZero() {
		next = f.endRead
	}
	read, gate := f.departed, f.gateSent
	comparable := !read.IsZero() && !gate.IsZero() && !gate.After(read) && read.Sub(gate) <= time.Hour &&
		(f.envoyStart.IsZero() || !gate.Before(f.envoyStart))
	switch {
	case comparable && f.picked && !stalled(f.stalls, gate, read):
		v.picker = read.Sub(gate)
	case comparable && read.Sub(gate) > MaxHandoff:
		v.sent = gate
		if !next.After(read.Add(MaxHandoff)) {
			v.timing = request.TimingLateRead
		}
	}
	from := v.sent
	if b := next.Add(-MaxHandoff); b.After(from) {
		from = b
	}
	for _, s := range f.stalls {
		switch {
		case !s.To.After(from) || !s.From.Before(f.endRead):
		case s.From.Before(next):
			v.timing = request.TimingLateRead
		case v.timing == request.TimingOK:
			v.timing = request.TimingLateStream
		}
	}
	return v
}

// stalled reports whether a stall overlapped (from, to).
func stalled(stalls []Stall, from, to time.Time) bool {
	for _, s := range stalls {
		if s.To.After(from) && s.From.Before(to) {
			return true
		}
	}
	return false
}
