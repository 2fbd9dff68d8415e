// Package watch reloads configuration files when they change, by polling:
// it works the same for plain files, directories and Kubernetes volume
// mounts (whose atomic ..data symlink swaps inotify handles poorly).
package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Fingerprint summarises path (a file, or a directory's regular files,
// following symlinks) by names, sizes and modification times.
func Fingerprint(path string) (string, error) {
	h := sha256.New()
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return "", err
		}
		files = files[:0]
		for _, e := range entries {
			files = append(files, filepath.Join(path, e.Name()))
		}
		sort.Strings(files)
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil || fi.IsDir() {
			continue
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\n", filepath.Base(f), fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Poll calls reload each time path's fingerprint changes, checking every
// interval until ctx is done. A failed reload is reported to onError and
// retried at the next change; the caller keeps serving what it had.
func Poll(ctx context.Context, path string, interval time.Duration, reload func() error, onError func(error)) {
	last, _ := Fingerprint(path)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp, err := Fingerprint(path)
		if err != nil {
			onError(err)
			continue
		}
		if fp == last {
			continue
		}
		last = fp
		if err := reload(); err != nil {
			onError(err)
		}
	}
}
