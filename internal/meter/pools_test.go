package meter

import (
	"slices"
	"strings"
	"testing"
)

func TestServingPools(t *testing.T) {
	for _, tc := range []struct {
		cluster, md string
		attempts    int
		want        []string
	}{
		{"pool-a", "NULL", 1, []string{"pool-a"}},
		{"pool-a", "", 0, []string{"pool-a"}},
		{"pool-a", "", 2, []string{"pool-a", "pool-a"}},
		{"", "", 1, nil},
		// The text an older config sent (the whole cluster metadata) is
		// no order: the cluster alone.
		{"broken", `filter_metadata {{{`, 1, []string{"broken"}},
		// The one field (request.PoolOrderAttribute): a JSON array.
		{"infergate-fallback/llama/pool-a", `["pool-a","pool-b"]`, 1, []string{"pool-a"}},
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 2, []string{"pool-b", "pool-a"}},
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 3, []string{"pool-b", "pool-a", "pool-b"}},
		{"x", `["",1,{"a":2}]`, 1, []string{"x"}},
		{"x", `[broken`, 1, []string{"x"}},
		{"x", `["pool-a"` + strings.Repeat(`,"p"`, maxPoolOrderText/4) + `]`, 1, []string{"x"}}, // too long to read
	} {
		if got := (&PoolOrders{}).ServingPools(tc.cluster, tc.md, tc.attempts); !slices.Equal(got, tc.want) {
			t.Errorf("ServingPools(%q, %.20q, %d) = %v, want %v", tc.cluster, tc.md, tc.attempts, got, tc.want)
		}
	}
}

func FuzzServingPools(f *testing.F) {
	f.Add("pool-a", `["pool-a","pool-b"]`, 2)
	f.Add("x", "NULL", 0)
	f.Add("y", `["a","b"]`, 5)
	f.Fuzz(func(t *testing.T, cluster, md string, attempts int) {
		attempts %= 16
		got := (&PoolOrders{}).ServingPools(cluster, md, attempts)
		if cluster != "" && len(got) != max(attempts, 1) {
			t.Fatalf("%d pools for %d attempts", len(got), attempts)
		}
	})
}
