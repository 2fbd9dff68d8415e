#!/usr/bin/env bash
# The infergate demo: real Envoy + infergate + two mock GPU pools, a short
# streaming load through the gateway and directly, and a side-by-side report;
# then ext_proc and the dynamic module (make module) side by side.
# Non-interactive; stops everything it started. Used by `make demo` and
# `make bench` (DEMO_REQUESTS / DEMO_CONCURRENCY make the load bigger).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${DEMO_REQUESTS:-60}
CONCURRENCY=${DEMO_CONCURRENCY:-4}
MAX_TOKENS=${DEMO_MAX_TOKENS:-32}
WORK=$(mktemp -d -t infergate-demo.XXXXXX)
PIDS=()

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
note() { printf '   %s\n' "$*"; }

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${DEMO_KEEP:-}" ] && trap 'for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done; echo "kept $WORK"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for() { # URL [what]
  for _ in $(seq 1 150); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "demo: $2 did not come up ($1); logs in $WORK" >&2
  tail -n 20 "$WORK"/*.log >&2 || true
  exit 1
}

say "Installing what is missing"
[ -x bin/infergate ] || make --no-print-directory build
[ -x bin/infergate-bench ] || make --no-print-directory build-bench
ENVOY_BIN=$(scripts/install-envoy.sh)
note "envoy:     $("$ENVOY_BIN" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*/[A-Za-z]*' | head -1) ($ENVOY_BIN)"
note "infergate: $(bin/infergate version)"

export LISTEN_PORT=$(free_port) ADMIN_PORT=$(free_port) EXTPROC_PORT=$(free_port) \
       POOL_A_PORT=$(free_port) POOL_B_PORT=$(free_port)
INFERGATE_ADMIN=$(free_port)

# API keys (hashes only) for the example policies' tenants, and the models the
# pools serve: Envoy routes pool-a and pool-b by name, any other to both.
hash_key() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/keys.yaml" <<KEYS
keys:
- {id: acme-demo, sha256: $(hash_key sk-demo-acme), tenant: acme}        # premium tier
- {id: initech-demo, sha256: $(hash_key sk-demo-initech), tenant: initech} # free tier
KEYS
cat >"$WORK/infergate.yaml" <<CONFIG
admin: {debug: {enabled: true}}  # /debug/requests; the admin port is on loopback
auth: {keys: $WORK/keys.yaml}
ratelimit: {embedded: {path: $WORK/ledger.db}} # budgets, seals and spend: kept across the restarts below
policy: {dir: $PWD/policies}
models: [pool-a, pool-b, llama-3.1-8b-instruct, llama-3.1-70b-instruct, bge-m3]
CONFIG

say "Starting two mock GPU pools, infergate and Envoy"
bin/infergate-bench mock --listen 127.0.0.1:$POOL_A_PORT --ttft 120ms --itl 15ms >"$WORK/pool-a.log" 2>&1 & PIDS+=($!)
bin/infergate-bench mock --listen 127.0.0.1:$POOL_B_PORT --ttft 60ms --itl 8ms >"$WORK/pool-b.log" 2>&1 & PIDS+=($!)
bin/infergate serve --config "$WORK/infergate.yaml" --extproc-listen 127.0.0.1:$EXTPROC_PORT --admin-listen 127.0.0.1:$INFERGATE_ADMIN \
  >"$WORK/requests.log" 2>"$WORK/infergate.log" & PIDS+=($!)
scripts/render-envoy.sh envoy/demo.yaml >"$WORK/envoy.yaml"
"$ENVOY_BIN" -c "$WORK/envoy.yaml" --disable-hot-restart -l warning >"$WORK/envoy.log" 2>&1 & PIDS+=($!)
wait_for "http://127.0.0.1:$POOL_A_PORT/healthz" "pool-a"
wait_for "http://127.0.0.1:$POOL_B_PORT/healthz" "pool-b"
wait_for "http://127.0.0.1:$INFERGATE_ADMIN/readyz" "infergate"
wait_for "http://127.0.0.1:$ADMIN_PORT/ready" "envoy"
note "pool-a  (mock: TTFT 120ms, ITL 15ms)  http://127.0.0.1:$POOL_A_PORT"
note "pool-b  (mock: TTFT  60ms, ITL  8ms)  http://127.0.0.1:$POOL_B_PORT"
note "infergate ext_proc 127.0.0.1:$EXTPROC_PORT, admin http://127.0.0.1:$INFERGATE_ADMIN/metrics and /debug/requests"
note "envoy   http://127.0.0.1:$LISTEN_PORT  (admin http://127.0.0.1:$ADMIN_PORT)"

say "One request per API through the gateway (premium key, the example policies in policies/)"
python3 - "http://127.0.0.1:$LISTEN_PORT" sk-demo-acme sk-demo-initech "$WORK/requests.log" <<'PY'
import http.client, json, sys, time, urllib.parse
base, key, free_key, log = sys.argv[1:5]
url = urllib.parse.urlsplit(base)
msgs = [{"role": "user", "content": "Say hello to Envoy"}]
calls = [  # API, path, body; the model is pool-b (TTFT 60 ms, ITL 8 ms)
    ("chat", "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "stream": True}),
    ("completions", "/v1/completions", {"prompt": "Say hello to Envoy", "max_tokens": 8, "stream": True}),
    ("embeddings", "/v1/embeddings", {"input": "Say hello to Envoy"}),
    ("responses", "/v1/responses", {"input": "Say hello to Envoy", "max_output_tokens": 8, "stream": True}),
    ("messages", "/v1/messages", {"messages": msgs, "max_tokens": 8, "stream": True}),
    ("count_tokens", "/v1/messages/count_tokens", {"messages": msgs}),
]

def first_content(d):  # does this stream event carry generated text? (each API has its own)
    c = (d.get("choices") or [{}])[0]
    return bool((c.get("delta") or {}).get("content") or c.get("text")) or \
        d.get("type") in ("response.output_text.delta", "content_block_delta")

def call(method, path, body, k):
    conn = http.client.HTTPConnection(url.hostname, url.port)
    start = time.perf_counter()
    conn.request(method, path, body=json.dumps(body) if body else None,
                 headers={"authorization": "Bearer " + k, "content-type": "application/json"})
    return conn.getresponse(), start

def stamp(rid):  # infergate's record of the request, written when its response ends
    for _ in range(20):
        for line in open(log):
            if '"request_id":"%s"' % rid in line:
                return json.loads(line)
        time.sleep(0.05)
    return {}

ms = lambda v: "%.1f ms" % v if v else "-"
print("   %-13s %-32s %s  %10s  %10s   %s" % ("API", "request", "status", "TTFT", "stamped", "tokens in/out (stamped)"))
for api, path, body in calls:
    body["model"] = "pool-b"
    resp, start = call("POST", path, body, key)
    ttft = None
    for line in resp:  # an SSE stream, or one JSON body
        line = line.decode().strip()
        if ttft is None and line.startswith("data: {") and first_content(json.loads(line[6:])):
            ttft = (time.perf_counter() - start) * 1000
    st = stamp(resp.getheader("x-request-id"))
    print("   %-13s %-32s %d     %10s  %10s   %s / %s" % (api, "POST " + path, resp.status, ms(ttft), ms(st.get("ttft_ms")),
          st.get("prompt_tokens", "?"), st.get("completion_tokens", "?")))
for who, k in (("premium", key), ("free", free_key)):
    resp, _ = call("GET", "/v1/models", None, k)
    ids = [m["id"] for m in json.loads(resp.read())["data"]]
    print("   %-13s %-32s %d     %s tier: %s" % ("models", "GET /v1/models", resp.status, who, ", ".join(ids)))
PY
note "TTFT: to the first generated text, as this client saw it and as infergate's meter stamped it (Envoy's side)"
note "GET /v1/models is infergate's own answer: the configured models (models: in its config) the caller's tier may call"

say "One streamed request through the gateway (model pool-a)"
note "(infergate restarted with its default configuration, /debug pages on: no keys, no policies)"
kill "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true
printf 'admin: {debug: {enabled: true}}\nratelimit: {embedded: {path: %s}}\n' "$WORK/ledger.db" >"$WORK/debug.yaml"
bin/infergate serve --config "$WORK/debug.yaml" --extproc-listen 127.0.0.1:$EXTPROC_PORT --admin-listen 127.0.0.1:$INFERGATE_ADMIN \
  >"$WORK/requests.log" 2>"$WORK/infergate.log" & PIDS[2]=$!
wait_for "http://127.0.0.1:$INFERGATE_ADMIN/readyz" "infergate"
curl -sN -D "$WORK/headers" http://127.0.0.1:$LISTEN_PORT/v1/chat/completions \
  -H 'content-type: application/json' \
  -d '{"model":"pool-a","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"Say hello to Envoy"}]}' \
  | sed -n 's/^data: //p' | python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line == "[DONE]": print("   [DONE]"); continue
    c = json.loads(line)
    if c.get("usage"): print("   usage:", c["usage"]); continue
    d = c["choices"][0].get("delta", {})
    print("   chunk:", json.dumps(d))'
RID=$(tr -d '\r' <"$WORK/headers" | awk -F': ' 'tolower($1)=="x-request-id"{print $2}')

say "A bad request never reaches a pool"
curl -s http://127.0.0.1:$LISTEN_PORT/v1/chat/completions -H 'content-type: application/json' \
  -d '{"messages":[]}' -w '   HTTP %{http_code}\n' | sed 's/^{/   {/'

say "Load: $REQUESTS streamed requests per target after 8 of warm-up, $CONCURRENCY users per target, $MAX_TOKENS tokens each"
note "direct = pool-a itself; gateway = Envoy + infergate in front of pool-a"
note "each request goes to both, back to back in alternating order: the paired difference is what the gateway adds"
bin/infergate-bench bench --target direct=http://127.0.0.1:$POOL_A_PORT --target gateway=http://127.0.0.1:$LISTEN_PORT \
  --model pool-a --concurrency "$CONCURRENCY" --requests "$REQUESTS" --warmup 8 --output-tokens "$MAX_TOKENS" \
  --join http://127.0.0.1:$INFERGATE_ADMIN --json "$WORK/bench.json" --html "$WORK/bench.html"
note "HTML report: $WORK/bench.html (DEMO_KEEP=1 make demo keeps it)"
note "every request's waterfall while it runs: http://127.0.0.1:$INFERGATE_ADMIN/debug/requests"

say "The same gate and meter inside Envoy: the dynamic module, side by side with ext_proc"
note "building bin/libinfergate.so (make module) and a second Envoy that loads it: no infergate process on its path"
make --no-print-directory module >"$WORK/module-build.log" 2>&1 || { tail -n 20 "$WORK/module-build.log" >&2; exit 1; }
MODULE_PORT=$(free_port) MODULE_ENVOY_ADMIN=$(free_port) MODULE_ADMIN=$(free_port)
# The module reads the configuration serve runs now, with its own ledger
# file (one process per file) and its own admin port, served from Envoy.
sed -e "s|$WORK/ledger.db|$WORK/module-ledger.db|" -e "s|^admin: {|admin: {listen: \"127.0.0.1:$MODULE_ADMIN\", |" \
  "$WORK/debug.yaml" >"$WORK/module.yaml"
LISTEN_PORT=$MODULE_PORT ADMIN_PORT=$MODULE_ENVOY_ADMIN INFERGATE_CONFIG=$WORK/module.yaml \
  scripts/render-envoy.sh envoy/snippet-module.yaml >"$WORK/envoy-module.yaml"
GODEBUG=cgocheck=0 ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$PWD/bin \
  "$ENVOY_BIN" -c "$WORK/envoy-module.yaml" --disable-hot-restart -l warning >"$WORK/module-requests.log" 2>"$WORK/envoy-module.log" & PIDS+=($!)
wait_for "http://127.0.0.1:$MODULE_ENVOY_ADMIN/ready" "envoy with the module"
wait_for "http://127.0.0.1:$MODULE_ADMIN/readyz" "the module's admin port"
note "ext_proc = Envoy + infergate serve (above); module = Envoy with infergate inside, http://127.0.0.1:$MODULE_PORT"
note "each request goes to both, back to back in alternating order: the paired difference is what the module saves"
bin/infergate-bench bench --target ext_proc=http://127.0.0.1:$LISTEN_PORT --target module=http://127.0.0.1:$MODULE_PORT \
  --model pool-a --concurrency "$CONCURRENCY" --requests "$REQUESTS" --warmup 8 --output-tokens "$MAX_TOKENS" \
  --json "$WORK/bench-module.json"
note "the module's /metrics and /debug/requests: http://127.0.0.1:$MODULE_ADMIN (its request log is Envoy's standard output)"

say "The stamp infergate recorded for the first request ($RID)"
sleep 0.2 # the meter stamps when the stream ends; give the log line a moment
grep -F "\"request_id\":\"$RID\"" "$WORK/requests.log" | python3 -c '
import json, sys
s = json.loads(sys.stdin.readline())
for k in ("request_id","model","pool","upstream","status","stream","prompt_tokens","completion_tokens","token_source",
          "ttft_ms","itl_p50_ms","itl_p95_ms","itl_max_ms","e2e_ms","gateway_ms","gate_ms","decision","complete"):
    print(f"   {k:18} {s.get(k)}")'

say "What the meter stamped across the load (from infergate's request log)"
python3 - "$WORK/requests.log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"msg":"request"' in l]
ok = [r for r in rows if r.get("decision") == "allow" and r.get("status") == 200 and r.get("stream")]
def pct(vals, q):
    vals = sorted(vals); return vals[min(len(vals)-1, max(0, round(q*len(vals))-1))] if vals else 0
for name, key in (("TTFT (ms)", "ttft_ms"), ("ITL p50 (ms)", "itl_p50_ms"), ("gate (ms)", "gate_ms")):
    v = [r[key] for r in ok]
    print(f"   {name:14} p50 {pct(v,.5):8.3f}   p95 {pct(v,.95):8.3f}   p99 {pct(v,.99):8.3f}   n={len(v)}")
print(f"   denied: {sum(1 for r in rows if r.get('decision') == 'deny')}, stamped: {len(rows)}")
PY
note "Prometheus: curl http://127.0.0.1:$INFERGATE_ADMIN/metrics | grep gen_ai_server_time_to_first_token"
curl -s http://127.0.0.1:$INFERGATE_ADMIN/metrics | grep -E '^gen_ai_server_time_to_first_token_seconds_count' | sed 's/^/   /'

say "Policies: the same gateway with API keys and the Rego policies in policies/"
kill "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true
bin/infergate validate --config "$WORK/infergate.yaml" | sed 's/^/   /'
bin/infergate serve --config "$WORK/infergate.yaml" --extproc-listen 127.0.0.1:$EXTPROC_PORT \
  --admin-listen 127.0.0.1:$INFERGATE_ADMIN >"$WORK/requests.log" 2>"$WORK/infergate.log" & PIDS[2]=$!
wait_for "http://127.0.0.1:$INFERGATE_ADMIN/readyz" "infergate with policies"
try() { # key model max_tokens what
  local auth=(); [ -n "$1" ] && auth=(-H "authorization: Bearer $1")
  curl -s -D "$WORK/h" -o "$WORK/b" "${auth[@]}" http://127.0.0.1:$LISTEN_PORT/v1/chat/completions \
    -H 'content-type: application/json' \
    -d "{\"model\":\"$2\",\"max_tokens\":$3,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
  local code; code=$(head -1 "$WORK/h" | cut -d' ' -f2)
  local detail; detail=$(python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(b["error"]["message"] if "error" in b else "tokens: %d" % b["usage"]["total_tokens"])' "$WORK/b" 2>/dev/null)
  local rl; rl=$(tr -d '\r' <"$WORK/h" | awk -F': ' 'tolower($1)=="x-ratelimit-remaining-tokens"{print "remaining tokens this minute: " $2}')
  printf '   %-44s -> %s  %s %s\n' "$4" "$code" "$detail" "${rl:+ ($rl)}"
}
try ""               llama-3.1-8b-instruct  16 "no key"
try sk-demo-initech  llama-3.1-8b-instruct  16 "free tier, small model"
try sk-demo-initech  llama-3.1-70b-instruct 16 "free tier, large model"
try sk-demo-initech  llama-3.1-8b-instruct  4096 "free tier, max_tokens over the tier's cap"
try sk-demo-acme     llama-3.1-70b-instruct 16 "premium tier, large model"
note "Keys never appear in logs; each decision is in the request log with its reason and timings."

say "SLA routing: virtual model \"llama\" on pool-a (primary) and pool-b (backup), SLA TTFT p95 200 ms"
kill "${PIDS[2]}" "${PIDS[3]}"; wait "${PIDS[2]}" "${PIDS[3]}" 2>/dev/null || true
export XDS_PORT=$(free_port)
cat >"$WORK/sla.yaml" <<CONFIG
admin: {debug: {enabled: true}}
ratelimit: {embedded: {path: $WORK/ledger.db}}
virtualModels:
- name: llama
  pools: [{cluster: pool-a, priority: 0}, {cluster: pool-b, priority: 1}]
  sla: {ttftP95: 200ms}
  tuning: {window: 3s, minSamples: 8, interval: 500ms, step: 25, cooldown: 2s, probeWeight: 2}
xds: {listen: "127.0.0.1:$XDS_PORT"}
CONFIG
bin/infergate serve --config "$WORK/sla.yaml" --extproc-listen 127.0.0.1:$EXTPROC_PORT \
  --admin-listen 127.0.0.1:$INFERGATE_ADMIN >"$WORK/requests.log" 2>"$WORK/infergate.log" & PIDS[2]=$!
wait_for "http://127.0.0.1:$INFERGATE_ADMIN/readyz" "infergate with virtual models"
scripts/render-envoy.sh envoy/sla.yaml >"$WORK/envoy-sla.yaml"
"$ENVOY_BIN" -c "$WORK/envoy-sla.yaml" --disable-hot-restart -l warning >"$WORK/envoy.log" 2>&1 & PIDS[3]=$!
wait_for "http://127.0.0.1:$ADMIN_PORT/ready" "envoy with routes over xDS"
bin/infergate-bench bench --target gateway=http://127.0.0.1:$LISTEN_PORT --model llama --concurrency 4 \
  --duration 60s --output-tokens 8 >/dev/null 2>&1 & LOAD=$!
weights() { curl -s http://127.0.0.1:$INFERGATE_ADMIN/metrics | awk -F'[ "]' '/^infergate_pool_weight/ {for (i=1;i<NF;i++) if ($i ~ /pool=$/) p=$(i+1); w[p]=$NF} END {printf "pool-a %3d%%  pool-b %3d%%", w["pool-a"], w["pool-b"]}'; }
for t in $(seq 1 22); do
  case $t in
    4)  curl -s -X POST http://127.0.0.1:$POOL_A_PORT/mock/control -d '{"ttft_ms": 600}' >/dev/null; event="<- pool-a slows down: TTFT 120 -> 600 ms" ;;
    11) curl -s -X POST http://127.0.0.1:$POOL_A_PORT/mock/control -d '{"ttft_ms": 120}' >/dev/null; event="<- pool-a recovers" ;;
    *)  event="" ;;
  esac
  printf '   t=%4.1fs  %s  %s\n' "$(echo "$t * 0.5" | bc)" "$(weights)" "$event"
  sleep 0.5
done
kill "$LOAD" 2>/dev/null || true
note "Why it moved (infergate's log, first changes each way):"
python3 - "$WORK/infergate.log" <<'PY'
import json, sys
seen = set()
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("msg") != "route weights changed":
        continue
    kind = "back" if " back to " in r["reason"] else "away"
    if kind not in seen:
        seen.add(kind)
        print("   -", r["reason"][:170])
PY
note "Each change is on http://127.0.0.1:$INFERGATE_ADMIN/debug/controller while it runs."

say "Done; everything the demo started is stopped"
