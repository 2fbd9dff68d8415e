// Package image builds infergate's container image without a container
// engine, with go-containerregistry as a library: a multi-arch OCI index
// (linux/amd64, linux/arm64) over two layers per platform, a minimal base
// (CA bundle, /etc/passwd and /etc/group for the non-root user, /tmp,
// /home/nonroot) and the static binary at /usr/local/bin/infergate.
//
// The output is reproducible: every tar entry is sorted and has a fixed
// mtime (the commit time, SOURCE_DATE_EPOCH), uid, gid and mode, the config's
// timestamps are that same time, and the binaries are built with -trimpath,
// -buildvcs=false and an empty build ID (Makefile), so the same commit gives
// the same index digest on any machine.
//
// The Dockerfile at the top of the repository builds the equivalent image for
// users with Docker or Podman: its base files come from [BaseFiles] through
// WriteTree (mkimage --rootfs), so both carry the same files.
package image

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image's fixed facts; the Dockerfile and the chart (securityContext
// runAsUser) say the same.
const (
	UID        = 65532
	User       = "65532:65532"
	Home       = "/home/nonroot"
	BinaryPath = "/usr/local/bin/infergate"
	CABundle   = "/etc/ssl/certs/ca-certificates.crt"
	Path       = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	// AnnotationRefName is the OCI layout's tag annotation (skopeo's oci:DIR:TAG);
	// AnnotationImageName the full reference (containerd, nerdctl, ctr import).
	AnnotationRefName   = "org.opencontainers.image.ref.name"
	AnnotationImageName = "io.containerd.image.name"
)

// Entrypoint and Cmd of the image: `infergate serve` by default, any other
// subcommand as the container's args.
var (
	Entrypoint = []string{"infergate"}
	Cmd        = []string{"serve"}
	// Ports the chart's defaults use: ext_proc, admin, xDS.
	Ports = []string{"50051/tcp", "9090/tcp", "18000/tcp"}
)

// File is one entry of a layer.
type File struct {
	Name string // relative, slash-separated; a directory ends in "/"
	Mode int64
	UID  int
	Data []byte
}

// CABundlePEM is Mozilla's NSS root store as pinned by the
// golang.org/x/crypto/x509roots/fallback module version in go.mod (go.sum
// checks its hash), PEM-encoded in the store's order. Roots that NSS
// constrains (distrust-after dates) are left out: a PEM bundle cannot carry
// the constraint.
func CABundlePEM() ([]byte, int, error) {
	var b bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, 0, fmt.Errorf("CA bundle: %w", err)
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, 0, err
		}
		n++
	}
	if n < 50 {
		return nil, 0, fmt.Errorf("CA bundle: only %d roots", n)
	}
	return b.Bytes(), n, nil
}

// BaseFiles is the minimal base: what distroless/static:nonroot carries that
// infergate uses.
func BaseFiles() ([]File, error) {
	ca, _, err := CABundlePEM()
	if err != nil {
		return nil, err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, UID, Home)
	group := "root:x:0:\n" + fmt.Sprintf("nonroot:x:%d:\n", UID)
	return []File{
		{Name: "etc/", Mode: 0o755},
		{Name: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Name: "etc/ssl/", Mode: 0o755},
		{Name: "etc/ssl/certs/", Mode: 0o755},
		{Name: strings.TrimPrefix(CABundle, "/"), Mode: 0o644, Data: ca},
		{Name: "home/", Mode: 0o755},
		{Name: strings.TrimPrefix(Home, "/") + "/", Mode: 0o700, UID: UID},
		{Name: "root/", Mode: 0o700},
		{Name: "tmp/", Mode: 0o1777},
		// The embedded ledger's default place (ratelimit.embedded.path),
		// the nonroot user's: the chart mounts its volume there.
		{Name: "var/", Mode: 0o755},
		{Name: "var/lib/", Mode: 0o755},
		{Name: "var/lib/infergate/", Mode: 0o700, UID: UID},
	}, nil
}

// AppFiles is the binary's layer.
func AppFiles(binary []byte) []File {
	return []File{
		{Name: "usr/", Mode: 0o755},
		{Name: "usr/local/", Mode: 0o755},
		{Name: "usr/local/bin/", Mode: 0o755},
		{Name: strings.TrimPrefix(BinaryPath, "/"), Mode: 0o755, Data: binary},
	}
}

// Tar writes files as a tar stream: sorted by name, every header's mtime,
// uid, gid and mode fixed, no user or group names.
func Tar(w io.Writer, files []File, mtime time.Time) error {
	files = append([]File(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.Name,
			Mode:    f.Mode,
			Uid:     f.UID,
			Gid:     f.UID,
			ModTime: mtime.UTC().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		if strings.HasSuffix(f.Name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Layer is files as a gzip-compressed OCI layer.
func Layer(files []File, mtime time.Time) (v1.Layer, error) {
	var b bytes.Buffer
	if err := Tar(&b, files, mtime); err != nil {
		return nil, err
	}
	data := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// Options say what to build.
type Options struct {
	// Binaries: "linux/amd64" (etc.) to a static infergate binary's path.
	Binaries map[string]string
	// Created: every timestamp in the image (SOURCE_DATE_EPOCH).
	Created time.Time
	// Labels of every platform's config (org.opencontainers.image.*).
	Labels map[string]string
}

// Platforms in the index's order.
func platforms(o Options) []string {
	var ps []string
	for p := range o.Binaries {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// Image is one platform's image.
func Image(platform, binary string, o Options) (v1.Image, error) {
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok {
		return nil, fmt.Errorf("platform %q: want os/arch", platform)
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	baseFiles, err := BaseFiles()
	if err != nil {
		return nil, err
	}
	base, err := Layer(baseFiles, o.Created)
	if err != nil {
		return nil, err
	}
	app, err := Layer(AppFiles(bin), o.Created)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: o.Created.UTC()}
	ports := map[string]struct{}{}
	for _, p := range Ports {
		ports[p] = struct{}{}
	}
	cfg := &v1.ConfigFile{
		Architecture: arch,
		OS:           osName,
		Variant:      variant(arch),
		Created:      created,
		Config: v1.Config{
			Entrypoint:   Entrypoint,
			Cmd:          Cmd,
			User:         User,
			WorkingDir:   Home,
			Env:          []string{Path, "SSL_CERT_FILE=" + CABundle},
			ExposedPorts: ports,
			Labels:       o.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "infergate base: /etc/passwd, /etc/group (nonroot 65532), Mozilla CA bundle, /tmp, /home/nonroot, /var/lib/infergate", Comment: "tools/release/image"}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "COPY infergate " + BinaryPath, Comment: "tools/release/image"}},
	)
}

func variant(arch string) string {
	if arch == "arm64" {
		return "v8"
	}
	return ""
}

// Build is the multi-arch index over every platform in o.Binaries.
func Build(o Options) (v1.ImageIndex, map[string]v1.Image, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	imgs := map[string]v1.Image{}
	for _, p := range platforms(o) {
		img, err := Image(p, o.Binaries[p], o)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, nil, err
		}
		imgs[p] = img
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}})
	}
	return idx, imgs, nil
}

// WriteLayout writes idx as an OCI image layout at dir (replacing it), its
// index.json naming ref: `crane push DIR REF` (the one descriptor is the index), `skopeo copy --all
// oci:DIR:TAG docker://REF`, `podman load -i` (of the layout's tar).
func WriteLayout(dir string, idx v1.ImageIndex, ref name.Tag) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		AnnotationRefName:   ref.TagStr(),
		AnnotationImageName: ref.Name(),
	}))
}

// WriteDockerArchive writes one platform's image as a `docker load` /
// `podman load` / `kind load image-archive` tarball tagged ref.
func WriteDockerArchive(path string, ref name.Tag, img v1.Image) error {
	return tarball.WriteToFile(path, ref, img)
}

// WriteTree writes files under dir (the Dockerfile's rootfs): modes and,
// when running as root, owners as in the layer.
func WriteTree(dir string, files []File) error {
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if strings.HasSuffix(f.Name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		} else if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			return err
		}
		if err := os.Chmod(p, fs.FileMode(f.Mode&0o777)|modeBits(f.Mode)); err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(p, f.UID, f.UID); err != nil {
				return err
			}
		}
	}
	return nil
}

func modeBits(m int64) fs.FileMode {
	var fm fs.FileMode
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// TarDir writes the tree at dir as a tar (an OCI layout's archive:
// skopeo's oci-archive:FILE), reproducibly like [Tar].
func TarDir(w io.Writer, dir string, mtime time.Time) error {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			files = append(files, File{Name: rel + "/", Mode: 0o755})
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, File{Name: rel, Mode: 0o644, Data: data})
		return nil
	})
	if err != nil {
		return err
	}
	return Tar(w, files, mtime)
}
