package image_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/infergate/infergate/tools/release/image"
)

const repoRoot = "../../.."

// TestReproducible: the same inputs give the same index digest, and every
// layer's tar is sorted with fixed headers.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "infergate")
	if err := os.WriteFile(bin, []byte("not really a binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1796131888, 0).UTC()
	o := image.Options{
		Binaries: map[string]string{"linux/amd64": bin, "linux/arm64": bin},
		Created:  created,
		Labels:   map[string]string{"org.opencontainers.image.version": "v0.0.0"},
	}
	var digests []v1.Hash
	for range 2 {
		idx, _, err := image.Build(o)
		if err != nil {
			t.Fatal(err)
		}
		d, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
		// A layout written twice is the same bytes too.
		if err := image.WriteLayout(filepath.Join(dir, "oci"), idx, mustTag(t, "example.com/a/b:1")); err != nil {
			t.Fatal(err)
		}
	}
	if digests[0] != digests[1] {
		t.Fatalf("index digests differ: %s, %s", digests[0], digests[1])
	}
	_, imgs, err := image.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := imgs["linux/amd64"].Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		prev := ""
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name <= prev {
				t.Errorf("%s after %s: not sorted", h.Name, prev)
			}
			prev = h.Name
			if !h.ModTime.Equal(created) || h.Uname != "" || h.Gname != "" || h.Uid != h.Gid || (h.Uid != 0 && h.Uid != image.UID) {
				t.Errorf("%s: header %+v", h.Name, h)
			}
		}
		rc.Close()
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// layoutDir is make image's OCI layout: $INFERGATE_IMAGE_LAYOUT (make
// image-test sets it after make image) or bin/image/oci; without one the
// test fails rather than passing on nothing.
func layoutDir(t *testing.T) string {
	if p := os.Getenv("INFERGATE_IMAGE_LAYOUT"); p != "" {
		return p
	}
	p := filepath.Join(repoRoot, "bin", "image", "oci")
	if _, err := os.Stat(filepath.Join(p, "index.json")); err != nil {
		t.Fatal("no image at bin/image/oci: run make image-test (it builds the image, then this)")
	}
	return p
}

// TestImage opens the image make image built: both platforms, each config,
// the files, the amd64 binary running, and the chart's default image.
func TestImage(t *testing.T) {
	dir := layoutDir(t)
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 {
		t.Fatalf("index.json: %d descriptors, want the one index", len(tm.Manifests))
	}
	desc := tm.Manifests[0]
	ref, tag := desc.Annotations[image.AnnotationImageName], desc.Annotations[image.AnnotationRefName]
	t.Logf("%s %s", desc.Digest, ref)

	// The chart pulls what make image names: values.yaml image.repository
	// with Chart.yaml's appVersion (image.tag is empty by default).
	ch, err := loader.Load(filepath.Join(repoRoot, "charts", "infergate"))
	if err != nil {
		t.Fatal(err)
	}
	img := ch.Values["image"].(map[string]any)
	if img["tag"] != "" {
		t.Errorf("values.yaml image.tag %q: the default should be the appVersion", img["tag"])
	}
	if want := fmt.Sprintf("%s:%s", img["repository"], ch.Metadata.AppVersion); ref != want || tag != ch.Metadata.AppVersion {
		t.Errorf("make image names %q (tag %q); the chart's default image is %q", ref, tag, want)
	}
	if psc := ch.Values["podSecurityContext"].(map[string]any); fmt.Sprint(psc["runAsUser"]) != fmt.Sprint(image.UID) {
		t.Errorf("chart runAsUser %v, image user %s", psc["runAsUser"], image.User)
	}

	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("%s: no platform", m.Digest)
		}
		p := m.Platform.OS + "/" + m.Platform.Architecture
		platforms = append(platforms, p)
		t.Run(p, func(t *testing.T) {
			img, err := idx.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			checkImage(t, img, m.Platform, ch.Metadata.AppVersion)
		})
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v", platforms)
	}
}

func checkImage(t *testing.T, img v1.Image, p *v1.Platform, appVersion string) {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("config %s/%s, index %s/%s", cf.OS, cf.Architecture, p.OS, p.Architecture)
	}
	if !slices.Equal(c.Entrypoint, []string{"infergate"}) || !slices.Equal(c.Cmd, []string{"serve"}) ||
		c.User != "65532:65532" || c.WorkingDir != "/home/nonroot" {
		t.Errorf("config: entrypoint %q cmd %q user %q workdir %q", c.Entrypoint, c.Cmd, c.User, c.WorkingDir)
	}
	version := c.Labels["org.opencontainers.image.version"]
	if c.Labels["org.opencontainers.image.source"] != "https://github.com/infergate/infergate" || version != "v"+appVersion {
		t.Errorf("labels %v: want source and version v%s", c.Labels, appVersion)
	}
	if len(c.Labels["org.opencontainers.image.revision"]) != 40 {
		t.Errorf("revision label %q", c.Labels["org.opencontainers.image.revision"])
	}

	files := map[string]*tar.Header{}
	data := map[string][]byte{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		files[name] = h
		if h.Typeflag == tar.TypeReg {
			if data[name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Contains(data["etc/passwd"], []byte("nonroot:x:65532:65532:")) || !bytes.Contains(data["etc/group"], []byte("nonroot:x:65532:")) {
		t.Errorf("passwd %q group %q", data["etc/passwd"], data["etc/group"])
	}
	if h := files["home/nonroot"]; h == nil || h.Uid != image.UID {
		t.Errorf("home/nonroot: %+v", h)
	}
	if h := files["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("tmp: %+v", h)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data["etc/ssl/certs/ca-certificates.crt"]) || bytes.Count(data["etc/ssl/certs/ca-certificates.crt"], []byte("BEGIN CERTIFICATE")) < 100 {
		t.Error("CA bundle: fewer than 100 roots")
	}
	bin := data["usr/local/bin/infergate"]
	if h := files["usr/local/bin/infergate"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
		t.Fatalf("usr/local/bin/infergate: %+v", h)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[p.Architecture]
	if f.Machine != machine {
		t.Errorf("binary for %v, platform %s", f.Machine, p.Architecture)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("binary is dynamically linked")
		}
	}
	// -trimpath: no build directory in the binary.
	if wd, _ := filepath.Abs(repoRoot); bytes.Contains(bin, []byte(wd+"/")) {
		t.Errorf("binary contains the build path %s", wd)
	}
	if p.Architecture != runtime.GOARCH || runtime.GOOS != "linux" {
		return
	}
	run(t, bin, version)
}

// run starts the image's binary: `version`, then `serve` until /healthz.
func run(t *testing.T, bin []byte, version string) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "infergate")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "infergate "+version+" ") {
		t.Fatalf("infergate version: %q %v; want version %s", out, err, version)
	}
	t.Logf("%s", bytes.TrimSpace(out))

	extproc, admin := freePort(t), freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The defaults but for the ledger's file, which the image keeps in
	// /var/lib/infergate (its nonroot user's; a volume in the chart).
	cfg := filepath.Join(dir, "infergate.yaml")
	if err := os.WriteFile(cfg, []byte("ratelimit: {embedded: {path: "+filepath.Join(dir, "ledger.db")+"}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe, "serve", "--config", cfg, "--extproc-listen", extproc, "--admin-listen", admin)
	cmd.Dir = dir
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + admin + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("GET /healthz: %d %s", resp.StatusCode, firstLine(body))
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no /healthz 200 in 20s (%v); logs:\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The ext_proc port is listening too.
	c, err := net.DialTimeout("tcp", extproc, 2*time.Second)
	if err != nil {
		t.Fatalf("ext_proc port: %v", err)
	}
	c.Close()
}

func firstLine(b []byte) string {
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Scan()
	return s.Text()
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDockerfile: the Dockerfile builds the image make image builds (same
// build flags, user, entrypoint, cmd, workdir, base files).
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CGO_ENABLED=0", "-trimpath -buildvcs=false", "-s -w -buildid= -X github.com/infergate/infergate/internal/cli.Version=",
	} {
		if !bytes.Contains(b, []byte(want)) || !bytes.Contains(mk, []byte(want)) {
			t.Errorf("Dockerfile and Makefile should both have %q", want)
		}
	}
	for _, want := range []string{
		"FROM scratch", "go -C tools run ./release/mkimage --rootfs",
		"COPY --from=build /out/infergate " + image.BinaryPath,
		"ENV " + image.Path + " SSL_CERT_FILE=" + image.CABundle,
		"USER " + image.User, "WORKDIR " + image.Home,
		"EXPOSE " + strings.Join(image.Ports, " "),
		`ENTRYPOINT ["infergate"]`, `CMD ["serve"]`,
		"org.opencontainers.image.source=https://github.com/infergate/infergate",
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
}
