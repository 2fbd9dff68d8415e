#!/usr/bin/env bash
# Install NVIDIA AIPerf, pinned (bench/scripts/aiperf-requirements.txt), into
# <repo>/.tools/aiperf-venv, and build the offline word-level tokenizer it
# counts tokens with into <repo>/.tools/aiperf-tokenizer
# (bench/scripts/aiperf_tokenizer.py: no Hugging Face download). For
# `make bench-crosscheck`. Idempotent: when both are in place it takes well
# under a second.
#
# Output contract:
#   stdout: shell assignments, e.g. eval "$(bench/scripts/install-aiperf.sh)"
#           AIPERF=...            the aiperf command
#           AIPERF_TOKENIZER=...  the tokenizer directory (aiperf --tokenizer)
#   stderr: progress messages.
#
# Environment:
#   PYTHON  interpreter used to create the venv (default: python3; AIPerf
#           0.13.0 needs Python >= 3.11, < 3.14)
set -euo pipefail

log() { printf '[install-aiperf] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/../.." && pwd -P)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/aiperf-venv"
REQS="$SCRIPT_DIR/aiperf-requirements.txt"
STAMP="$VENV/.requirements.sha256"
TOKENIZER="$TOOLS/aiperf-tokenizer"
TOK_STAMP="$TOKENIZER/.builder.sha256"

mkdir -p "$TOOLS"
exec 9>"$TOOLS/.install-aiperf.lock"
flock 9

file_hash() { sha256sum "$1" | cut -d' ' -f1; }
AIPERF_VERSION="$(sed -n 's/^aiperf==\([^[:space:];]*\).*/\1/p' "$REQS")"
[[ -n "$AIPERF_VERSION" ]] || die "no exact 'aiperf==' pin in $REQS"

venv_ok() {
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(file_hash "$REQS")" ]] || return 1
  "$VENV/bin/python" - "$AIPERF_VERSION" >/dev/null 2>&1 <<'PY'
import importlib.metadata, importlib.util, sys
sys.exit(0 if importlib.metadata.version("aiperf") == sys.argv[1] and importlib.util.find_spec("aiperf") else 1)
PY
}

if venv_ok; then
  log "aiperf==$AIPERF_VERSION already in $VENV"
else
  PYTHON="${PYTHON:-python3}"
  command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found; AIPerf needs Python 3.11-3.13"
  "$PYTHON" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 14) else 1)' \
    || die "AIPerf $AIPERF_VERSION needs Python >= 3.11, < 3.14 (set PYTHON=...)"
  if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "creating virtualenv $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2 || die "could not create a virtualenv (Debian: apt-get install python3-venv)"
  fi
  rm -f "$STAMP"
  log "installing aiperf==$AIPERF_VERSION (+ pinned dependencies, about 1.2 GB) into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$REQS" >&2
  "$VENV/bin/python" -m pip check >/dev/null || die "inconsistent dependencies in $VENV"
  have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("aiperf"))')
  [[ "$have" == "$AIPERF_VERSION" ]] || die "aiperf $have installed, want $AIPERF_VERSION"
  file_hash "$REQS" >"$STAMP"
fi

builder_hash="$(cat "$SCRIPT_DIR/aiperf_tokenizer.py" "$STAMP" | sha256sum | cut -d' ' -f1)"
if [[ -f "$TOK_STAMP" && "$(cat "$TOK_STAMP")" == "$builder_hash" && -f "$TOKENIZER/tokenizer.json" ]]; then
  log "tokenizer already in $TOKENIZER"
else
  log "building the word-level tokenizer in $TOKENIZER"
  rm -rf "$TOKENIZER"
  "$VENV/bin/python" "$SCRIPT_DIR/aiperf_tokenizer.py" "$TOKENIZER"
  echo "$builder_hash" >"$TOK_STAMP"
fi

printf 'AIPERF=%q\n' "$VENV/bin/aiperf"
printf 'AIPERF_TOKENIZER=%q\n' "$TOKENIZER"
