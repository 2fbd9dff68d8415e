// Package browser runs headless Chromium for tests of pages a person looks
// at: it finds the binary the way scripts/install-test-deps.sh reports it,
// collects every console message and exception, and fails (never skips)
// when no browser is installed. It lives with the lab (the bench module) so
// that chromedp stays out of infergate's go.mod; the bench report's and the
// debug pages' tests (test/browser) use it.
package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Binary finds Chromium: $CHROME_BIN, else chromium on PATH.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CHROME_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("CHROME_BIN=%s: %v", p, err)
		}
		return p
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found on PATH and CHROME_BIN is not set; install it with " +
			"`eval \"$(scripts/install-test-deps.sh)\"` (Debian: apt-get install chromium)")
	}
	return p
}

// Browser is one headless Chromium tab.
type Browser struct {
	Ctx    context.Context // for chromedp actions
	logged chan []chromedp.ConsoleMessage
}

const doneMarker = "browser-test: done"

// Start opens a tab with a width×height viewport; it closes with the test.
// The whole session has one deadline, so a hung browser fails the test.
func Start(t testing.TB, width, height int) *Browser {
	t.Helper()
	bin := Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // tests run as root, in containers
		chromedp.WindowSize(width, height),
	)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() { bcancel(); acancel(); cancel() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	b := &Browser{Ctx: bctx, logged: make(chan []chromedp.ConsoleMessage, 1)}
	// Subscribe before any navigation so that nothing is missed.
	messages := chromedp.Console(bctx)
	go func() {
		var got []chromedp.ConsoleMessage
		defer func() { b.logged <- got }()
		for m, err := range messages {
			if err != nil || m.Text == doneMarker {
				return
			}
			got = append(got, m)
		}
	}()
	return b
}

// Console returns every console message and exception so far and ends
// the collection; call it once, after the last action.
func (b *Browser) Console(t testing.TB) []chromedp.ConsoleMessage {
	t.Helper()
	if err := chromedp.Do(b.Ctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf("console.info(%q)", doneMarker))); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-b.logged:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("the console marker never arrived")
		return nil
	}
}
