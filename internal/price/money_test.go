package price

import (
	"math"
	"testing"
)

// Money reads as a person writes it: the symbol, the currency's minor
// unit, and a small amount still visible.
func TestMoney(t *testing.T) {
	for _, c := range []struct {
		pico     int64
		currency string
		want     string
	}{
		{250_000_000, "USD", "$0.00025"}, // the budget left
		{10_000_000_000, "USD", "$0.01"}, // ... of
		{0, "USD", "$0.00"},
		{0, "JPY", "¥0"},
		{1_234_500_000_000_000, "USD", "$1,234.50"},
		{1_234_505_000_000_000, "EUR", "€1,234.51"}, // half up
		{994_999_999_999, "GBP", "£0.99"},           // two significant digits below a unit
		{999_995_000_000, "GBP", "£1.00"},           // rounds up to a unit
		{123_000_000_000, "USD", "$0.12"},
		{120_400_000_000_000, "JPY", "¥120"},
		{500_000_000_000, "JPY", "¥0.5"},
		{1, "USD", "$0.000000000001"},
		{251_234_567, "USD", "$0.00025"},
		{12_500_000_000_000, "CHF", "12.50 CHF"},
		{-1_500_000_000_000, "USD", "-$1.50"},
		{-1_500_000_000_000, "SEK", "-1.50 SEK"},
		{1_000_000_000_000_000_000, "USD", "$1,000,000.00"},
		{math.MaxInt64, "USD", "$9,223,372.04"},
		{math.MinInt64, "USD", "-$9,223,372.04"},
	} {
		if got := Money(c.pico, c.currency); got != c.want {
			t.Errorf("Money(%d, %s) = %q, want %q", c.pico, c.currency, got, c.want)
		}
	}
}
