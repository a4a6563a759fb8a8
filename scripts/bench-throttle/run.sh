#!/usr/bin/env bash
# Throttle benchmark for docs/throttle.md ("Benchmark") (issue 12): 40 agents x 3 turns (120
# requests) at concurrency 8 against `docsfab sim serve` with a capacity of 120 requests a
# minute, burst 2 (so 120 requests need about 60 s), a fresh simulator per case. The 429s and
# request counts are read from the simulator's request log. Not run in CI. It installs pinned
# LiteLLM and openai into a venv under target/bench-throttle/venv (PyPI); everything else is
# offline on loopback.
#
#   scripts/bench-throttle/run.sh            # every case, about a minute or more each
#   scripts/bench-throttle/run.sh --tiny     # timeScale 20: checks the script in seconds, no figures
#   CASES="standin e" scripts/bench-throttle/run.sh
#
# Cases: standin (today's docsfab: 40 one-agent `docsfab run` processes, 8 at a time),
# a / b / c (docsfab fan-out with the shared throttle, with `throttle: off`, and 4 processes x 10
# instances on one DOCSFAB_HOME; each is skipped, with docsfab's own sentence, while this
# docsfab refuses forEach or `throttle`), d1 / d1s / d2 (LiteLLM Router with rpm 120 under the
# strategy that enforces it / under the default strategy / with no rpm), e (the openai SDK with
# its default retries).
# Settings (environment): CASES, OUT (results directory, default
# target/bench-throttle/results-TIME), DOCSFAB_BIN (skip the build; default: a debug build of
# this tree), TASKS (40), CONCURRENCY (8), TIME_SCALE (1; --tiny sets 20).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
LITELLM_VERSION=1.110.2
OPENAI_VERSION=3.57.0 # the openai that litellm 1.110.2 resolves to; pinned so both stay fixed
TIME_SCALE=${TIME_SCALE:-1}
if [[ "${1:-}" == "--tiny" ]]; then TIME_SCALE=20; fi
CASES=${CASES:-"standin a b c d1 d1s d2 e"}
TASKS=${TASKS:-40}
CONCURRENCY=${CONCURRENCY:-8}
OUT=${OUT:-$root/target/bench-throttle/results-$(date -u +%Y%m%dT%H%M%SZ)}
VENV=$root/target/bench-throttle/venv
KEY=benchkey-5d2e8a71c04f93b6 # a made-up key: the simulator does not check it
mkdir -p "$OUT"

if [[ -z "${DOCSFAB_BIN:-}" ]]; then
  echo "building docsfab (debug)"
  (cd "$root" && CARGO_INCREMENTAL=0 cargo build -q -p docsfab)
  DOCSFAB_BIN=$root/target/debug/docsfab
  built_from="debug build of $(git -C "$root" rev-parse --short HEAD)"
else
  built_from=$DOCSFAB_BIN
fi
[[ -x "$DOCSFAB_BIN" ]] || { echo "no docsfab binary at $DOCSFAB_BIN (set DOCSFAB_BIN)" >&2; exit 2; }

if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(not (m.version('litellm') == '$LITELLM_VERSION' and m.version('openai') == '$OPENAI_VERSION'))" 2>/dev/null; then
  echo "installing litellm==$LITELLM_VERSION openai==$OPENAI_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-cache-dir "litellm==$LITELLM_VERSION" "openai==$OPENAI_VERSION"
fi

# The scenario (with the time scale when not 1) and a private copy of the workspace.
scenario=$OUT/scenario.yaml
if [[ "$TIME_SCALE" == 1 ]]; then cp "$here/scenario.yaml" "$scenario"; else
  sed "s/^  burst: 2\$/  burst: 2\n  timeScale: $TIME_SCALE/" "$here/scenario.yaml" >"$scenario"
fi
cp -r "$here/workspace" "$OUT/workspace"
python3 - "$OUT/meta.json" "$TIME_SCALE" "$TASKS" "$CONCURRENCY" "$CASES" "$LITELLM_VERSION" "$OPENAI_VERSION" \
  "$("$DOCSFAB_BIN" --version) ($built_from)" "$*" <<'EOF'
import json, sys
out, scale, tasks, conc, cases, ll, oa, df, argv = sys.argv[1:]
meta = {"capacity": {"requestsPerMinute": 120, "burst": 2, "timeScale": float(scale)},
        "tasks": int(tasks), "turns": 3, "concurrency": int(conc), "cases": cases.split(),
        "versions": {"litellm": ll, "openai": oa, "docsfab": df},
        "command": ("scripts/bench-throttle/run.sh " + argv).strip()}
json.dump(meta, open(out, "w"), indent=2)
EOF

SIM_PID=""
cleanup() { [[ -n "$SIM_PID" ]] && kill "$SIM_PID" 2>/dev/null || true; }
trap cleanup EXIT

start_sim() { # CASE: a fresh simulator logging to $OUT/CASE.sim.jsonl; sets SIM_URL
  "$DOCSFAB_BIN" sim serve --listen 127.0.0.1:0 --scenario "$scenario" --log "$OUT/$1.sim.jsonl" \
    >"$OUT/$1.sim.out" 2>"$OUT/$1.sim.err" &
  SIM_PID=$!
  for _ in $(seq 100); do grep -q '^listening on ' "$OUT/$1.sim.out" 2>/dev/null && break; sleep 0.1; done
  SIM_URL=$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$OUT/$1.sim.out")
  [[ -n "$SIM_URL" ]] || { echo "the simulator did not start:" >&2; cat "$OUT/$1.sim.err" >&2; exit 1; }
}
stop_sim() { kill -TERM "$SIM_PID" 2>/dev/null || true; wait "$SIM_PID" 2>/dev/null || true; SIM_PID=""; }

make_home() { # CASE [THROTTLE]: a fresh DOCSFAB_HOME whose provider `bench` is the simulator
  local home=$OUT/home-$1
  mkdir -p "$home"
  printf 'providers:\n  bench:\n    api: openai-chat\n    baseUrl: %s\n    apiKeyEnv: BENCH_THROTTLE_KEY\n    model: bench-model\n' \
    "$SIM_URL" >"$home/host.yaml"
  if [[ -n "${2:-}" ]]; then printf '    throttle: %s\n' "$2" >>"$home/host.yaml"; fi
  echo "$home"
}

skip() { # CASE SENTENCE
  python3 -c 'import json, sys; json.dump({"skipped": sys.argv[2]}, open(sys.argv[1], "w"))' "$OUT/$1.json" "$2"
  echo "   skipped: $2"
}

# docsfab_fanout CASE COMPOSITION PROCESSES THROTTLE: PROCESSES `docsfab run`s of a forEach
# composition at once on one DOCSFAB_HOME; skipped while this docsfab refuses the composition or
# host.yaml (doctor runs the same checks as run). Figures: docsfab_cases.py and the sim log.
docsfab_fanout() {
  local case=$1 composition=$2 processes=$3 throttle=$4 home refusal
  start_sim "$case"
  home=$(make_home "$case" "$throttle")
  if ! refusal=$(DOCSFAB_HOME=$home BENCH_THROTTLE_KEY=$KEY "$DOCSFAB_BIN" doctor --composition "$composition" 2>&1 >/dev/null); then
    stop_sim
    skip "$case" "$(echo "$refusal" | head -1)"
    return
  fi
  DOCSFAB_HOME=$home BENCH_THROTTLE_KEY=$KEY python3 "$here/docsfab_cases.py" fanout "$DOCSFAB_BIN" "$composition" \
    "$OUT/workspace" "$OUT/$case.json" --processes "$processes" --instances "$TASKS"
  stop_sim
}

peer() { # CASE PEERS_CASE
  start_sim "$1"
  BENCH_THROTTLE_KEY=$KEY LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False \
    "$VENV/bin/python" "$here/peers.py" "$2" "$SIM_URL" "$OUT/$1.json" --tasks "$TASKS" --concurrency "$CONCURRENCY" \
    2>"$OUT/$1.err"
  stop_sim
}

for case in $CASES; do
  echo "== $case ($(date -u +%H:%M:%S))"
  case $case in
    standin)
      start_sim standin
      home=$(make_home standin)
      DOCSFAB_HOME=$home BENCH_THROTTLE_KEY=$KEY python3 "$here/docsfab_cases.py" standin "$DOCSFAB_BIN" \
        "$here/composition-standin.yaml" "$OUT/workspace" "$OUT/standin.json" --runs "$TASKS" --concurrency "$CONCURRENCY"
      stop_sim ;;
    a) docsfab_fanout a "$here/composition-fanout.yaml" 1 shared ;;
    b) docsfab_fanout b "$here/composition-fanout.yaml" 1 off ;;
    c) docsfab_fanout c "$here/composition-fanout-quarter.yaml" 4 shared ;;
    d1) peer d1 litellm-rpm ;;
    d1s) peer d1s litellm-rpm-shuffle ;;
    d2) peer d2 litellm-norpm ;;
    e) peer e openai ;;
    *) echo "unknown case $case (cases: standin a b c d1 d1s d2 e)" >&2; exit 2 ;;
  esac
done

python3 "$here/summarize.py" "$OUT" | tee "$OUT/summary.md"
python3 "$here/summarize.py" "$OUT" --json >"$OUT/summary.json"
echo "results in $OUT"
