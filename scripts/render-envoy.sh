#!/usr/bin/env bash
# Render an Envoy config from envoy/ by filling its port placeholders.
#
# Usage: LISTEN_PORT=10000 ADMIN_PORT=9901 EXTPROC_PORT=50051 \
#        POOL_A_PORT=8001 POOL_B_PORT=8002 JWKS_FILE=envoy/demo-jwks.json \
#        scripts/render-envoy.sh envoy/demo.yaml > envoy.yaml
# Unset variables take the defaults above. Unknown placeholders are an error.
set -euo pipefail
src=${1:?usage: render-envoy.sh FILE}
: "${LISTEN_PORT:=10000}" "${ADMIN_PORT:=9901}" "${EXTPROC_PORT:=50051}" "${POOL_A_PORT:=8001}" "${POOL_B_PORT:=8002}"
: "${XDS_PORT:=18000}" "${OTLP_PORT:=4317}"
: "${JWKS_FILE:=$(cd "$(dirname "$0")/.." && pwd)/envoy/demo-jwks.json}"
out=$(sed -e "s/\${LISTEN_PORT}/$LISTEN_PORT/g" -e "s/\${ADMIN_PORT}/$ADMIN_PORT/g" \
  -e "s/\${EXTPROC_PORT}/$EXTPROC_PORT/g" -e "s/\${POOL_A_PORT}/$POOL_A_PORT/g" \
  -e "s/\${POOL_B_PORT}/$POOL_B_PORT/g" -e "s|\${JWKS_FILE}|$JWKS_FILE|g" \
  -e "s/\${XDS_PORT}/$XDS_PORT/g" -e "s/\${OTLP_PORT}/$OTLP_PORT/g" "$src")
if grep -q '\${' <<<"$out"; then
  echo "render-envoy: unfilled placeholder in $src: $(grep -o '\${[A-Z_]*}' <<<"$out" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$out"
