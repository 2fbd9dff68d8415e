#!/usr/bin/env bash
# Install the peer gateways that make bench-overhead measures beside
# infergate, pinned, into project-local directories:
#
#   litellm   the LiteLLM proxy      <repo>/.tools/litellm-venv
#             (bench/overhead/peers/litellm-requirements.txt: litellm[proxy]
#             and every dependency pinned exactly)
#   portkey   the Portkey gateway    <repo>/.tools/portkey
#             (bench/overhead/peers/portkey/package.json and its lock file:
#             @portkey-ai/gateway pinned exactly, @hono/node-server held at
#             1.14.1, see below)
#
# Idempotent; when everything asked for is already in place it takes well
# under a second.
#
# Output contract:
#   stdout: shell assignments for the peers asked for, e.g.
#             eval "$(scripts/install-peers.sh litellm)"
#           LITELLM_BIN=...       the litellm proxy CLI (in its virtualenv)
#           LITELLM_VERSION=...   its version
#           PORTKEY_SERVER=...    the gateway's build/start-server.js
#           PORTKEY_VERSION=...   its version
#           NODE_BIN=...          node, to run it
#   stderr: progress messages.
#
# Environment:
#   PYTHON  interpreter used to create the LiteLLM virtualenv (default: python3)
#
# Usage: scripts/install-peers.sh [litellm] [portkey]   (default: both)
set -euo pipefail

log() { printf '[install-peers] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
TOOLS="$ROOT/.tools"
PEERS="$ROOT/bench/overhead/peers"

want_litellm=false want_portkey=false
(( $# )) || set -- litellm portkey
for peer in "$@"; do
  case "$peer" in
    litellm) want_litellm=true ;;
    portkey) want_portkey=true ;;
    *) die "unknown peer '$peer' (want litellm or portkey)" ;;
  esac
done

mkdir -p "$TOOLS"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$TOOLS/.install-peers.lock"
  flock 9
fi

# Content hash of a file, used to notice edited pin files.
file_hash() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------------------
# LiteLLM proxy: litellm[proxy] in <repo>/.tools/litellm-venv
# ---------------------------------------------------------------------------
install_litellm() {
  local venv="$TOOLS/litellm-venv" reqs="$PEERS/litellm-requirements.txt"
  local stamp="$venv/.requirements.sha256" version
  [[ -f "$reqs" ]] || die "missing $reqs"
  version="$(sed -n 's/^litellm\[proxy\]==\([^[:space:];]*\).*/\1/p' "$reqs")"
  [[ -n "$version" ]] || die "no exact 'litellm[proxy]==' pin in $reqs"

  # Quick check: the stamp matches the requirements file and the installed
  # distribution is the pinned one (importing litellm takes seconds).
  litellm_ok() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$(file_hash "$reqs")" && -x "$venv/bin/litellm" ]] || return 1
    "$venv/bin/python" - "$version" >/dev/null 2>&1 <<'EOF'
import importlib.metadata, sys
sys.exit(0 if importlib.metadata.version("litellm") == sys.argv[1] else 1)
EOF
  }

  if litellm_ok; then
    log "litellm[proxy]==$version already in $venv"
  else
    local python="${PYTHON:-python3}"
    command -v "$python" >/dev/null 2>&1 || die "'$python' not found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
    "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
      || die "litellm $version needs Python >= 3.10"
    if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
      log "creating virtualenv $venv"
      rm -rf "$venv"
      "$python" -m venv "$venv" >&2 || die "could not create a virtualenv (Debian: apt-get install python3-venv)"
    fi
    rm -f "$stamp"
    log "installing litellm[proxy]==$version (+ pinned dependencies, ~750 MB) into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$reqs" >&2
    "$venv/bin/python" -m pip check >/dev/null || die "inconsistent dependencies in $venv"
    file_hash "$reqs" >"$stamp"
    litellm_ok || die "litellm==$version not found in $venv after install"
  fi
  printf 'LITELLM_BIN=%q\n' "$venv/bin/litellm"
  printf 'LITELLM_VERSION=%q\n' "$version"
}

# ---------------------------------------------------------------------------
# Portkey gateway: @portkey-ai/gateway in <repo>/.tools/portkey
#
# Its package.json asks for @hono/node-server ^1.3.3, and every release after
# 1.14.1 hands the gateway upstream response headers it may not change:
# streamed chat completions fail with "TypeError: immutable"
# (Portkey-AI/gateway#1389, #1550). The lock file holds it at 1.14.1.
# ---------------------------------------------------------------------------
install_portkey() {
  local dir="$TOOLS/portkey" src="$PEERS/portkey" version
  local stamp="$dir/node_modules/.infergate-lock.sha256"
  [[ -f "$src/package.json" && -f "$src/package-lock.json" ]] || die "missing $src/package.json or its package-lock.json"
  command -v node >/dev/null 2>&1 || die "node not found; install Node.js >= 20 (Debian: apt-get install nodejs npm)"
  node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || die "the Portkey gateway needs Node.js >= 20, found $(node --version)"
  version="$(node -p 'require(process.argv[1]).dependencies["@portkey-ai/gateway"]' "$src/package.json")"
  [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] \
    || die "@portkey-ai/gateway must be pinned to an exact version in $src/package.json, found '$version'"

  portkey_ok() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$(file_hash "$src/package-lock.json")" ]] || return 1
    local have
    have="$(node -p 'require(process.argv[1]).version' "$dir/node_modules/@portkey-ai/gateway/package.json" 2>/dev/null)" || return 1
    [[ "$have" == "$version" && -f "$dir/node_modules/@portkey-ai/gateway/build/start-server.js" ]]
  }

  if portkey_ok; then
    log "npm @portkey-ai/gateway@$version already in $dir"
  else
    command -v npm >/dev/null 2>&1 || die "npm not found (Debian: apt-get install npm)"
    log "installing npm @portkey-ai/gateway@$version with 'npm ci' into $dir"
    mkdir -p "$dir"
    cp "$src/package.json" "$src/package-lock.json" "$dir/"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >&2
    file_hash "$src/package-lock.json" >"$stamp"
    portkey_ok || die "npm @portkey-ai/gateway@$version not found in $dir after install"
  fi
  printf 'PORTKEY_SERVER=%q\n' "$dir/node_modules/@portkey-ai/gateway/build/start-server.js"
  printf 'PORTKEY_VERSION=%q\n' "$version"
  printf 'NODE_BIN=%q\n' "$(command -v node)"
}

if $want_litellm; then install_litellm; fi
if $want_portkey; then install_portkey; fi
