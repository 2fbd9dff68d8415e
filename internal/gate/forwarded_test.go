package gate

import (
	"slices"
	"testing"
)

func TestUnforwardedHeaders(t *testing.T) {
	got := UnforwardedHeaders([]string{"user-agent", "X-Request-Id", "x-team", "X-Team", "x-infergate-tier", "x_infergate_x", "x-tier"})
	if !slices.Equal(got, []string{"x-team", "x-tier"}) {
		t.Errorf("%v", got)
	}
}
