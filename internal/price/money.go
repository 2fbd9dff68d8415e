package price

import (
	"strconv"
	"strings"
)

// currencies are the symbols and minor units of the currencies a person
// most often reads; any other ISO 4217 code is written after the amount,
// with two decimals.
var currencies = map[string]struct {
	symbol string
	minor  int // decimals of the currency's smallest coin
}{
	"USD": {"$", 2}, "EUR": {"€", 2}, "GBP": {"£", 2}, "JPY": {"¥", 0}, "CNY": {"CN¥", 2},
	"INR": {"₹", 2}, "KRW": {"₩", 0}, "CAD": {"CA$", 2}, "AUD": {"A$", 2},
}

// Money writes an amount of pico-units of currency for a person: its
// symbol, thousands separated, rounded (half up) to the currency's minor
// unit ("$1,234.50", "¥120"), or, below one unit, to two significant
// digits so that a small amount stays visible ("$0.00025", not "$0.00").
// An unknown code follows the amount ("12.50 CHF"). FormatCost is the
// exact decimal, for machines.
func Money(pico int64, currency string) string {
	c, known := currencies[currency]
	if !known {
		c.minor = 2
	}
	neg := pico < 0
	u := uint64(pico)
	if neg {
		u = -u // MinInt64 too: uint64 holds its magnitude
	}
	places := c.minor
	if u > 0 && u < 1e12 {
		// The first significant digit's place after the point, plus one.
		first := 12 - len(strconv.FormatUint(u, 10)) + 1
		places = max(places, first+1)
	}
	s := fixed(u, places)
	if whole, frac, ok := strings.Cut(s, "."); ok {
		frac = strings.TrimRight(frac, "0")
		if len(frac) < c.minor {
			frac += strings.Repeat("0", c.minor-len(frac))
		}
		s = thousands(whole)
		if frac != "" {
			s += "." + frac
		}
	} else {
		s = thousands(s)
	}
	switch {
	case !known && neg:
		return "-" + s + " " + currency
	case !known:
		return s + " " + currency
	case neg:
		return "-" + c.symbol + s
	}
	return c.symbol + s
}

// fixed writes u pico-units rounded half up to places decimals (at most
// 12), with exactly that many.
func fixed(u uint64, places int) string {
	places = min(places, 12)
	unit := uint64(1)
	for range 12 - places {
		unit *= 10
	}
	q := u / unit
	if u%unit >= (unit+1)/2 && unit > 1 {
		q++
	}
	s := strconv.FormatUint(q, 10)
	if places == 0 {
		return s
	}
	if len(s) <= places {
		s = strings.Repeat("0", places-len(s)+1) + s
	}
	return s[:len(s)-places] + "." + s[len(s)-places:]
}

// thousands puts a comma between each group of three digits.
func thousands(digits string) string {
	if len(digits) <= 3 {
		return digits
	}
	var b strings.Builder
	lead := len(digits) % 3
	if lead > 0 {
		b.WriteString(digits[:lead])
	}
	for i := lead; i < len(digits); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(digits[i : i+3])
	}
	return b.String()
}

// Symbol is currency's symbol, or its code when it has none here.
func Symbol(currency string) string {
	if c, ok := currencies[currency]; ok {
		return c.symbol
	}
	return currency
}
