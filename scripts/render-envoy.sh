#!/usr/bin/env bash
# Render an Envoy config from envoy/ by filling its ${NAME} placeholders from
# the variables of the same name.
#
# Usage: LISTEN_PORT=10000 ADMIN_PORT=9901 EXTPROC_PORT=50051 \
#        POOL_A_PORT=8001 POOL_B_PORT=8002 JWKS_FILE=envoy/demo-jwks.json \
#        scripts/render-envoy.sh envoy/demo.yaml > envoy.yaml
# Unset variables take the defaults above. envoy/pool-credential.yaml also
# needs POOL_B_CREDENTIAL_SDS and POOL_B_HOST (POOL_B_ADDRESS defaults to
# POOL_B_HOST, POOL_B_CA to the system CAs); envoy/inference-pool.yaml and
# envoy/inference-pool-sla.yaml EPP_PORT (default 9002). Unfilled
# placeholders are an error.
set -euo pipefail
src=${1:?usage: render-envoy.sh FILE}
: "${LISTEN_PORT:=10000}" "${ADMIN_PORT:=9901}" "${EXTPROC_PORT:=50051}" "${POOL_A_PORT:=8001}" "${POOL_B_PORT:=8002}"
: "${XDS_PORT:=18000}" "${OTLP_PORT:=4317}" "${EPP_PORT:=9002}"
: "${JWKS_FILE:=$(cd "$(dirname "$0")/.." && pwd)/envoy/demo-jwks.json}"
: "${POOL_B_CA:=/etc/ssl/certs/ca-certificates.crt}"
if [[ -n ${POOL_B_HOST:-} ]]; then : "${POOL_B_ADDRESS:=$POOL_B_HOST}"; fi
out=$(<"$src")
for name in $(grep -o '\${[A-Z_][A-Z0-9_]*}' <<<"$out" | tr -d '${}' | sort -u); do
  # Quoted replacement: a value's "&" stays literal.
  if [[ -v $name ]]; then out=${out//"\${$name}"/"${!name}"}; fi
done
if grep -q '\${' <<<"$out"; then
  echo "render-envoy: unfilled placeholder in $src: $(grep -o '\${[A-Z_]*}' <<<"$out" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$out"
