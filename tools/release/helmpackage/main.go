// Command helmpackage is `helm package` through Helm's Go library (no helm
// binary needed): it loads the chart (honouring .helmignore), checks that its
// appVersion is the release's (--app-version: the Makefile reads it from
// Chart.yaml, the one place the release version lives) and writes
// NAME-VERSION.tgz into --destination. Unlike helm package, the archive is
// reproducible: entries keep Helm's order, every mtime is SOURCE_DATE_EPOCH.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "helmpackage:", err)
		os.Exit(1)
	}
}

func run() error {
	dest := flag.String("destination", ".", "directory to write the chart archive to")
	appVersion := flag.String("app-version", "", "fail unless the chart's appVersion is this")
	created := flag.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "every mtime in the archive, Unix seconds (default $SOURCE_DATE_EPOCH)")
	flag.Parse()
	if flag.NArg() != 1 {
		return fmt.Errorf("usage: helmpackage [flags] CHART_DIR")
	}
	ch, err := loader.LoadDir(flag.Arg(0))
	if err != nil {
		return err
	}
	if err := ch.Validate(); err != nil {
		return err
	}
	if *appVersion != "" && ch.Metadata.AppVersion != *appVersion {
		return fmt.Errorf("chart appVersion %q, release %q", ch.Metadata.AppVersion, *appVersion)
	}
	tmp, err := os.MkdirTemp("", "helmpackage")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	saved, err := chartutil.Save(ch, tmp)
	if err != nil {
		return err
	}
	mtime := time.Now()
	if *created != "" {
		secs, err := strconv.ParseInt(*created, 10, 64)
		if err != nil {
			return fmt.Errorf("--created %q: %w", *created, err)
		}
		mtime = time.Unix(secs, 0)
	}
	out := filepath.Join(*dest, filepath.Base(saved))
	if err := restamp(saved, out, mtime.UTC()); err != nil {
		return err
	}
	fmt.Println(out)
	return nil
}

// restamp copies a .tgz with every entry's times set to mtime and the gzip
// header's time and name cleared.
func restamp(in, out string, mtime time.Time) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = mtime, time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}
