package cli

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/testutil"
)

// With poolModels.pools, infergate is not ready until every pool has
// answered its first model list (or timed out): a load balancer sends no
// GET /v1/models before there is a list to give. The gate itself never
// waits for one.
func TestNotReadyBeforePoolModels(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	pool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
	}))
	defer pool.Close()
	defer close(release)
	cfg, err := config.Parse(fmt.Appendf(nil, "poolModels:\n  pools: [{name: a, url: %q}]\n  timeout: 20s\n", pool.URL+"/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	svc, ad, _ := serveService(t, cfg, false)
	readyz := func() int {
		resp, err := http.Get("http://" + ad.Addr().String() + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	<-arrived // the first round is under way, held by the pool
	testutil.Eventually(t, 30*time.Second, func() bool { return readyz() != 0 }, "the admin port to answer")
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d while the pool's list is pending, want 503", code)
	}
	release <- struct{}{}
	testutil.Eventually(t, 30*time.Second, func() bool { return readyz() == http.StatusOK }, "ready after the pool answered")
	if got := svc.models.Models(); len(got) != 1 || got[0] != "m" {
		t.Errorf("listed %q, want the pool's [m]", got)
	}
}
