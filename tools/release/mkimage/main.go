// Command mkimage builds infergate's multi-arch container image without a
// container engine (make image, make release; see package image).
//
//	mkimage --ref ghcr.io/infergate/infergate:0.1.0 \
//	  --binary linux/amd64=bin/release/infergate-linux-amd64 \
//	  --binary linux/arm64=bin/release/infergate-linux-arm64 \
//	  --label org.opencontainers.image.version=v0.1.0 ... \
//	  --layout bin/image/oci --docker-archives bin/image
//
// Every timestamp is SOURCE_DATE_EPOCH (--created). It prints the index
// digest and each platform's manifest digest.
//
//	mkimage --rootfs DIR   writes the base files only (the Dockerfile's base)
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/infergate/infergate/tools/release/image"
)

type multi map[string]string

func (m multi) String() string { return fmt.Sprint(map[string]string(m)) }
func (m multi) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want key=value", s)
	}
	m[k] = v
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	binaries, labels := multi{}, multi{}
	ref := flag.String("ref", "", "the image's name and tag, e.g. ghcr.io/infergate/infergate:0.1.0")
	flag.Var(binaries, "binary", "os/arch=path of a static infergate binary (repeat per platform)")
	flag.Var(labels, "label", "key=value of a config label (repeat)")
	created := flag.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp, in Unix seconds (default $SOURCE_DATE_EPOCH)")
	layoutDir := flag.String("layout", "", "write the OCI image layout (the multi-arch index) here, replacing it")
	ociArchive := flag.String("oci-archive", "", "also write the layout as a tar here (skopeo oci-archive:FILE)")
	dockerDir := flag.String("docker-archives", "", "also write a `docker load` tarball per platform here (infergate-image-OS-ARCH.tar)")
	rootfs := flag.String("rootfs", "", "only write the base files under this directory (the Dockerfile's base) and exit")
	flag.Parse()

	if *rootfs != "" {
		files, err := image.BaseFiles()
		if err != nil {
			return err
		}
		return image.WriteTree(*rootfs, files)
	}
	if *ref == "" || len(binaries) == 0 || *layoutDir == "" {
		return fmt.Errorf("--ref, --binary and --layout are required")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return err
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("--created / SOURCE_DATE_EPOCH %q: %w", *created, err)
	}
	o := image.Options{Binaries: binaries, Created: time.Unix(secs, 0).UTC(), Labels: labels}
	idx, imgs, err := image.Build(o)
	if err != nil {
		return err
	}
	if err := image.WriteLayout(*layoutDir, idx, tag); err != nil {
		return err
	}
	if *ociArchive != "" {
		f, err := os.Create(*ociArchive)
		if err != nil {
			return err
		}
		if err := image.TarDir(f, *layoutDir, o.Created); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	var ps []string
	for p := range imgs {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	for _, p := range ps {
		d, err := imgs[p].Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%-12s %s\n", p, d)
		if *dockerDir != "" {
			out := filepath.Join(*dockerDir, "infergate-image-"+strings.ReplaceAll(p, "/", "-")+".tar")
			if err := image.WriteDockerArchive(out, tag, imgs[p]); err != nil {
				return err
			}
		}
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%-12s %s  %s  (OCI layout %s)\n", "index", d, tag.Name(), *layoutDir)
	return nil
}
