# syntax=docker/dockerfile:1
# infergate's container image, for Docker, Podman or BuildKit:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=v0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t ghcr.io/infergate/infergate:0.1.0 .
#   podman build --build-arg VERSION=v0.1.0 -t ghcr.io/infergate/infergate:0.1.0 .
#
# The equivalent of what `make image` builds without a daemon (tools/release/image,
# the tested and reproducible path): the same static binary (CGO_ENABLED=0,
# -trimpath, no VCS stamp, no build ID, the version stamped as in make build),
# the same base files written by the same code (mkimage --rootfs: /etc/passwd
# and /etc/group for nonroot 65532, Mozilla's CA bundle pinned by
# tools/go.mod, /tmp, /home/nonroot) on scratch, as two layers, and the same
# config. It differs in timestamps and history, so not in digest; make image
# sets VERSION from Chart.yaml's appVersion for you.
ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
      -ldflags "-s -w -buildid= -X github.com/infergate/infergate/internal/cli.Version=${VERSION}" \
      -o /out/infergate ./cmd/infergate \
 && go -C tools run ./release/mkimage --rootfs /rootfs

FROM scratch
ARG VERSION=dev
ARG REVISION=
COPY --from=build /rootfs/ /
COPY --from=build /out/infergate /usr/local/bin/infergate
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 50051/tcp 9090/tcp 18000/tcp
# No licence file in the repository yet, hence no org.opencontainers.image.licenses.
LABEL org.opencontainers.image.title=infergate \
      org.opencontainers.image.description="Envoy ext_proc plugin for LLM inference traffic" \
      org.opencontainers.image.source=https://github.com/infergate/infergate \
      org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION}
ENTRYPOINT ["infergate"]
CMD ["serve"]
