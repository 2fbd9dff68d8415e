// The tests of the gateway's pages a person looks at, in a real browser
// (bench/browser runs it; the bench report's test is in bench/report): a
// module away from the product, so that chromedp stays out of its go.mod.
package browser_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/infergate/infergate/bench/browser"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/requestlog"
)

// The pages work for a person in a real browser: the list renders, its
// filters narrow it, a request opens as a waterfall whose bars are drawn,
// and nothing reaches the console. UPDATE_SCREENSHOT=1 also writes the
// waterfall's screenshot to docs/debug-requests.png.
func TestPagesInChromium(t *testing.T) {
	ring := requestlog.NewRing(100)
	for i := range 12 {
		s := stamp(i)
		s.CompletionTokens, s.PromptTokens, s.Principal = 32, 180, "key-7f3a"
		s.Gaps = nil
		for k := range 31 {
			s.Gaps = append(s.Gaps, time.Duration(18+k%5)*time.Millisecond+time.Duration(k%3)*700*time.Microsecond)
		}
		s.Gaps[17] = 64 * time.Millisecond // a stall
		s.ITLP50, s.ITLP95, s.ITLMax = 20*time.Millisecond, 23*time.Millisecond, 64*time.Millisecond
		s.Attempts, s.PoolsTried = 1, []string{s.Pool}
		ring.Record(context.Background(), s)
	}
	srv := httptest.NewServer(requestlog.Handler(ring, "http://jaeger.example/trace/{trace_id}"))
	defer srv.Close()
	b := browser.Start(t, 1200, 800)
	ctx := b.Ctx

	rows := func() []string {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
			`Array.from(document.querySelectorAll("#requests tbody tr td:nth-child(6)")).map(td => td.textContent)`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/debug/requests")); err != nil {
		t.Fatal(err)
	}
	if got := rows(); len(got) != 12 {
		t.Fatalf("list shows %d requests, want 12", len(got))
	}

	// Filter on 5xx with the form, as a person would.
	if err := chromedp.Do(ctx, chromedp.SetValue(`input[name=status]`, "5xx"), chromedp.Click(`button[type=submit]`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `location.search.includes("status=5xx") && document.readyState === "complete"`)
	got := rows()
	if len(got) != 4 || strings.Join(got, ",") != "503,503,503,503" {
		t.Errorf("filtered statuses %v, want four 503s", got)
	}

	// Open a request: its waterfall has every phase, each bar drawn.
	if err := chromedp.Do(ctx, chromedp.Click(`#requests tbody tr a`)); err != nil {
		t.Fatal(err)
	}
	// The whole page, not just its first bytes: CI once read a row whose
	// bar had not been parsed yet.
	waitJS(t, ctx, `document.readyState === "complete" && document.getElementById("waterfall") !== null`)
	type bar struct {
		Phase string  `json:"phase"`
		Width float64 `json:"width"`
	}
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[[]bar](`Array.from(document.querySelectorAll("#waterfall .row")).map(r =>
		({phase: r.dataset.phase, width: r.querySelector(".bar").getBoundingClientRect().width}))`))
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	for _, br := range bars {
		phases = append(phases, br.Phase)
		if br.Width <= 0 {
			t.Errorf("phase %q has no visible bar", br.Phase)
		}
	}
	for _, want := range []string{"gateway", "auth", "policy", "moderation", "model", "first token (queue + prefill)", "stream (decode)"} {
		if !strings.Contains(strings.Join(phases, "|"), want) {
			t.Errorf("waterfall lacks %q: %v", want, phases)
		}
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#itl div").length`)); err != nil || n == 0 {
		t.Errorf("no ITL histogram bars (%v)", err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range b.Console(t) {
		t.Errorf("console: %s", m)
	}
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		if err := os.WriteFile("../../docs/debug-requests.png", shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// waitJS polls a JavaScript condition (navigation has no single event to
// wait on here).
func waitJS(t *testing.T, ctx context.Context, cond string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond)); err == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", cond)
}

// stamp is request i of a run: every third one a 503 from pool-b.
func stamp(i int) *request.Stamp {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)
	s := &request.Stamp{
		RequestID: fmt.Sprintf("req-%d", i), TraceID: fmt.Sprintf("%032x", i+1), Model: "llama", Pool: "pool-a",
		Tenant: "acme", Status: 200, Decision: "allow", Stream: true, Complete: true,
		Start: start, Sent: start.Add(3 * time.Millisecond),
		Gateway: request.GatewayTime{Total: 2 * time.Millisecond, Gate: time.Millisecond,
			Timings: request.Timings{Auth: 100 * time.Microsecond, Policy: 300 * time.Microsecond, Checks: time.Millisecond}},
		TTFT: 50 * time.Millisecond, E2E: 250 * time.Millisecond,
		Gaps: []time.Duration{20 * time.Millisecond, 21 * time.Millisecond, 19 * time.Millisecond, 40 * time.Millisecond},
	}
	s.Total = s.Gateway.Total + s.Gateway.Checks + s.E2E
	if i%3 == 0 {
		s.Status, s.Pool = 503, "pool-b"
	}
	return s
}
