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
	@awk 'BEGIN {FS = ":.*## "; printf "Usage: make <target>\n\n"} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-8s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/infergate
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/infergate

# The in-Envoy meter (envoy/wasm-meter.yaml): a proxy-wasm module for Envoy's
# Wasm filter, built with Go's own wasip1 port (no TinyGo). The e2e tests
# build it themselves.
WASM := bin/infergate-meter.wasm
.PHONY: wasm
wasm: ## Build bin/infergate-meter.wasm, the in-Envoy meter (proxy-wasm, an option to the ext_proc meter)
	GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath -buildmode=c-shared -o $(WASM) ./cmd/infergate-meter-wasm

.PHONY: deps
deps: ## Install what the tests need (pinned Envoy, Redis, OpenAI Python and Node SDKs)
	@scripts/install-test-deps.sh >/dev/null

.PHONY: test
test: deps ## Run every test: Rego (opa test), unit and layout (race detector on), fuzz seed corpora, end-to-end against real Envoy and Redis
	$(GO) vet ./...
	$(GO) tool opa test policies/
	@# test/layout fails on an import that points the wrong way (docs/architecture.md).
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v -e /test/e2e -e /test/chaos)
	@# End to end last and alone: real processes share the two cores.
	$(GO) test -race -count=1 ./test/e2e/
	@# Faults under load, and the ledger after each (make chaos prints the table).
	$(GO) test -count=1 -timeout 20m ./test/chaos/
	cd test/charts && $(GO) test -count=1 -timeout 30m ./...

.PHONY: chart-test
chart-test: ## Helm chart: lint, render, strict decode, golden files, Envoy Gateway translation (first run builds egctl)
	@# Its own Go module (test/charts/go.mod): Kubernetes, Envoy Gateway, Istio and Helm stay out of go.mod.
	@# The first run builds Envoy Gateway's egctl (minutes; cached after), hence the timeout.
	cd test/charts && $(GO) test -count=1 -timeout 30m ./...

.PHONY: e2e
e2e: deps ## Run only the end-to-end tests (real Envoy + infergate + mock pools + SDKs), verbosely
	$(GO) test -count=1 -v ./test/e2e/

.PHONY: chaos
chaos: deps ## Kill, freeze and restart infergate, Envoy, Redis, the controller and a pool under load; check every byte and the ledger; print the table
	$(GO) test -count=1 -timeout 20m -run 'TestChaos$$' -v ./test/chaos/

# SOAK_DURATION=3m (say) for a shorter run; make test runs 3 minutes.
SOAK_DURATION ?= 30m
.PHONY: soak
soak: deps ## Hold a mixed load for SOAK_DURATION (default 30m) with reloads and a fault every few minutes; watch memory, goroutines, fds and Redis; report in bin/soak.html
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -timeout 0 -run 'TestSoak$$' -v ./test/chaos/

.PHONY: demo
demo: build ## Run the demo: Envoy + infergate + two mock pools + a benchmark, then stop
	@scripts/demo.sh

.PHONY: bench
bench: build ## Benchmarks: hot paths (go test -bench) and gateway overhead vs direct
	$(GO) test -run='^$$' -bench=. -benchmem ./internal/sse/ ./internal/openai/ ./extproc/ ./internal/policy/ ./internal/ratelimit/
	@DEMO_REQUESTS=400 DEMO_CONCURRENCY=8 scripts/demo.sh

# OVERHEAD_ARGS='--only c1' (say) reruns part of it, into bin/overhead.json: only a full run publishes.
OVERHEAD_ARGS ?=
.PHONY: bench-overhead
bench-overhead: build ## Gateway overhead the public board's way: direct vs plain Envoy vs Envoy + infergate, and each choice's price (docs/performance.md)
	$(GO) build -o bin/overhead ./bench/overhead
	@# Measurements take turns on this machine: one at a time, under the shared lock.
	flock /tmp/infergate-measure.lock bin/overhead --infergate $(BIN) \
	  $(if $(OVERHEAD_ARGS),--json bin/overhead.json,--json docs/performance.json --doc docs/performance.md) \
	  --command "make bench-overhead$(if $(OVERHEAD_ARGS), OVERHEAD_ARGS='$(OVERHEAD_ARGS)')" $(OVERHEAD_ARGS)

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (pinned as a go.mod tool)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10s)
	@set -e; for pkg in ./internal/sse ./internal/openai ./internal/config ./internal/policy ./internal/wasmmeter ./extproc; do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg; \
	  done; done

.PHONY: check
check: ## Everything CI would want: tidy (no diff), lint, test, short fuzzing
	$(GO) mod tidy && git diff --exit-code go.mod go.sum
	$(MAKE) lint test fuzz

.PHONY: clean
clean: ## Remove build output (keeps .tools/)
	rm -rf bin

# The generator's own figures (docs/benchmarking.md); each run takes /tmp/infergate-measure.lock.
MEASURE_ARGS ?=
.PHONY: bench-accuracy bench-capacity bench-crosscheck
bench-accuracy: build ## infergate bench vs the fixed-cadence mock: TTFT/ITL error at 256 streams, and the zero-delay noise floor
	@python3 bench/scripts/measure.py accuracy $(MEASURE_ARGS)

bench-capacity: build ## Most streams and SSE events/s this machine's bench + mock sustain accurately, bench CPU per 1000 events
	@python3 bench/scripts/measure.py capacity $(MEASURE_ARGS)

bench-crosscheck: build ## The same workload through NVIDIA AIPerf (pinned, into .tools/aiperf-venv) and infergate bench, side by side
	@python3 bench/scripts/measure.py crosscheck $(MEASURE_ARGS)
