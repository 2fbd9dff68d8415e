package ratelimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid reports limits or costs no backend can enforce: a window that
// is not a positive whole number of milliseconds, a negative amount or cost,
// or an unknown unit. It does not wrap ErrUnavailable, so WithFallback
// returns it as is instead of falling back.
var ErrInvalid = errors.New("invalid rate limit")

// DefaultCounterPrefix starts every counter id unless RedisOptions.Prefix
// says otherwise.
const DefaultCounterPrefix = "ig:rl:"

// validate checks limits and cost before a backend charges anything.
func validate(limits []Limit, cost Cost) error {
	if cost.Requests < 0 || cost.InputTokens < 0 || cost.OutputTokens < 0 {
		return fmt.Errorf("%w: negative cost %+v", ErrInvalid, cost)
	}
	for i := range limits {
		l := &limits[i]
		switch l.Unit {
		case Requests, InputTokens, OutputTokens, TotalTokens:
		default:
			return fmt.Errorf("%w: limit %q: unknown unit %q", ErrInvalid, l.Name, l.Unit)
		}
		if l.Window < time.Millisecond || l.Window%time.Millisecond != 0 {
			return fmt.Errorf("%w: limit %q: window %s is not a positive whole number of milliseconds", ErrInvalid, l.Name, l.Window)
		}
		if l.Amount < 0 {
			return fmt.Errorf("%w: limit %q: negative amount %d", ErrInvalid, l.Name, l.Amount)
		}
	}
	return nil
}

// window returns the start and end (Unix ms) of the fixed window of length
// w that holds nowMs. Windows are aligned to multiples of w since the Unix
// epoch, so every replica with a synchronised clock picks the same one.
func window(nowMs int64, w time.Duration) (start, end int64) {
	wm := w.Milliseconds()
	start = nowMs - nowMs%wm
	if nowMs < 0 && nowMs%wm != 0 { // before 1970: keep flooring
		start -= wm
	}
	return start, start + wm
}

// untilMs is the time from now until the Unix millisecond endMs.
func untilMs(now time.Time, endMs int64) time.Duration {
	return time.UnixMilli(endMs).Sub(now)
}

// writeCounterID writes the id of a limit's counter for the window
// starting at startMs:
//
//	<prefix>{<key>}:<unit>:<windowMs>:<startMs>
//
// The window length is part of the id because two limits on the same key
// and unit with different windows (a minute and an hour) can start at the
// same instant and must not share a counter. The braces make the key a
// Redis Cluster hash tag; with a non-empty hashTag the id is
// <prefix>{<hashTag>}:<key>:<unit>:<windowMs>:<startMs> instead. Ids are
// decodable from the right (the last three fields hold no ':'), so
// different limits never collide whatever their keys contain.
func writeCounterID(b *strings.Builder, prefix, hashTag string, l *Limit, startMs int64) {
	var num [20]byte
	b.WriteString(prefix)
	b.WriteByte('{')
	if hashTag != "" {
		b.WriteString(hashTag)
		b.WriteString("}:")
		b.WriteString(l.Key)
	} else {
		b.WriteString(l.Key)
		b.WriteByte('}')
	}
	b.WriteByte(':')
	b.WriteString(string(l.Unit))
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], l.Window.Milliseconds(), 10))
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], startMs, 10))
}

// idLen bounds the length of a counter id.
func idLen(prefix, hashTag string, l *Limit) int {
	return len(prefix) + len(hashTag) + len(l.Key) + len(l.Unit) + 48
}

// counterID returns the id of one counter.
func counterID(prefix, hashTag string, l *Limit, startMs int64) string {
	var b strings.Builder
	b.Grow(idLen(prefix, hashTag, l))
	writeCounterID(&b, prefix, hashTag, l, startMs)
	return b.String()
}

// counterIDs sets ids[i] and ends[i] to the counter id and window end of
// limits[i] in the windows holding nowMs; all ids share one allocation.
func counterIDs(prefix, hashTag string, limits []Limit, nowMs int64, ids []string, ends []int64) {
	n := 0
	for i := range limits {
		n += idLen(prefix, hashTag, &limits[i])
	}
	var b strings.Builder
	b.Grow(n)
	from := 0
	for i := range limits {
		start, end := window(nowMs, limits[i].Window)
		ends[i] = end
		writeCounterID(&b, prefix, hashTag, &limits[i], start)
		ids[i] = b.String()[from:]
		from = b.Len()
	}
}

// newResult returns the States and, if admitted, the Entries of a result
// for n limits, in one allocation for the common small n.
func newResult(n int, admitted bool) ([]State, []Entry) {
	switch {
	case !admitted:
		return make([]State, n), nil
	case n == 1:
		b := new(struct {
			s [1]State
			e [1]Entry
		})
		return b.s[:], b.e[:]
	case n == 2:
		b := new(struct {
			s [2]State
			e [2]Entry
		})
		return b.s[:], b.e[:]
	case n <= 4:
		b := new(struct {
			s [4]State
			e [4]Entry
		})
		return b.s[:n], b.e[:n]
	}
	return make([]State, n), make([]Entry, n)
}

// fillStates sets the per-limit states from the counters' values (after
// the charge when admitted, as found when denied).
func fillStates(st []State, limits []Limit, used []int64, ends []int64, now time.Time) {
	for i := range limits {
		st[i] = State{
			Limit:     limits[i],
			Remaining: max(0, limits[i].Amount-used[i]),
			Reset:     untilMs(now, ends[i]),
		}
	}
}

// settleDelta is what settling an entry adds to its counter, and whether
// the entry is to be touched at all: request counts are final at admission
// (an admitted request counts as one whatever actual.Requests says), and
// counters whose window has ended are left alone.
func settleDelta(e *Entry, actual Cost, nowMs int64) (int64, bool) {
	if e.Unit == Requests || e.ExpiresAt <= nowMs {
		return 0, false
	}
	d := actual.Of(e.Unit) - e.Reserved
	return d, d != 0
}

func errNegativeActual(actual Cost) error {
	return fmt.Errorf("%w: negative actual cost %+v", ErrInvalid, actual)
}
