package routing

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/xds/controller"
)

// The controller page renders whole, for any state (a template error would
// cut it off mid-table).
func TestDebugPageRenders(t *testing.T) {
	var b strings.Builder
	states := []controller.ModelState{{Name: "llama", Weights: map[string]uint32{"pool-a": 98, "pool-b": 2},
		Pools:   map[string]controller.PoolStats{"pool-a": {Samples: 40, Breached: true, QueueDepth: 12, KVCacheUsage: 0.9, Why: "queue depth 12 > SLA 8"}},
		History: []controller.Decision{{VirtualModel: "llama", From: map[string]uint32{"pool-a": 100}, To: map[string]uint32{"pool-a": 98, "pool-b": 2}, Reason: "pool-a breached"}}}}
	if err := debugPage.Execute(&b, states); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<td>98</td>", "<td>12</td>", "90.0%", "pool-a breached", "</html>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
