package policy

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher polls when given no interval.
const DefaultInterval = time.Second

// Watcher serves decisions from the latest good version of a policy
// directory, polling it for changes. A version that fails to parse,
// compile or pass its own tests is reported (Health, Reloads, the log) and
// the previous one keeps serving.
type Watcher struct {
	dir      string
	interval time.Duration
	log      *slog.Logger

	engine   atomic.Pointer[Engine]
	lastErr  atomic.Pointer[error] // nil after a good reload
	ok, fail atomic.Int64

	fingerprint uint64 // of the files last loaded (or tried); poll goroutine only
	done        chan struct{}
}

// Watch loads dir (an error if that fails) and reloads it, until ctx is
// done, whenever the names, sizes or modification times of its policy and
// data files change. The directory is checked every interval (default 1s).
func Watch(ctx context.Context, dir string, interval time.Duration, log *slog.Logger) (*Watcher, error) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{dir: dir, interval: interval, log: log, done: make(chan struct{})}
	fp, err := fingerprint(dir)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", dir, err)
	}
	e, err := Load(ctx, dir)
	if err != nil {
		return nil, err
	}
	w.fingerprint = fp
	w.engine.Store(e)
	log.Info("policy loaded", "dir", dir, "modules", e.modules, "tests", e.tests)
	go w.run(ctx)
	return w, nil
}

// Decide evaluates the current policy; see Engine.Decide.
func (w *Watcher) Decide(ctx context.Context, in *Input) (Decision, error) {
	return w.engine.Load().Decide(ctx, in)
}

// Engine returns the policy version currently serving.
func (w *Watcher) Engine() *Engine { return w.engine.Load() }

// Health is nil, or the error of the last reload when it failed (the
// previous policy is still serving): for /readyz.
func (w *Watcher) Health() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Reloads counts the reloads after the initial load that succeeded and
// that failed.
func (w *Watcher) Reloads() (ok, failed int64) { return w.ok.Load(), w.fail.Load() }

// Done is closed when the watcher has stopped polling (ctx is done).
func (w *Watcher) Done() <-chan struct{} { return w.done }

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.poll(ctx)
		}
	}
}

// poll reloads when the fingerprint changed. The fingerprint is taken
// before loading, so a change made while loading is seen next time. An
// unchanged fingerprint is not retried: a broken version stays reported
// until the files change again.
func (w *Watcher) poll(ctx context.Context) {
	fp, err := fingerprint(w.dir)
	if fp == w.fingerprint {
		return
	}
	w.fingerprint = fp
	start := time.Now()
	var e *Engine
	if err == nil {
		e, err = Load(ctx, w.dir)
	} else {
		err = fmt.Errorf("policy %s: %w", w.dir, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down, not a broken policy
		}
		w.fail.Add(1)
		w.lastErr.Store(&err)
		w.log.Error("policy reload failed; the previous policy keeps serving", "dir", w.dir, "err", err)
		return
	}
	w.engine.Store(e)
	w.lastErr.Store(nil)
	w.ok.Add(1)
	w.log.Info("policy reloaded", "dir", w.dir, "modules", e.modules, "tests", e.tests,
		"took", time.Since(start).Round(time.Millisecond))
}

// maxWalkDepth bounds the directory walk (symbolic links may loop).
const maxWalkDepth = 32

// fingerprint hashes the relative path, size and modification time of
// every file Load would read. Links are followed, as Load follows them. On
// error it still returns a hash, of the error, so that a directory that
// stays broken is reported once.
func fingerprint(dir string) (uint64, error) {
	var lines []string
	err := walk(dir, "", 0, &lines)
	h := fnv.New64a()
	if err != nil {
		h.Write([]byte("error: " + err.Error()))
		return h.Sum64(), err
	}
	slices.Sort(lines)
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return h.Sum64(), nil
}

func walk(path, rel string, depth int, lines *[]string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		if depth == 0 || isPolicyFile(info.Name()) {
			*lines = append(*lines, fmt.Sprintf("%s\x00%d\x00%d\n", rel, info.Size(), info.ModTime().UnixNano()))
		}
		return nil
	}
	if depth > maxWalkDepth {
		return errors.New("directories nested too deep (a symbolic link loop?): " + path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, ent := range entries {
		name := ent.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if err := walk(filepath.Join(path, name), filepath.Join(rel, name), depth+1, lines); err != nil {
			return err
		}
	}
	return nil
}
