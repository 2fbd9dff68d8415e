package meter

import (
	"slices"
	"strings"
	"testing"
)

// aggregateMetadata stands for an older config's cluster metadata, which
// the adapter reads (legacy; extproc tests the real text).
const aggregateMetadata = "legacy: pool-a pool-b"

func legacy(text string) []string {
	if rest, ok := strings.CutPrefix(text, "legacy:"); ok {
		return strings.Fields(rest)
	}
	return nil
}

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
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 1, []string{"pool-a"}},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 2, []string{"pool-a", "pool-b"}},
		{"infergate-fallback/llama/pool-a", aggregateMetadata, 3, []string{"pool-a", "pool-b", "pool-a"}},
		{"other", "legacy:", 1, []string{"other"}},
		{"broken", `filter_metadata {{{`, 1, []string{"broken"}},
		// The one field (request.PoolOrderAttribute): a JSON array.
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 2, []string{"pool-b", "pool-a"}},
		{"infergate-fallback/llama/pool-b", `["pool-b","pool-a"]`, 3, []string{"pool-b", "pool-a", "pool-b"}},
		{"x", `["",1,{"a":2}]`, 1, []string{"x"}},
		{"x", `[broken`, 1, []string{"x"}},
		{"x", `["pool-a"` + strings.Repeat(`,"p"`, maxPoolOrderText/4) + `]`, 1, []string{"x"}}, // too long to read
	} {
		if got := (&PoolOrders{Legacy: legacy}).ServingPools(tc.cluster, tc.md, tc.attempts); !slices.Equal(got, tc.want) {
			t.Errorf("ServingPools(%q, %.20q, %d) = %v, want %v", tc.cluster, tc.md, tc.attempts, got, tc.want)
		}
	}
}

func FuzzServingPools(f *testing.F) {
	f.Add("pool-a", aggregateMetadata, 2)
	f.Add("x", "NULL", 0)
	f.Add("y", `["a","b"]`, 5)
	f.Fuzz(func(t *testing.T, cluster, md string, attempts int) {
		attempts %= 16
		got := (&PoolOrders{Legacy: legacy}).ServingPools(cluster, md, attempts)
		if cluster != "" && len(got) != max(attempts, 1) {
			t.Fatalf("%d pools for %d attempts", len(got), attempts)
		}
	})
}
