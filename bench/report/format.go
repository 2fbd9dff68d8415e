package report

import (
	"math"
	"strconv"
	"strings"
)

// Number formatting for tables and labels. Every function prints "–" for a
// non-finite value, so NaN and Inf never reach the page.

const dash = "–"

// num formats v with about three significant digits and thousands
// separators, which is as much precision as an HDR histogram with three
// significant digits has.
func num(v float64) string {
	if !finite(v) {
		return dash
	}
	av := math.Abs(v)
	var s string
	switch {
	case av == 0:
		return "0"
	case av >= 100:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case av >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	case av >= 1:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 3, 64)
	}
	return group(s)
}

// plain formats a configured value (a rate, a load level, an SLO): those
// are round numbers as the user typed them, 64 rather than 64.0.
func plain(v float64) string {
	if !finite(v) {
		return dash
	}
	return group(trimFloat(v, 3))
}

// signed is num with an explicit sign, for differences.
func signed(v float64) string {
	s := num(v)
	if finite(v) && v > 0 {
		return "+" + s
	}
	return strings.Replace(s, "-", "−", 1)
}

// integer formats n with thousands separators.
func integer[T ~int | ~int64](n T) string {
	return group(strconv.FormatInt(int64(n), 10))
}

// pct formats a fraction as a percentage.
func pct(f float64) string {
	if !finite(f) {
		return dash
	}
	return trimFloat(f*100, 1) + "%"
}

// seconds formats a duration given in seconds.
func seconds(s float64) string {
	switch {
	case !finite(s):
		return dash
	case s >= 3600:
		return strconv.Itoa(int(s/3600)) + " h " + strconv.Itoa(int(math.Mod(s, 3600)/60)) + " min"
	case s >= 120:
		return strconv.Itoa(int(s/60)) + " min " + strconv.Itoa(int(math.Mod(s, 60))) + " s"
	}
	return trimFloat(s, 1) + " s"
}

// group inserts thousands separators into the integer part of a formatted
// number.
func group(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "−", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	if len(intPart) > 3 {
		var b strings.Builder
		for i, r := range intPart {
			if i > 0 && (len(intPart)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(r)
		}
		intPart = b.String()
	}
	if hasFrac {
		return sign + intPart + "." + frac
	}
	return sign + intPart
}

// signedFixed formats v with dec decimals and an explicit sign.
func signedFixed(v float64, dec int) string {
	if !finite(v) {
		return dash
	}
	s := strconv.FormatFloat(v, 'f', dec, 64)
	switch {
	case strings.HasPrefix(s, "-"):
		return "−" + s[1:]
	case v > 0:
		return "+" + s
	}
	return s
}
