# infergate: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
BIN       := bin/infergate
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/infergate/infergate/internal/cli.Version=$(VERSION)
FUZZTIME  ?= 10s

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "; printf "Usage: make <target>\n\n"} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/infergate
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/infergate

# The lab (bench/: load generator, mock upstream, overhead harness, report) is
# a module and a binary of its own, so that none of it ships in infergate.
BENCH_BIN := bin/infergate-bench
.PHONY: build-bench
build-bench: ## Build bin/infergate-bench, the lab's binary: the load generator (bench) and the mock upstream (mock)
	$(GO) -C bench build -trimpath -ldflags '-s -w -X main.version=$(VERSION)' -o $(CURDIR)/$(BENCH_BIN) ./cmd/infergate-bench

# The in-Envoy meter (envoy/wasm-meter.yaml): a proxy-wasm module for Envoy's
# Wasm filter, built with Go's own wasip1 port (no TinyGo). The e2e tests
# build it themselves.
WASM := bin/infergate-meter.wasm
.PHONY: wasm
wasm: ## Build bin/infergate-meter.wasm, the in-Envoy meter (proxy-wasm, an option to the ext_proc meter)
	GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath -buildmode=c-shared -o $(WASM) ./cmd/infergate-meter-wasm

# The gate and the meter as an Envoy dynamic module (envoy/snippet-module.yaml):
# a Go shared library Envoy loads as lib<name>.so from
# ENVOY_DYNAMIC_MODULES_SEARCH_PATH; Envoy then runs with GODEBUG=cgocheck=0.
# cgo (a C compiler) is required. The e2e tests build it themselves.
MODULE := bin/libinfergate.so
.PHONY: module
module: ## Build bin/libinfergate.so, the gate and the meter as an Envoy dynamic module (an option to ext_proc)
	CGO_ENABLED=1 $(GO) build -trimpath -buildmode=c-shared -o $(MODULE) ./cmd/infergate-module

# Release artefacts (make image, make release; docs/deploy/install.md). The release
# version lives in one place, charts/infergate/Chart.yaml's appVersion: the
# image's tag (the chart's default image is values.yaml image.repository +
# appVersion) and v<appVersion> stamped into the release binaries (make build
# stamps git describe). Every timestamp is the commit's (SOURCE_DATE_EPOCH) and
# the binaries carry no path, VCS stamp or build ID: the same commit gives the
# same files and the same image digest (make image-repro). The tools (go-containerregistry, Helm,
# cyclonedx-gomod) live in the developer tools' module, tools/go.mod.
# kube-apiserver's version as test/kube/go.mod pins it, stamped into the test
# binary as Kubernetes' own build does (unstamped it says v0.0.0-master).
KUBE_VERSION      := $(shell sed -n 's/^\tk8s.io\/kubernetes \(v[0-9.]*\)$$/\1/p' test/kube/go.mod)
KUBE_LDFLAGS      := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) -X k8s.io/component-base/version.gitMajor=$(word 2,$(subst ., ,$(subst v,v ,$(KUBE_VERSION)))) -X k8s.io/component-base/version.gitMinor=$(word 3,$(subst ., ,$(subst v,v ,$(KUBE_VERSION))))
APP_VERSION       := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/infergate/Chart.yaml)
RELEASE_VERSION   ?= v$(APP_VERSION)
IMAGE_REPO        ?= $(shell sed -n '/^image:/,/^[^ ]/s/^  repository: *//p' charts/infergate/values.yaml)
IMAGE             ?= $(IMAGE_REPO):$(APP_VERSION)
IMAGE_PLATFORMS   := linux/amd64 linux/arm64
RELEASE_PLATFORMS := $(IMAGE_PLATFORMS) darwin/amd64 darwin/arm64
# No licence file in the repository yet: set IMAGE_LICENSES (an SPDX
# expression) to label the image with one.
IMAGE_LICENSES    ?=
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
REVISION          := $(shell git rev-parse HEAD 2>/dev/null)
RELEASE_GOFLAGS   := -trimpath -buildvcs=false -ldflags '-s -w -buildid= -X github.com/infergate/infergate/internal/cli.Version=$(RELEASE_VERSION)'
RELEASE_BIN       := bin/release
IMAGE_DIR         := bin/image
DIST              := dist
IMAGE_LABELS      := --label org.opencontainers.image.title=infergate \
  --label org.opencontainers.image.description='Envoy ext_proc plugin for LLM inference traffic' \
  --label org.opencontainers.image.source=https://github.com/infergate/infergate \
  --label org.opencontainers.image.version=$(RELEASE_VERSION) \
  $(if $(REVISION),--label org.opencontainers.image.revision=$(REVISION)) \
  $(if $(IMAGE_LICENSES),--label org.opencontainers.image.licenses=$(IMAGE_LICENSES))

# release-binaries PLATFORMS: static (CGO_ENABLED=0) binaries into bin/release/infergate-OS-ARCH.
define release-binaries
	@mkdir -p $(RELEASE_BIN)
	@set -e; for p in $(1); do os=$${p%/*}; arch=$${p#*/}; echo "build $(RELEASE_BIN)/infergate-$$os-$$arch ($(RELEASE_VERSION))"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build $(RELEASE_GOFLAGS) -o $(RELEASE_BIN)/infergate-$$os-$$arch ./cmd/infergate; done
endef

.PHONY: image
image: ## Build the container image without a daemon: OCI layout bin/image/oci (linux/amd64 + linux/arm64 index) and a docker-load tarball per platform; prints the digests
	$(call release-binaries,$(IMAGE_PLATFORMS))
	@$(GO) -C tools build -o $(CURDIR)/bin/mkimage ./release/mkimage
	@mkdir -p $(IMAGE_DIR)
	bin/mkimage --ref $(IMAGE) --created $(SOURCE_DATE_EPOCH) $(foreach p,$(IMAGE_PLATFORMS),--binary $(p)=$(RELEASE_BIN)/infergate-$(subst /,-,$(p))) \
	  $(IMAGE_LABELS) --layout $(IMAGE_DIR)/oci --docker-archives $(IMAGE_DIR)

.PHONY: image-test
image-test: image ## Open the built image (go-containerregistry): platforms, config, the amd64 binary's version and /healthz, the chart's default image
	$(GO) -C tools vet ./...
	INFERGATE_IMAGE_LAYOUT=$(CURDIR)/$(IMAGE_DIR)/oci $(GO) -C tools test -count=1 ./release/...

.PHONY: image-repro
image-repro: ## make image twice, from scratch (empty build cache the second time): the index digests must match
	@cache=$$(mktemp -d); trap 'rm -rf $$cache' EXIT; \
	d1=$$($(MAKE) -s image | awk '$$1=="index"{print $$2}'); \
	d2=$$(GOCACHE=$$cache $(MAKE) -s image | awk '$$1=="index"{print $$2}'); \
	echo "run 1: $$d1"; echo "run 2: $$d2"; [ -n "$$d1" ] && [ "$$d1" = "$$d2" ]

.PHONY: release
release: wasm image ## dist/: binaries (linux, darwin; amd64, arm64), image (OCI archive + docker tarballs), chart, dashboard, Wasm meter, SBOMs, SHA256SUMS
	$(call release-binaries,$(filter-out $(IMAGE_PLATFORMS),$(RELEASE_PLATFORMS)))
	rm -rf $(DIST) && mkdir -p $(DIST)
	@# An SBOM per binary; cyclonedx-gomod stamps the time of the run, the SBOMs get the commit's instead.
	@set -e; for p in $(RELEASE_PLATFORMS); do b=infergate-$(RELEASE_VERSION)-$${p%/*}-$${p#*/}; \
	  cp $(RELEASE_BIN)/infergate-$${p%/*}-$${p#*/} $(DIST)/$$b; \
	  $(GO) -C tools tool cyclonedx-gomod bin -json -noserial -version $(RELEASE_VERSION) -output $(CURDIR)/$(DIST)/$$b.cdx.json $(CURDIR)/$(DIST)/$$b; \
	  sed -i "s/^    \"timestamp\": \".*\",$$/    \"timestamp\": \"$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)\",/" $(DIST)/$$b.cdx.json; done
	bin/mkimage --ref $(IMAGE) --created $(SOURCE_DATE_EPOCH) $(foreach p,$(IMAGE_PLATFORMS),--binary $(p)=$(RELEASE_BIN)/infergate-$(subst /,-,$(p))) \
	  $(IMAGE_LABELS) --layout $(IMAGE_DIR)/oci --oci-archive $(DIST)/infergate-$(RELEASE_VERSION)-image-oci.tar
	@for p in $(IMAGE_PLATFORMS); do cp $(IMAGE_DIR)/infergate-image-$${p%/*}-$${p#*/}.tar $(DIST)/infergate-$(RELEASE_VERSION)-image-$${p%/*}-$${p#*/}.docker.tar; done
	$(GO) -C tools run ./release/helmpackage --created $(SOURCE_DATE_EPOCH) --app-version $(APP_VERSION) --destination $(CURDIR)/$(DIST) $(CURDIR)/charts/infergate
	cp charts/infergate/dashboards/infergate.json $(DIST)/infergate-$(RELEASE_VERSION)-grafana-dashboard.json
	cp $(WASM) $(DIST)/infergate-meter-$(RELEASE_VERSION).wasm
	cd $(DIST) && sha256sum $$(ls | grep -v '^SHA256SUMS$$') > SHA256SUMS
	@ls -l $(DIST)

.PHONY: deps
deps: ## Install what the tests need (pinned Envoy, Redis, OpenAI Python and Node SDKs, Envoy Gateway, the Endpoint Picker, istiod and pilot-agent)
	@scripts/install-test-deps.sh >/dev/null

# The tiers: make unit, e2e, chaos and kube each run one part of make test.
# make test runs them in four lanes side by side (scripts/test-lanes.sh):
# the tiers spend much of their time waiting on real processes (Envoy, Redis,
# a kube-apiserver, a soak's clock), so they overlap instead of queueing.
# Each lane's log is bin/test-logs/<lane>.log; a table of every step's
# seconds and result ends the run, with the tail of each failing step's log.
# What only compiles, or runs in virtual time, runs niced: vet, unit, the
# chart tests, and each Envoy-backed tier's build (the *-build targets) before
# the tier runs. The real processes that follow, on real timeouts (a gate's
# message timeout, a Redis call's), keep the cores whatever the other lanes do.
TEST_LANES := unit=nice:vet,nice:unit,nice:chart-test kube=nice:kube-build,kube-test \
              e2e=nice:e2e-build,e2e chaos=nice:chaos-build,chaos-soak
.PHONY: test
test: deps ## Run every test in four lanes side by side: vet, unit, charts | kube | e2e (+ the overhead smoke) | chaos and a 3-minute soak; logs in bin/test-logs/
	@# No $$(MAKE) on this line: make -n would run it (and the lanes).
	@GOTESTFLAGS='$(or $(GOTESTFLAGS),-v)' scripts/test-lanes.sh $(TEST_LANES)

# The tiers' builds alone (test binaries discarded, the build cache kept),
# for make test's lanes to compile niced; the tiers then only link and run.
.PHONY: e2e-build chaos-build kube-build
e2e-build:
	$(GO) -C test test -race -c -o /dev/null ./e2e/
	$(GO) -C bench test -race -c -o /dev/null ./overhead/
chaos-build:
	$(GO) -C test test -c -o /dev/null ./chaos/
	$(GO) build -o /dev/null ./cmd/infergate
	$(GO) -C bench build -o /dev/null ./cmd/infergate-bench
kube-build:
	cd test/kube && $(GO) test -c -o /dev/null -ldflags '$(KUBE_LDFLAGS)' .

.PHONY: vet
vet: ## go vet in every module (make test runs it; go test runs only a subset of vet's checks)
	@set -e; for m in $(MODULES); do echo "go vet ($$m)"; $(GO) -C $$m vet ./...; done

# The Go modules make unit, make lint and make check cover: the product, the
# lab, the test suites and the developer tools (test/charts and test/kube have
# targets of their own). go test stops at a module's edge, hence the loops.
MODULES := . bench test tools
# The Envoy-backed suites, which make e2e and make chaos run.
SUITES  := /test/e2e /test/chaos /bench/overhead /tools/release/image

# The race detector runs where concurrency lives: a package whose code or
# tests start a goroutine, serve HTTP, run a process, or use sync, atomic or
# synctest. The rest (parsers, config, docs) run without it: there it finds
# nothing and makes the tests several times slower. UNIT_P packages at a
# time: many unit tests wait on a redis-server or Chromium, not on a core.
RACY   := '^\s*go [a-zA-Z(]|sync\.|atomic\.|httptest\.|t\.Parallel\(|synctest\.|exec\.Command'
UNIT_P ?= 4
.PHONY: unit
unit: ## Rego (opa test), unit and layout tests and the fuzz seed corpora in every module (race detector where goroutines live): no Envoy-backed suite; make vet for go vet
	$(GO) -C tools tool opa test $(CURDIR)/policies/
	@# test/layout fails on an import that points the wrong way (docs/architecture.md).
	@set -e; for m in $(MODULES); do \
	  race=; plain=; \
	  for p in $$($(GO) -C $$m list -f '{{.ImportPath}}={{.Dir}}' ./... | grep -v $(foreach s,$(SUITES),-e '$(s)=')); do \
	    if grep -qE $(RACY) $${p#*=}/*.go; then race="$$race $${p%%=*}"; else plain="$$plain $${p%%=*}"; fi; done; \
	  if [ -n "$$race" ]; then echo "go test -race ($$m)"; $(GO) -C $$m test -race -count=1 -p $(UNIT_P) $$race; fi; \
	  if [ -n "$$plain" ]; then echo "go test ($$m)"; $(GO) -C $$m test -count=1 -p $(UNIT_P) $$plain; fi; done

# Each parallel e2e test runs its own Envoy, infergate, pools and clients:
# two at a time keeps two cores busy without starving any of them.
E2E_PARALLEL ?= 2
.PHONY: e2e
e2e: deps ## The end-to-end tests (real Envoy + infergate + mock pools + SDKs), E2E_PARALLEL (2) at a time, then the overhead harness's smoke run; race detector on; GOTESTFLAGS=-v for the log
	$(GO) -C test test -race -count=1 -timeout 30m -parallel $(E2E_PARALLEL) $(GOTESTFLAGS) ./e2e/
	@# The overhead harness's smoke run: every phase through real Envoy (a minute).
	$(GO) -C bench test -race -count=1 $(GOTESTFLAGS) ./overhead/

.PHONY: kube
kube: kube-test ## Alias of kube-test

# LOAD_TARGET=unit (say) runs one tier under the burner instead of make test.
LOAD_TARGET ?= test
.PHONY: test-under-load
test-under-load: ## make test (or LOAD_TARGET) with one core kept busy by a CPU burner it starts and always stops
	@set -e; \
	if command -v taskset >/dev/null; then taskset -c 0 yes >/dev/null & else yes >/dev/null & fi; burner=$$!; \
	trap 'kill $$burner 2>/dev/null || true' EXIT INT TERM; \
	echo "CPU burner: pid $$burner, one core busy"; \
	$(MAKE) $(LOAD_TARGET)

.PHONY: chart-test
chart-test: ## Helm chart: lint, render, strict decode, golden files, Envoy Gateway translation (first run builds egctl)
	@# Its own Go module (test/charts/go.mod): Kubernetes, Envoy Gateway, Istio and Helm stay out of go.mod.
	@# The first run builds Envoy Gateway's egctl (minutes; cached after), hence the timeout.
	cd test/charts && $(GO) test -count=1 -timeout 30m ./...

.PHONY: kube-test
kube-test: deps ## The chart, the weight sinks, Envoy Gateway (Kubernetes mode), istiod with its gateway and a sidecar, and the Inference Extension's Endpoint Picker against a real kube-apiserver (first run builds it: ~8 min)
	@# Its own Go module (test/kube/go.mod): kube-apiserver and etcd built from the
	@# module proxy, in-process. The version stamp is what the chart's kubeVersion checks.
	cd test/kube && $(GO) test -count=1 -timeout 40m -ldflags '$(KUBE_LDFLAGS)' ./...

.PHONY: chaos-soak
chaos-soak: deps ## The chaos package as make test runs it: the faults (make chaos) and a 3-minute soak
	$(GO) -C test test -count=1 -timeout 20m -v ./chaos/

.PHONY: chaos
chaos: deps ## Kill, freeze and restart infergate, Envoy, Redis, the controller and a pool under load; check every byte and the ledger; print the table
	$(GO) -C test test -count=1 -timeout 20m -run 'TestChaos$$' -v ./chaos/

# SOAK_DURATION=3m (say) for a shorter run; make test runs 3 minutes.
SOAK_DURATION ?= 30m
.PHONY: soak
soak: deps ## Hold a mixed load for SOAK_DURATION (default 30m) with reloads and a fault every few minutes; watch memory, goroutines, fds and Redis; report in bin/soak.html
	SOAK_DURATION=$(SOAK_DURATION) $(GO) -C test test -count=1 -timeout 0 -run 'TestSoak$$' -v ./chaos/

.PHONY: demo
demo: build build-bench ## Run the demo: Envoy + infergate + two mock pools + a benchmark, then stop
	@scripts/demo.sh

.PHONY: bench
bench: build build-bench ## Benchmarks: hot paths (go test -bench) and gateway overhead vs direct
	$(GO) test -run='^$$' -bench=. -benchmem ./internal/sse/ ./internal/openai/ ./extproc/ ./internal/policy/ ./internal/ratelimit/
	@DEMO_REQUESTS=400 DEMO_CONCURRENCY=8 scripts/demo.sh

# OVERHEAD_ARGS='--only c1' (say) reruns part of it, into bin/overhead.json: only a full run publishes.
OVERHEAD_ARGS ?=
.PHONY: bench-overhead
bench-overhead: build build-bench ## Gateway overhead the public board's way: direct vs plain Envoy vs Envoy + infergate, and each choice's price (docs/performance.md)
	$(GO) -C bench build -o $(CURDIR)/bin/overhead ./overhead
	@# Measurements take turns on this machine: one at a time, under the shared lock.
	flock /tmp/infergate-measure.lock bin/overhead --infergate $(BIN) --mock-bin $(BENCH_BIN) \
	  $(if $(OVERHEAD_ARGS),--json bin/overhead.json,--json docs/performance.json --doc docs/performance.md) \
	  --command "make bench-overhead$(if $(OVERHEAD_ARGS), OVERHEAD_ARGS='$(OVERHEAD_ARGS)')" $(OVERHEAD_ARGS)

# The picker's row of docs/performance.md: a benchmark in test/kube, where the
# Endpoint Picker finds its pods through the real kube-apiserver. make kube-test
# compiles it and never runs it (go test runs benchmarks only with -bench).
.PHONY: bench-picker
bench-picker: deps ## The gate's added latency with and without the Inference Extension's Endpoint Picker chained (real kube-apiserver; docs/performance.md)
	@mkdir -p bin
	cd test/kube && $(GO) test -c -o $(CURDIR)/bin/kube.test -ldflags '$(KUBE_LDFLAGS)' .
	@# Measurements take turns on this machine: one at a time, under the shared lock.
	cd test/kube && PICKER_DOC=$(CURDIR)/docs/performance.md flock /tmp/infergate-measure.lock $(CURDIR)/bin/kube.test \
	  -test.run '^$$' -test.bench '^BenchmarkGateWithEndpointPicker$$' -test.benchtime 1x -test.timeout 30m -test.v

# Two docs are generated; make unit fails while either is stale.
.PHONY: docs
docs: ## Regenerate docs/reference/configuration.md (from internal/config) and the chart README's values table (from values.yaml)
	$(GO) run ./internal/config/configdoc
	$(GO) run ./charts/valuesdoc

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (pinned in tools/go.mod) in every module
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@set -e; staticcheck=$$($(GO) -C tools tool -n staticcheck); for m in $(MODULES); do \
	  echo "go vet, staticcheck ($$m)"; $(GO) -C $$m vet ./...; (cd $$m && $$staticcheck ./...); done

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10s)
	@set -e; for pkg in ./internal/sse ./internal/openai ./internal/config ./internal/policy ./internal/wasmmeter ./extproc; do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg; \
	  done; done

.PHONY: check
check: ## Everything CI would want: tidy (no diff), lint, test, short fuzzing
	@set -e; for m in $(MODULES); do $(GO) -C $$m mod tidy; git diff --exit-code $$m/go.mod $$m/go.sum; done
	$(MAKE) lint test fuzz

.PHONY: clean
clean: ## Remove build output (keeps .tools/)
	rm -rf bin $(DIST)

# The generator's own figures (docs/benchmarking.md); each run takes /tmp/infergate-measure.lock.
MEASURE_ARGS ?=
.PHONY: bench-accuracy bench-capacity bench-crosscheck
bench-accuracy: build-bench ## infergate-bench bench vs the fixed-cadence mock: TTFT/ITL error at 256 streams, and the zero-delay noise floor
	@python3 bench/scripts/measure.py accuracy $(MEASURE_ARGS)

bench-capacity: build-bench ## Most streams and SSE events/s this machine's bench + mock sustain accurately, bench CPU per 1000 events
	@python3 bench/scripts/measure.py capacity $(MEASURE_ARGS)

bench-crosscheck: build-bench ## The same workload through NVIDIA AIPerf (pinned, into .tools/aiperf-venv) and infergate-bench bench, side by side
	@python3 bench/scripts/measure.py crosscheck $(MEASURE_ARGS)
