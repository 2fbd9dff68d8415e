package watch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Poll runs in virtual time (testing/synctest): the files are real, the
// ticker is the bubble's, so each check happens at an exact instant.
// A change is reloaded at the first tick after it, once; a reload that
// fails is reported once and not retried until the files change again; a
// path that breaks is reported once.
func TestPollReloadsOnChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := filepath.Join(dir, "keys.yaml")
		write := func(s string) {
			if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("a")
		start := time.Now()
		var mu sync.Mutex
		var reloads, errs []time.Duration
		fail := false
		reload := func() error {
			mu.Lock()
			defer mu.Unlock()
			reloads = append(reloads, time.Since(start))
			if fail {
				return errors.New("bad file")
			}
			return nil
		}
		onError := func(error) { mu.Lock(); errs = append(errs, time.Since(start)); mu.Unlock() }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		last, _ := Fingerprint(dir, nil)
		go func() { defer close(done); Poll(ctx, dir, nil, last, time.Second, reload, onError) }()

		at := func(d time.Duration, do func()) {
			time.Sleep(time.Until(start.Add(d)))
			synctest.Wait()
			do()
		}
		failing := func(on bool) { mu.Lock(); fail = on; mu.Unlock() }
		at(3500*time.Millisecond, func() { write("ab") })                   // reloaded at 4s
		at(6500*time.Millisecond, func() { failing(true); write("abc") })   // refused at 7s
		at(9500*time.Millisecond, func() { failing(false); write("abcd") }) // reloaded at 10s
		at(12500*time.Millisecond, func() { os.Remove(f); os.Remove(dir) }) // reported at 13s, once
		at(20*time.Second, cancel)
		<-done

		mu.Lock()
		defer mu.Unlock()
		s := time.Second
		if !slices.Equal(reloads, []time.Duration{4 * s, 7 * s, 10 * s}) {
			t.Errorf("reloads at %v, want 4s 7s 10s", reloads)
		}
		if !slices.Equal(errs, []time.Duration{7 * s, 13 * s}) {
			t.Errorf("errors reported at %v, want 7s (refused) and 13s (directory gone)", errs)
		}
	})
}
