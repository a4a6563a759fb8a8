#!/usr/bin/env bash
# Route benchmark for docs/performance.md: the same streaming load sent direct to a loopback
# upstream, through `docsfab route serve` (a BEFORE and an AFTER binary), and through LiteLLM's
# proxy, side by side. Not run in CI. It installs what it needs: hey (Debian), GNU time, and
# LiteLLM in a venv under /tmp.
#
#   DOCSFAB_BEFORE=/tmp/docsfab-main DOCSFAB_AFTER=target/release/docsfab scripts/bench-route/run.sh
#   scripts/bench-route/run.sh --tiny        # a few seconds per case: checks the script, no figures
#
# Settings (environment): DURATION (per load, default 20s; --tiny: 2s), CASES ("deltas50 mb1"),
# CONCURRENCY ("1 50"), NO_LITELLM=1 to skip LiteLLM, OUT (results directory),
# ROUTE_THROTTLES ("shared off": each route binary once per host.yaml throttle mode),
# ROUTE_MAX_CONCURRENT (the providers' maxConcurrentRequests with ROUTE_THROTTLES; default 64).
# Build each binary once, in release, into the one shared target directory, e.g.
#   (cd /work/main && CARGO_INCREMENTAL=0 CARGO_TARGET_DIR=/work/release-target cargo build --release -p docsfab \
#      && cp /work/release-target/release/docsfab /tmp/docsfab-main)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
DURATION=${DURATION:-20s}
if [[ "${1:-}" == "--tiny" ]]; then DURATION=${DURATION_TINY:-2s}; fi
CASES=${CASES:-"deltas50 mb1"}
CONCURRENCY=${CONCURRENCY:-"1 50"}
AFTER=${DOCSFAB_AFTER:-$here/../../target/release/docsfab}
BEFORE=${DOCSFAB_BEFORE:-}
OUT=${OUT:-/tmp/bench-route-$(date -u +%Y%m%dT%H%M%S)}
VENV=${LITELLM_VENV:-/tmp/bench-litellm-venv}
MODEL=bench-model
KEY=benchkey-7c41e9a2d05f38b6
mkdir -p "$OUT"

need() { command -v "$1" >/dev/null 2>&1; }
need hey || { echo "installing hey (Debian)"; apt-get install -y hey >/dev/null; }
[[ -x /usr/bin/time ]] || { echo "installing GNU time"; apt-get install -y time >/dev/null; }
if [[ -z "${NO_LITELLM:-}" && ! -x "$VENV/bin/litellm" ]]; then
  echo "installing litellm[proxy] into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'litellm[proxy]'
fi
[[ -x "$AFTER" ]] || { echo "no docsfab binary at $AFTER (set DOCSFAB_AFTER)" >&2; exit 2; }

pids=()
cleanup() { for p in "${pids[@]:-}"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# start NAME CMD...: runs CMD under GNU time (peak RSS into $OUT/NAME.time), stdout to
# $OUT/NAME.out; sets STARTED to the pid of CMD itself (not of time), so it can be stopped alone.
start() {
  local name=$1; shift
  /usr/bin/time -v -o "$OUT/$name.time" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" &
  local tpid=$! child=""
  for _ in $(seq 100); do child=$(pgrep -P "$tpid" || true); [[ -n "$child" ]] && break; sleep 0.05; done
  STARTED=$child; TIME_PID=$tpid; pids+=("$child")
}
stop() { kill -TERM "$1" 2>/dev/null || true; wait "$2" 2>/dev/null || true; }
wait_line() { # FILE PATTERN: waits up to 60 s for a line matching PATTERN
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; cat "${1%.out}.err" >&2 || true; exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

request="$OUT/request.json"
printf '{"model":"%s","stream":true,"messages":[{"role":"user","content":"Say something."}]}' "$MODEL" >"$request"

# load NAME URL [HEY ARGS...]: the same load at each concurrency, after a short warm-up.
load() {
  local name=$1 url=$2; shift 2
  hey -n 20 -c 1 -m POST -T application/json -D "$request" "$@" "$url" >/dev/null
  for c in $CONCURRENCY; do
    hey -z "$DURATION" -c "$c" -m POST -T application/json -D "$request" "$@" "$url" >"$OUT/$name.c$c.hey"
  done
}

route_home() { # CASE UPSTREAM_URL [THROTTLE]: a DOCSFAB_HOME with host.yaml and a composition
  local home="$OUT/home-$1${3:+-$3}"; mkdir -p "$home"
  printf 'providers:\n  bench:\n    api: openai-chat\n    baseUrl: %s\n    apiKeyEnv: BENCH_ROUTE_KEY\n    model: %s\n' "$2" "$MODEL" >"$home/host.yaml"
  if [[ -n "${3:-}" ]]; then
    printf '    throttle: %s\n    maxConcurrentRequests: %s\n' "$3" "${ROUTE_MAX_CONCURRENT:-64}" >>"$home/host.yaml"
  fi
  printf 'name: bench\nprovider: bench\nlimits:\n  timeoutMs: 60000\n  maxTurns: 4\n  maxOutputTokens: 256\n  sourceReadBytes: 65536\nsteps:\n  - id: one\n    access: read-only\n    instructions: Answer.\n    tools: [list_files]\n    contract:\n      schema:\n        type: object\n' >"$home/composition.yaml"
  echo "$home"
}

for case in $CASES; do
  echo "== $case"
  start "$case-upstream" python3 "$here/upstream.py" "$case" "$MODEL"; up=$STARTED; up_time=$TIME_PID
  wait_line "$OUT/$case-upstream.out" listening
  upstream=$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$OUT/$case-upstream.out")
  load "$case-direct" "$upstream/chat/completions"

  # ROUTE_THROTTLES="shared off": each binary once per host.yaml `throttle:` value (with
  # maxConcurrentRequests ROUTE_MAX_CONCURRENT, default 64, so the cap is not what is measured).
  for mode in ${ROUTE_THROTTLES:-default}; do
    [[ $mode == default ]] && m="" || m=$mode
    home=$(route_home "$case" "$upstream" "$m")
    for which in before after; do
      bin=$AFTER; [[ $which == before ]] && bin=$BEFORE
      [[ -z "$bin" ]] && { echo "   (no BEFORE binary: skipped)"; continue; }
      name="$case-route-$which${m:+-$m}"
      start "$name" env DOCSFAB_HOME="$home" BENCH_ROUTE_KEY="$KEY" \
        "$bin" route serve --listen 127.0.0.1:0 --composition "$home/composition.yaml" --max-connections 256
      route=$STARTED; route_time=$TIME_PID
      wait_line "$OUT/$name.out" listening
      url=$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$OUT/$name.out")
      load "$name" "$url/chat/completions"
      stop "$route" "$route_time"
    done
  done

  if [[ -z "${NO_LITELLM:-}" ]]; then
    port=$(free_port)
    # LiteLLM refuses to start without a master key; clients then send it as a bearer token.
    master="sk-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
    printf 'model_list:\n  - model_name: %s\n    litellm_params:\n      model: openai/%s\n      api_base: %s\n      api_key: %s\ngeneral_settings:\n  master_key: %s\n' \
      "$MODEL" "$MODEL" "$upstream" "$KEY" "$master" >"$OUT/litellm-$case.yaml"
    start "$case-litellm" env LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False \
      "$VENV/bin/litellm" --config "$OUT/litellm-$case.yaml" --host 127.0.0.1 --port "$port" --num_workers 1
    ll=$STARTED; ll_time=$TIME_PID
    ready=""
    for _ in $(seq 600); do
      curl -sf "http://127.0.0.1:$port/health/liveliness" >/dev/null && { ready=1; break; }
      kill -0 "$ll" 2>/dev/null || break
      sleep 0.2
    done
    [[ -n "$ready" ]] || { echo "LiteLLM did not start:" >&2; tail -20 "$OUT/$case-litellm.err" >&2; exit 1; }
    load "$case-litellm" "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $master"
    stop "$ll" "$ll_time"
  fi
  stop "$up" "$up_time"
done

python3 "$here/summarize.py" "$OUT" | tee "$OUT/summary.md"
echo "results in $OUT"
