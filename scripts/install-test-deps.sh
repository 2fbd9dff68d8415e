#!/usr/bin/env bash
# Install everything the end-to-end tests need, pinned, into project-local
# directories (nothing system-wide, except Redis):
#
#   Envoy          <repo>/.tools/bin/envoy         (scripts/install-envoy.sh)
#   Python clients <repo>/.tools/py-venv           (test/clients/requirements.txt:
#                  the openai and anthropic SDKs)
#   Node client    <repo>/test/clients/node_modules (test/clients/package-lock.json)
#   Redis          redis-server from the distribution (Debian: apt-get, as root),
#                  only if none is on PATH; the rate-limit tests start their own
#                  throwaway servers, so no daemon is left running
#   Chromium       chromium from the distribution (Debian: apt-get, as root),
#                  only if none is on PATH; the HTML report test (bench/report)
#                  opens the report in it, headless
#
# Idempotent; when everything is already in place it takes well under a second.
#
# Output contract:
#   stdout: shell assignments for the tests to use, e.g.
#             eval "$(scripts/install-test-deps.sh)"
#           ENVOY_BIN=...          absolute path of the Envoy binary
#           TEST_PYTHON=...        python of the client venv
#           TEST_NODE=...          node binary
#           TEST_CLIENTS_DIR=...   directory holding the clients (stream_openai.{py,mjs}, ...)
#           REDIS_SERVER=...       redis-server binary
#           CHROME_BIN=...         chromium binary
#           EG_BIN=...             envoy-gateway binary (Envoy Gateway standalone)
#           EPP_BIN=...            the Inference Extension's Endpoint Picker (test/kube)
#           ISTIO_BIN_DIR=...      pilot-discovery and pilot-agent (test/kube's Istio tests)
#   stderr: progress messages.
#
# Environment:
#   ENVOY_BIN     passed through to install-envoy.sh (use this Envoy instead)
#   PYTHON        interpreter used to create the client venv (default: python3)
#   REDIS_SERVER  use this redis-server instead of the one on PATH
#   CHROME_BIN    use this Chromium (or Chrome) instead of chromium on PATH
set -euo pipefail

log() { printf '[install-test-deps] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
TOOLS="$ROOT/.tools"
CLIENTS="$ROOT/test/clients"

# ---------------------------------------------------------------------------
# Envoy
# ---------------------------------------------------------------------------
ENVOY_PATH="$("$SCRIPT_DIR/install-envoy.sh")"

mkdir -p "$TOOLS"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$TOOLS/.install-test-deps.lock"
  flock 9
fi

# Content hash of a file, used to notice edited pin files.
file_hash() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------------------
# Python clients: the openai and anthropic SDKs in <repo>/.tools/py-venv
# ---------------------------------------------------------------------------
PY_VENV="$TOOLS/py-venv"
PY_REQS="$CLIENTS/requirements.txt"
PY_STAMP="$PY_VENV/.requirements.sha256"
[[ -f "$PY_REQS" ]] || die "missing $PY_REQS"
OPENAI_PY_VERSION="$(sed -n 's/^openai==\([^[:space:];]*\).*/\1/p' "$PY_REQS")"
[[ -n "$OPENAI_PY_VERSION" ]] || die "no exact 'openai==' pin in $PY_REQS"
ANTHROPIC_PY_VERSION="$(sed -n 's/^anthropic==\([^[:space:];]*\).*/\1/p' "$PY_REQS")"
[[ -n "$ANTHROPIC_PY_VERSION" ]] || die "no exact 'anthropic==' pin in $PY_REQS"

# Full check: `import openai` and `import anthropic` work and report the
# pinned versions. Takes a second or two (the SDKs are slow to import), so
# it runs after installing, and its success is recorded in $PY_STAMP with
# the requirements file's hash.
py_import_ok() {
  "$PY_VENV/bin/python" - "$OPENAI_PY_VERSION" "$ANTHROPIC_PY_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
import anthropic
import openai
sys.exit(0 if (openai.__version__, anthropic.__version__) == (sys.argv[1], sys.argv[2]) else 1)
EOF
}

# Quick check for re-runs: the stamp matches the current requirements file,
# the venv interpreter still runs, and the installed openai and anthropic
# distributions are the pinned versions with their packages present (no
# full import).
py_quick_ok() {
  [[ -f "$PY_STAMP" && "$(cat "$PY_STAMP")" == "$(file_hash "$PY_REQS")" ]] || return 1
  "$PY_VENV/bin/python" - "$OPENAI_PY_VERSION" "$ANTHROPIC_PY_VERSION" >/dev/null 2>&1 <<'EOF'
import importlib.metadata, importlib.util, sys
ok = all(importlib.metadata.version(name) == version and importlib.util.find_spec(name) is not None
         for name, version in (("openai", sys.argv[1]), ("anthropic", sys.argv[2])))
sys.exit(0 if ok else 1)
EOF
}

if py_quick_ok; then
  log "python openai==$OPENAI_PY_VERSION and anthropic==$ANTHROPIC_PY_VERSION already in $PY_VENV"
else
  PYTHON="${PYTHON:-python3}"
  command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "the openai and anthropic SDKs need Python >= 3.10"
  if ! "$PY_VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "creating virtualenv $PY_VENV"
    rm -rf "$PY_VENV"
    "$PYTHON" -m venv "$PY_VENV" >&2 || die "could not create a virtualenv (Debian: apt-get install python3-venv)"
  fi
  rm -f "$PY_STAMP"
  log "installing python openai==$OPENAI_PY_VERSION and anthropic==$ANTHROPIC_PY_VERSION (+ pinned dependencies) into $PY_VENV"
  "$PY_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$PY_REQS" >&2
  "$PY_VENV/bin/python" -m pip check >/dev/null || die "inconsistent dependencies in $PY_VENV"
  py_import_ok || die "python openai==$OPENAI_PY_VERSION or anthropic==$ANTHROPIC_PY_VERSION not importable from $PY_VENV after install"
  file_hash "$PY_REQS" >"$PY_STAMP"
fi

# ---------------------------------------------------------------------------
# Node client: openai npm package in <repo>/test/clients/node_modules
# ---------------------------------------------------------------------------
command -v node >/dev/null 2>&1 || die "node not found; install Node.js >= 20 (Debian: apt-get install nodejs npm)"
NODE="$(command -v node)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || die "the Node client needs Node.js >= 20, found $(node --version)"

NODE_MODULES="$CLIENTS/node_modules"
NODE_LOCK="$CLIENTS/package-lock.json"
NODE_STAMP="$NODE_MODULES/.infergate-lock.sha256"
[[ -f "$CLIENTS/package.json" ]] || die "missing $CLIENTS/package.json"
OPENAI_NODE_VERSION="$(node -p 'require(process.argv[1]).dependencies.openai' "$CLIENTS/package.json")"
[[ "$OPENAI_NODE_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "openai must be pinned to an exact version in $CLIENTS/package.json, found '$OPENAI_NODE_VERSION'"

node_ok() {
  [[ -f "$NODE_LOCK" && -f "$NODE_STAMP" && "$(cat "$NODE_STAMP")" == "$(file_hash "$NODE_LOCK")" ]] || return 1
  local have
  have="$(node -p 'require(process.argv[1]).version' "$NODE_MODULES/openai/package.json" 2>/dev/null)" || return 1
  [[ "$have" == "$OPENAI_NODE_VERSION" ]]
}

if node_ok; then
  log "npm openai@$OPENAI_NODE_VERSION already in $NODE_MODULES"
else
  command -v npm >/dev/null 2>&1 || die "npm not found (Debian: apt-get install npm)"
  if [[ -f "$NODE_LOCK" ]]; then
    log "installing npm openai@$OPENAI_NODE_VERSION with 'npm ci' into $NODE_MODULES"
    (cd "$CLIENTS" && npm ci --no-audit --no-fund --loglevel=error) >&2
  else
    log "no package-lock.json: installing npm openai@$OPENAI_NODE_VERSION with 'npm install' (commit the new lock file)"
    (cd "$CLIENTS" && npm install --no-audit --no-fund --loglevel=error) >&2
  fi
  file_hash "$NODE_LOCK" >"$NODE_STAMP"
  node_ok || die "npm openai@$OPENAI_NODE_VERSION not found in $NODE_MODULES after install"
fi

# ---------------------------------------------------------------------------
# Redis: redis-server for the rate-limit tests (internal/ratelimit, through
# internal/testutil/redisserver). Debian's package; any Redis >= 6 works.
# ---------------------------------------------------------------------------
REDIS_MIN_MAJOR=6

# Prints the major version of the redis-server $1, or fails.
redis_major() {
  "$1" --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9]*\)\..*/\1/p' | grep .
}

if [[ -n "${REDIS_SERVER:-}" ]]; then
  REDIS_PATH="$REDIS_SERVER"
  [[ -x "$REDIS_PATH" ]] || die "REDIS_SERVER=$REDIS_PATH is not an executable"
elif REDIS_PATH="$(command -v redis-server)"; then
  :
else
  command -v apt-get >/dev/null 2>&1 \
    || die "redis-server not found; install Redis >= $REDIS_MIN_MAJOR or set REDIS_SERVER"
  [[ "$(id -u)" -eq 0 ]] \
    || die "redis-server not found; install it (Debian: sudo apt-get install redis-server) or set REDIS_SERVER"
  log "installing Debian's redis-server with apt-get"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
  # The package may start a system daemon on port 6379; the tests run their
  # own servers on free ports, so stop it (harmless if none was started).
  service redis-server stop >/dev/null 2>&1 || true
  REDIS_PATH="$(command -v redis-server)" || die "redis-server not on PATH after installing it"
fi
REDIS_MAJOR="$(redis_major "$REDIS_PATH")" || die "could not read the version of $REDIS_PATH"
(( REDIS_MAJOR >= REDIS_MIN_MAJOR )) \
  || die "$REDIS_PATH is Redis $REDIS_MAJOR; the tests need Redis >= $REDIS_MIN_MAJOR"
log "redis-server $REDIS_MAJOR.x at $REDIS_PATH"

# ---------------------------------------------------------------------------
# Chromium: the headless browser of the HTML report test (bench/report,
# through chromedp). Debian's package; any recent Chromium or Chrome works.
# ---------------------------------------------------------------------------
if [[ -n "${CHROME_BIN:-}" ]]; then
  CHROME_PATH="$CHROME_BIN"
  [[ -x "$CHROME_PATH" ]] || die "CHROME_BIN=$CHROME_PATH is not an executable"
elif CHROME_PATH="$(command -v chromium)"; then
  :
else
  command -v apt-get >/dev/null 2>&1 \
    || die "chromium not found; install Chromium or set CHROME_BIN"
  [[ "$(id -u)" -eq 0 ]] \
    || die "chromium not found; install it (Debian: sudo apt-get install chromium) or set CHROME_BIN"
  log "installing Debian's chromium with apt-get"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  CHROME_PATH="$(command -v chromium)" || die "chromium not on PATH after installing it"
fi
# Debian's launcher script prints shell noise on stderr; only the version matters.
CHROME_VERSION="$("$CHROME_PATH" --version 2>/dev/null)" || die "could not run $CHROME_PATH --version"
log "$CHROME_VERSION at $CHROME_PATH"

# ---------------------------------------------------------------------------
# Envoy Gateway: envoy-gateway, pinned, built from the Go module proxy into
# <repo>/.tools/bin, for the standalone-mode end-to-end test. The first build
# takes minutes (the Go build cache keeps it afterwards).
# ---------------------------------------------------------------------------
EG_VERSION=v1.9.1
EG_PATH="$TOOLS/bin/envoy-gateway"
eg_ok() {
  [[ -x "$EG_PATH" ]] && go version -m "$EG_PATH" 2>/dev/null \
    | grep -qP "^\tmod\tgithub.com/envoyproxy/gateway\t${EG_VERSION//./\\.}\t"
}
if eg_ok; then
  log "envoy-gateway $EG_VERSION at $EG_PATH"
else
  command -v go >/dev/null 2>&1 || die "go not found: needed to build envoy-gateway"
  log "building envoy-gateway $EG_VERSION into $TOOLS/bin (first time: a few minutes)"
  mkdir -p "$TOOLS/bin"
  GOBIN="$TOOLS/bin" CGO_ENABLED=0 go install "github.com/envoyproxy/gateway/cmd/envoy-gateway@$EG_VERSION" >&2
  eg_ok || die "envoy-gateway $EG_VERSION not found at $EG_PATH after building it"
fi

# ---------------------------------------------------------------------------
# The Gateway API Inference Extension's Endpoint Picker (cmd/epp), pinned,
# built from the Go module proxy into <repo>/.tools/bin, for the test that puts
# infergate in front of it (test/kube). v1.4.0: the last release line whose
# InferencePool CRDs test/kube installs and that still ships the full picker
# (queue, KV-cache and prefix-cache scorers) in this module; v1.6.0 ships only
# the lightweight one. The proxy serves exact versions only (no version list,
# so `go install ...@v1.4.0` stops at its deprecation check): the module is
# downloaded and built with its own go.mod and go.sum. The version is in the
# binary's name.
# ---------------------------------------------------------------------------
EPP_MODULE=sigs.k8s.io/gateway-api-inference-extension
EPP_VERSION=v1.4.0
EPP_PATH="$TOOLS/bin/epp-$EPP_VERSION"
if [[ -x "$EPP_PATH" ]]; then
  log "endpoint picker $EPP_VERSION at $EPP_PATH"
else
  command -v go >/dev/null 2>&1 || die "go not found: needed to build the endpoint picker"
  log "building the endpoint picker $EPP_VERSION into $TOOLS/bin (first time: a few minutes)"
  EPP_SRC="$(go mod download -json "$EPP_MODULE@$EPP_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$EPP_SRC" ]] || die "go mod download $EPP_MODULE@$EPP_VERSION gave no directory"
  mkdir -p "$TOOLS/bin"
  GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -C "$EPP_SRC" -trimpath -o "$EPP_PATH.tmp" ./cmd/epp >&2
  mv "$EPP_PATH.tmp" "$EPP_PATH"
fi

# ---------------------------------------------------------------------------
# Istio's control plane: pilot-discovery (istiod) and pilot-agent, pinned,
# built from the Go module proxy into <repo>/.tools/bin/istio-<version>, for
# test/kube's Istio tests (istiod against the real API server, the mesh's
# gateway and a sidecar as the pinned upstream Envoy under pilot-agent). The
# proxy refuses istio.io/istio's release tags (1.26-1.28) and release-1.30's
# pseudo-version does not build (a dependency it names is not served): this
# is master at VERSION 1.31. Static (CGO_ENABLED=0); the first build takes
# about 5 minutes on 2 cores, the Go build cache keeps it afterwards. The
# version is in the directory's name.
# ---------------------------------------------------------------------------
ISTIO_MODULE=istio.io/istio
ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad
ISTIO_DIR="$TOOLS/bin/istio-$ISTIO_VERSION"
if [[ -x "$ISTIO_DIR/pilot-discovery" && -x "$ISTIO_DIR/pilot-agent" ]]; then
  log "istio $ISTIO_VERSION (pilot-discovery, pilot-agent) in $ISTIO_DIR"
else
  command -v go >/dev/null 2>&1 || die "go not found: needed to build istio"
  log "building istio $ISTIO_VERSION (pilot-discovery, pilot-agent) into $ISTIO_DIR (first time: about 5 minutes)"
  ISTIO_SRC="$(go mod download -json "$ISTIO_MODULE@$ISTIO_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$ISTIO_SRC" ]] || die "go mod download $ISTIO_MODULE@$ISTIO_VERSION gave no directory"
  rm -rf "$ISTIO_DIR.tmp" && mkdir -p "$ISTIO_DIR.tmp"
  GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -C "$ISTIO_SRC" -trimpath -ldflags '-s -w' \
    -o "$ISTIO_DIR.tmp/" ./pilot/cmd/pilot-discovery ./pilot/cmd/pilot-agent >&2
  rm -rf "$ISTIO_DIR" && mv "$ISTIO_DIR.tmp" "$ISTIO_DIR"
fi

printf 'ENVOY_BIN=%q\n' "$ENVOY_PATH"
printf 'TEST_PYTHON=%q\n' "$PY_VENV/bin/python"
printf 'TEST_NODE=%q\n' "$NODE"
printf 'TEST_CLIENTS_DIR=%q\n' "$CLIENTS"
printf 'REDIS_SERVER=%q\n' "$REDIS_PATH"
printf 'CHROME_BIN=%q\n' "$CHROME_PATH"
printf 'EG_BIN=%q\n' "$EG_PATH"
printf 'EPP_BIN=%q\n' "$EPP_PATH"
printf 'ISTIO_BIN_DIR=%q\n' "$ISTIO_DIR"
