// Package watch reloads configuration files when they change, by polling:
// it works the same for plain files, directories and Kubernetes volume
// mounts (whose atomic ..data symlink swaps inotify handles poorly).
package watch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxDepth bounds the directory walk (symbolic links may loop).
const maxDepth = 32

// Fingerprint summarises path — a file, or every file below a directory
// whose name keep accepts (nil keeps all), skipping names that start with
// a dot and following links — by relative names, sizes and modification
// times. On error it still returns a fingerprint, of the error, so that a
// path that stays broken is reported once.
func Fingerprint(path string, keep func(name string) bool) (string, error) {
	var lines []string
	err := walk(path, "", 0, keep, &lines)
	h := fnv.New64a()
	if err != nil {
		h.Write([]byte("error: " + err.Error()))
		return strconv.FormatUint(h.Sum64(), 16), err
	}
	slices.Sort(lines)
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return strconv.FormatUint(h.Sum64(), 16), nil
}

func walk(path, rel string, depth int, keep func(string) bool, lines *[]string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		if depth == 0 || keep == nil || keep(info.Name()) {
			*lines = append(*lines, fmt.Sprintf("%s\x00%d\x00%d\n", rel, info.Size(), info.ModTime().UnixNano()))
		}
		return nil
	}
	if depth > maxDepth {
		return errors.New("directories nested too deep (a symbolic link loop?): " + path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, ent := range entries {
		if strings.HasPrefix(ent.Name(), ".") {
			continue
		}
		if err := walk(filepath.Join(path, ent.Name()), filepath.Join(rel, ent.Name()), depth+1, keep, lines); err != nil {
			return err
		}
	}
	return nil
}

// Poll checks path every interval until ctx is done and calls reload each
// time its fingerprint differs from last (taken by the caller before it
// loaded, so a change made meanwhile is seen). A fingerprint error or a
// failed reload goes to onError once, and is not retried until the files
// change again; the caller keeps serving what it had.
func Poll(ctx context.Context, path string, keep func(string) bool, last string, interval time.Duration,
	reload func() error, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp, err := Fingerprint(path, keep)
		if fp == last {
			continue
		}
		last = fp
		if err == nil {
			err = reload()
		}
		if err != nil && ctx.Err() == nil {
			onError(err)
		}
	}
}
