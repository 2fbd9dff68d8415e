package spend

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/internal/ratelimit"
)

// A Pick is a window a person asks for by name (?range=): the page's
// quick links.
type Pick struct {
	Name, Label string
}

// Picks are the named windows, in the page's order.
var Picks = []Pick{{"today", "today"}, {"7d", "last 7 days"}, {"this-month", "this month"}, {"last-month", "last month"}}

// Window is what a page's query asked for: the window [Since, Until) and
// how it was asked, so that the page's links keep it.
type Window struct {
	Since, Until time.Time
	// Values are the query's window parameters as given (range; from and
	// to; or since), without by or format.
	Values url.Values
}

// ParseWindow reads a report's window from a query, as of now (UTC):
//
//   - range: a Pick's name (today, 7d, this-month, last-month);
//   - from, to: RFC 3339 times or dates (2026-11-01); a date as to means
//     through that day; to defaults to now;
//   - since: a duration back from now (ParseSince);
//
// at most one of them; none: the last 24 hours. A window ends at now at
// the latest and starts at most Retention ago (the ledger keeps no more).
func ParseWindow(v url.Values, now time.Time) (Window, error) {
	now = now.UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	given := 0
	for _, p := range []string{"range", "since"} {
		if v.Get(p) != "" {
			given++
		}
	}
	if v.Get("from") != "" || v.Get("to") != "" {
		given++
	}
	if given > 1 {
		return Window{}, &QueryError{"give one of range, from/to and since"}
	}
	w := Window{Until: now, Values: url.Values{}}
	switch {
	case v.Get("range") != "":
		r := v.Get("range")
		w.Values.Set("range", r)
		switch r {
		case "today":
			w.Since = day
		case "7d":
			w.Since = day.AddDate(0, 0, -6)
		case "this-month":
			w.Since = month
		case "last-month":
			w.Since, w.Until = month.AddDate(0, -1, 0), month
		default:
			return Window{}, &QueryError{"range: " + strconv.Quote(r) + " is not one of today, 7d, this-month, last-month"}
		}
	case v.Get("from") != "" || v.Get("to") != "":
		from, err := parseTime("from", v.Get("from"), false)
		if err != nil {
			return Window{}, err
		}
		if v.Get("to") != "" {
			if w.Until, err = parseTime("to", v.Get("to"), true); err != nil {
				return Window{}, err
			}
		}
		w.Since = from
		w.Values.Set("from", v.Get("from"))
		if v.Get("to") != "" {
			w.Values.Set("to", v.Get("to"))
		}
	default:
		since := 24 * time.Hour
		if s := v.Get("since"); s != "" {
			var err error
			if since, err = ParseSince(s); err != nil {
				return Window{}, err
			}
			w.Values.Set("since", s)
		}
		w.Since = now.Add(-since)
	}
	w.Until = minTime(w.Until, now)
	earliest := HourTime(Hour(now.Add(-Retention)) + 1)
	switch {
	case !w.Since.Before(w.Until):
		return Window{}, &QueryError{"from must be before to, and before now"}
	case w.Since.Before(earliest):
		return Window{}, &QueryError{"from: the ledger keeps " + strconv.Itoa(int(Retention/(24*time.Hour))) +
			" days: " + earliest.Format(time.RFC3339) + " at the earliest"}
	}
	return w, nil
}

// CheckWindow checks what of a window query does not depend on the
// clock (one of range, from/to, since; each well formed), so that a
// command can refuse a typo before it asks a replica, whose clock decides
// the rest.
func CheckWindow(v url.Values) error {
	latest := time.Time{}
	for _, p := range []string{"from", "to"} {
		if s := v.Get(p); s != "" {
			t, err := parseTime(p, s, true)
			if err != nil {
				return err
			}
			if t.After(latest) {
				latest = t
			}
		}
	}
	if from, err := parseTime("from", v.Get("from"), false); err == nil && v.Get("to") == "" {
		latest = from.Add(time.Hour) // to defaults to now: any now after from
	}
	if latest.IsZero() {
		latest = time.Now()
	}
	_, err := ParseWindow(v, latest)
	if qe, ok := err.(*QueryError); ok && strings.HasPrefix(qe.msg, "from: the ledger keeps") {
		return nil // the replica's clock decides what it still keeps
	}
	return err
}

// parseTime reads an RFC 3339 time or a date (UTC); a date that ends a
// window (end) means the next midnight: through that day.
func parseTime(name, s string, end bool) (time.Time, error) {
	if s == "" {
		return time.Time{}, &QueryError{name + ": required with " + map[bool]string{true: "from", false: "to"}[name == "from"]}
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, &QueryError{name + ": " + strconv.Quote(s) + " is neither a date (2026-11-01) nor an RFC 3339 time (2026-11-01T09:00:00Z)"}
	}
	if end {
		t = t.AddDate(0, 0, 1)
	}
	return t, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Per is a budget's window as a person says it: "per day", "per 5
// minutes", "per month" (ratelimit.Month).
func Per(w time.Duration) string {
	type unit struct {
		d    time.Duration
		name string
	}
	if w == ratelimit.Month {
		return "per month"
	}
	for _, u := range []unit{{7 * 24 * time.Hour, "week"}, {24 * time.Hour, "day"}, {time.Hour, "hour"},
		{time.Minute, "minute"}, {time.Second, "second"}} {
		if w >= u.d && w%u.d == 0 {
			if n := w / u.d; n > 1 {
				return "per " + strconv.FormatInt(int64(n), 10) + " " + u.name + "s"
			}
			return "per " + u.name
		}
	}
	return "per " + w.String()
}
