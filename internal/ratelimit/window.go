package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid reports limits or costs no backend can enforce: a window that
// is not a positive whole number of milliseconds, a negative amount or
// cost, or an unknown unit. It does not wrap ErrUnavailable, so
// WithFallback returns it as is instead of falling back.
var ErrInvalid = errors.New("invalid rate limit")

// ErrTooLarge reports a cost that no window of a limit can admit: larger
// than the limit's Amount, or saturated (math.MaxInt64, which stands for
// "at least that much": a worst case whose arithmetic saturated). Retrying
// cannot succeed, so it is an error, not a denial with a RetryAfter. Every
// backend returns it, as a *TooLargeError, before reading or charging any
// counter. It does not wrap ErrUnavailable or ErrInvalid.
var ErrTooLarge = errors.New("cost larger than the limit")

// TooLargeError is the ErrTooLarge of one limit: the first, in the order
// given, whose unit's cost no window of it can hold.
type TooLargeError struct {
	Limit Limit
	Cost  int64 // cost.Of(Limit.Unit); math.MaxInt64 when saturated
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%v: limit %q allows %d %s per %s, the request costs %s", ErrTooLarge,
		e.Limit.Name, e.Limit.Amount, e.Limit.Unit, WindowName(e.Limit.Window), e.CostString())
}

// Saturated reports whether the cost saturated (it is at least Cost).
func (e *TooLargeError) Saturated() bool { return e.Cost == math.MaxInt64 }

// CostString is the cost as a count, "at least" it when it saturated.
func (e *TooLargeError) CostString() string {
	if e.Saturated() {
		return "at least " + strconv.FormatInt(e.Cost, 10)
	}
	return strconv.FormatInt(e.Cost, 10)
}

func (e *TooLargeError) Unwrap() error { return ErrTooLarge }

// DefaultCounterPrefix starts every counter id unless RedisOptions.Prefix
// says otherwise.
const DefaultCounterPrefix = "ig:rl:"

// validate checks limits and cost before a backend charges anything.
func validate(limits []Limit, cost Cost) error {
	if cost.Requests < 0 || cost.InputTokens < 0 || cost.OutputTokens < 0 || cost.Money < 0 {
		return fmt.Errorf("%w: negative cost %+v", ErrInvalid, cost)
	}
	for i := range limits {
		l := &limits[i]
		switch l.Unit {
		case Requests, InputTokens, OutputTokens, TotalTokens, Money:
		default:
			return fmt.Errorf("%w: limit %q: unknown unit %q", ErrInvalid, l.Name, l.Unit)
		}
		if l.Window != Month && (l.Window < time.Millisecond || l.Window%time.Millisecond != 0) {
			return fmt.Errorf("%w: limit %q: window %s is not a positive whole number of milliseconds", ErrInvalid, l.Name, l.Window)
		}
		if l.Amount < 0 {
			return fmt.Errorf("%w: limit %q: negative amount %d", ErrInvalid, l.Name, l.Amount)
		}
	}
	return tooLarge(limits, cost)
}

// tooLarge is the *TooLargeError of the first limit whose cost exceeds its
// Amount or saturated; nil when every limit could admit cost on an unused
// counter. Checked before any counter is read, so every backend refuses
// the same requests the same way.
func tooLarge(limits []Limit, cost Cost) error {
	for i := range limits {
		if c := cost.Of(limits[i].Unit); c > limits[i].Amount || c == math.MaxInt64 {
			return &TooLargeError{Limit: limits[i], Cost: c}
		}
	}
	return nil
}

// addSat is what a counter at used (>= 0) becomes when a settlement adds
// delta to it: used + delta held to [0, math.MaxInt64], never wrapping. A
// saturated counter (math.MaxInt64) stays saturated until its window ends:
// what it lost past math.MaxInt64 is unknown, so subtracting a refund from
// it could forget a charge, while keeping it can only over-charge.
func addSat(used, delta int64) int64 {
	switch {
	case used == math.MaxInt64:
		return used
	case delta > 0 && used > math.MaxInt64-delta:
		return math.MaxInt64
	case used+delta < 0: // delta < 0 here: no overflow
		return 0
	}
	return used + delta
}

// admits reports whether a counter at used can take cost under amount,
// without overflowing (used, cost and amount non-negative; used may be
// above amount after a settlement charged more than reserved).
func admits(used, cost, amount int64) bool { return used <= amount && cost <= amount-used }

// window returns the start and end (Unix ms) of the fixed window of length
// w that holds nowMs. Windows are aligned to multiples of w since the Unix
// epoch, so every replica with a synchronised clock picks the same one;
// Month's are the calendar months, UTC.
func window(nowMs int64, w time.Duration) (start, end int64) {
	if w == Month {
		t := time.UnixMilli(nowMs).UTC()
		first := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return first.UnixMilli(), first.AddDate(0, 1, 0).UnixMilli()
	}
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
// same instant and must not share a counter; a calendar month's is
// "month". The braces make the key a
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
	b.WriteString(windowField(l.Window))
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], startMs, 10))
}

// monthField is a calendar month's window field in a counter id.
const monthField = "month"

// windowField is w's field in a counter id: its length in ms, or "month".
func windowField(w time.Duration) string {
	if w == Month {
		return monthField
	}
	return strconv.FormatInt(w.Milliseconds(), 10)
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

// adjustment is one counter change of a Settle or Release.
type adjustment struct {
	counter string
	delta   int64
	// carried marks the charge of an entry whose window had ended,
	// carried into the counter of the same limit in the window in force
	// (created if absent): unit, head (the id up to the unit, see
	// parseCounterID), window, start and end (Unix ms) describe that
	// counter.
	carried    bool
	unit       Unit
	head       string
	window     time.Duration
	start, end int64
	// limit, when positive, is the counter's limit (Entry.Limit) for a
	// charge (delta > 0): the part of it that takes the counter past the
	// limit is debt, moved into the windows after end (see overLimit,
	// debtPart and debtWindow), whose counters have the id prefix
	// idPrefix (the id up to its last field, the window's start).
	limit    int64
	idPrefix string
}

// MaxDebtWindows bounds how many windows after its own a charge past a
// limit is carried into: each is filled up to the limit, the last takes
// whatever is left. A budget exceeded that many times over is paid back
// over that many windows; past it, the last one holds the rest (it admits
// nothing) and a settlement writes at most this many counters per entry.
const MaxDebtWindows = 16

// overLimit is the debt a charge of d makes on a counter that stood at
// used under limit: the part of the charge above both the limit and where
// the counter stood (what was over it before, a lowered limit's, is not
// this charge's). 0 without a positive limit or charge. The sum
// saturates: it never wraps.
func overLimit(used, d, limit int64) int64 {
	if d <= 0 || limit <= 0 {
		return 0
	}
	after := used + d
	if used > math.MaxInt64-d {
		after = math.MaxInt64
	}
	return max(0, after-max(used, limit))
}

// debtPart is how much of the debt rest the k-th window after a charge's
// (1-based) takes, its counter standing at used: what fills it up to
// limit, or all of rest in the last window (MaxDebtWindows).
func debtPart(rest, used, limit int64, k int) int64 {
	if k >= MaxDebtWindows {
		return rest
	}
	return min(rest, max(0, limit-max(used, 0)))
}

// debtWindow is the counter id and window (start, end, Unix ms) of the
// k-th window (1-based) after a's: a's counter id but for its last field.
func (a *adjustment) debtWindow(k int) (id string, start, end int64) {
	end = a.end
	for range k {
		start, end = window(end, a.window)
	}
	return a.idPrefix + strconv.FormatInt(start, 10), start, end
}

// withDebt makes a, a charge on the counter of entry e (in force, or
// carried into the window [a.start, a.end)), carry what it takes past
// e.Limit into the windows that follow. An entry whose counter id cannot
// be read carries none.
func withDebt(a adjustment, e *Entry) adjustment {
	if a.delta <= 0 || e.Limit <= 0 {
		return a
	}
	if !a.carried {
		head, unit, w, start, ok := parseCounterID(e.Counter)
		if !ok || unit != e.Unit {
			return a
		}
		_, end := window(start, w)
		a.unit, a.head, a.window, a.start, a.end = unit, head, w, start, end
	}
	a.limit = e.Limit
	a.idPrefix = a.counter[:strings.LastIndexByte(a.counter, ':')+1]
	return a
}

// settlePlan is what settling r's entries with actual changes, at nowMs:
//
//   - request entries: nothing (an admitted request counts as one, whatever
//     actual.Requests says);
//   - an entry whose window is in force: actual - reserved, either way,
//     on its own counter;
//   - an entry whose window has ended: actual - reserved when positive,
//     on the counter of the same limit key, unit and window length in the
//     window in force when the settlement lands; when negative, on its own
//     (ended) counter if it is still held.
//
// Why the window in force: a response longer than the rest of its window
// used tokens the reservation did not cover, and charging them to the
// ended window would drop them (an ended window admits nothing more; its
// counter may already be gone), so a stream could take any number of
// tokens beyond its reservation for free. Those tokens were produced
// after the window ended, that is, in the window now in force: charging
// them there is where they belong and is what keeps the next admissions
// honest. A shortfall is refunded to the ended window, not the current
// one: crediting the current window would let a tenant exceed its limit,
// while the ended window gates nothing any more and its counter is then
// the record of what the window's requests really used (a ledger checked
// against the pools' own usage balances).
//
// Debt: a charge (either kind) that takes its counter past the entry's
// limit moves the part over it (overLimit) into the counters of the same
// limit in the windows that follow (debtWindow), each filled up to the
// limit (debtPart), created if need be. Left in its own window, it would
// be forgotten when that window ends: a request whose usage was twelve
// times its per-minute budget would cost one minute, not twelve. Every
// backend applies it the same way, with these functions (Redis in
// settleScript).
//
// Entries whose counter id cannot be read (not written by this package)
// are skipped and reported, wrapping ErrInvalid, after the others.
func settlePlan(entries []Entry, actual Cost, nowMs int64, buf []adjustment) ([]adjustment, error) {
	var errs []error
	for i := range entries {
		e := &entries[i]
		if e.Unit == Requests {
			continue
		}
		d := actual.Of(e.Unit) - e.Reserved
		switch {
		case e.ExpiresAt > nowMs:
			if d != 0 {
				buf = append(buf, withDebt(adjustment{counter: e.Counter, delta: d}, e))
			}
		case d > 0:
			a, err := carryOver(e, nowMs)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			a.delta = d
			buf = append(buf, withDebt(a, e))
		case d < 0:
			buf = append(buf, adjustment{counter: e.Counter, delta: d})
		}
	}
	return buf, errors.Join(errs...)
}

// releasePlan is what releasing r's entries at nowMs changes: every
// counter whose window is in force gives back what the entry reserved,
// requests included (the request never reached a pool). Ended windows are
// left alone: they gate nothing any more.
func releasePlan(entries []Entry, nowMs int64, buf []adjustment) []adjustment {
	for i := range entries {
		e := &entries[i]
		if e.ExpiresAt > nowMs && e.Reserved != 0 {
			buf = append(buf, adjustment{counter: e.Counter, delta: -e.Reserved})
		}
	}
	return buf
}

// carryOver returns the adjustment (without its delta) that moves entry e,
// whose window has ended, to the window holding nowMs: the same counter id
// but for its last field, the window's start. Everything up to that field
// is kept, the hash tag in particular, so the new counter lives in the same
// Redis Cluster slot as e's (and as every other counter of its
// reservation, which Reserve required to share one).
func carryOver(e *Entry, nowMs int64) (adjustment, error) {
	head, unit, w, startMs, ok := parseCounterID(e.Counter)
	if ok {
		_, endMs := window(startMs, w)
		ok = unit == e.Unit && endMs == e.ExpiresAt
	}
	if !ok {
		return adjustment{}, fmt.Errorf("%w: reservation entry %q (%s, ends %d) is not a counter of this package", ErrInvalid, e.Counter, e.Unit, e.ExpiresAt)
	}
	start, end := window(nowMs, w)
	id := e.Counter[:strings.LastIndexByte(e.Counter, ':')+1] + strconv.FormatInt(start, 10)
	return adjustment{counter: id, carried: true, unit: unit, head: head, window: w, start: start, end: end}, nil
}

// parseCounterID splits an id writeCounterID wrote into its head (prefix,
// hash tag and key: everything before ":<unit>:<windowMs>:<startMs>"), unit,
// window and window start. It reads from the right, as the last three
// fields hold no ':'.
func parseCounterID(id string) (head string, unit Unit, w time.Duration, startMs int64, ok bool) {
	rest, startS, ok1 := cutLast(id)
	rest, windowS, ok2 := cutLast(rest)
	head, unitS, ok3 := cutLast(rest)
	if !ok1 || !ok2 || !ok3 {
		return "", "", 0, 0, false
	}
	s, err := strconv.ParseInt(startS, 10, 64)
	if err != nil || strconv.FormatInt(s, 10) != startS {
		return "", "", 0, 0, false
	}
	if windowS == monthField {
		return head, Unit(unitS), Month, s, true
	}
	wm, err := strconv.ParseInt(windowS, 10, 64)
	if err != nil || wm <= 0 || wm > math.MaxInt64/int64(time.Millisecond) {
		return "", "", 0, 0, false
	}
	return head, Unit(unitS), time.Duration(wm) * time.Millisecond, s, true
}

// cutLast splits s around its last ':'.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// checkActual rejects an actual cost no counter can be settled with:
// negative (a settlement's total tokens saturate, see Cost.Of).
func checkActual(actual Cost) error {
	if actual.Requests < 0 || actual.InputTokens < 0 || actual.OutputTokens < 0 || actual.Money < 0 {
		return fmt.Errorf("%w: negative actual cost %+v", ErrInvalid, actual)
	}
	return nil
}
