#!/usr/bin/env bash
# Throttle benchmark across the provider zoo (issue 20; docs/throttle.md, "Benchmark"). For every
# zoo shape (crates/docsfab-sim/scenarios/zoo/*.yaml) and every client, against a fresh
# `docsfab sim serve` of that shape: one request answering the module list, then N instances
# (default 120) at concurrency 8, each one request answered after 200 ms. 429s and requests are
# read from the simulator's request log. Not run in CI. It installs pinned LiteLLM and openai into
# a venv under target/bench-throttle/venv (PyPI); everything else is offline on loopback.
#
#   scripts/bench-throttle/run.sh                 # every shape x every client, 120 instances
#   scripts/bench-throttle/run.sh --quick         # 40 instances
#   SHAPES="burst1-openai no-headers" CASES="shared off" scripts/bench-throttle/run.sh
#
# Clients (CASES, in this order by default):
#   shared  one `docsfab run`, forEach of N at concurrency 8, `throttle: shared`
#   off     the same with `throttle: off`
#   openai  the openai SDK (AsyncOpenAI, max_retries=10), 8 calls at a time
#   pacer   a client told the true capacity plus 1 % that spaces its sends (peers.py)
#   procs4  4 `docsfab run`s at once on one DOCSFAB_HOME, N/4 instances each at concurrency 2
#   serve2  2 `docsfab serve --jobs 1` workers on one fresh PostgreSQL database, one run of N/2
#           instances at concurrency 4 submitted to each over POST /api/runs
#   litellm LiteLLM's Router, one deployment, every setting at its default
# Every docsfab host.yaml says `maxConcurrentRequests: 8`.
#
# Settings (environment): SHAPES, CASES, INSTANCES (120; --quick: 40), CONCURRENCY (8),
# JOBS (1: cases at once, each with its own simulator, home and database; the figures are
# dominated by the provider's capacity, so JOBS=4 fits every shape x client in about 25 minutes
# on two cores), TIME_SCALE (1) and TIME_SCALES ("shape=T ..." per shape): simulated seconds
# per real second. Beware: the simulator's `limit` headers stay per *simulated* minute, so under
# a timeScale a client that reads them (docsfab) is told a rate T times too low; keep 1 for the
# shapes with headers. OUT (results directory, default target/bench-throttle/results-TIME), DOCSFAB_BIN
# (default: `cargo build --release -p docsfab` of this tree), PG_ADMIN (a PostgreSQL URL whose
# role may create databases; default postgres://postgres@127.0.0.1:55432/postgres).
# A case is stopped after 4 x its floor + 60 s (zoo.py timeout) and reported as timed out.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
zoo=$root/crates/docsfab-sim/scenarios/zoo
LITELLM_VERSION=1.110.2
OPENAI_VERSION=3.57.0 # the openai that litellm 1.110.2 resolves to; pinned so both stay fixed
INSTANCES=${INSTANCES:-120}
for arg in "$@"; do
  case $arg in
    --quick) INSTANCES=40 ;;
    *) echo "unknown argument $arg (only --quick)" >&2; exit 2 ;;
  esac
done
ALL_SHAPES="burst1-openai burstN-openai burst1-anthropic retry-after-ms retry-after-none prompt-tokens no-headers outside-client"
SHAPES=${SHAPES:-$ALL_SHAPES}
CASES=${CASES:-"shared off openai pacer procs4 serve2 litellm"}
CONCURRENCY=${CONCURRENCY:-8}
TIME_SCALE=${TIME_SCALE:-1}
export JOBS=${JOBS:-1}
TIME_SCALES=${TIME_SCALES:-}
PG_ADMIN=${PG_ADMIN:-postgres://postgres@127.0.0.1:55432/postgres}
OUT=${OUT:-$root/target/bench-throttle/results-$(date -u +%Y%m%dT%H%M%SZ)}
# Absolute: the cases run from other directories.
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
VENV=$root/target/bench-throttle/venv
KEY=benchkey-5d2e8a71c04f93b6 # a made-up key: the simulator does not check it
mkdir -p "$OUT"
(( INSTANCES % 4 == 0 )) || { echo "INSTANCES must be a multiple of 4 (procs4 and serve2 split it)" >&2; exit 2; }

if [[ -z "${DOCSFAB_BIN:-}" ]]; then
  echo "building docsfab (release)"
  (cd "$root" && cargo build -q --release -p docsfab)
  DOCSFAB_BIN=${CARGO_TARGET_DIR:-$root/target}/release/docsfab
  dirty=$(git -C "$root" status --porcelain -- crates Cargo.toml Cargo.lock | head -1)
  built_from="release build of $(git -C "$root" rev-parse --short HEAD)${dirty:+ (with uncommitted changes)}"
else
  built_from=$DOCSFAB_BIN
fi
[[ -x "$DOCSFAB_BIN" ]] || { echo "no docsfab binary at $DOCSFAB_BIN (set DOCSFAB_BIN)" >&2; exit 2; }

if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(not (m.version('litellm') == '$LITELLM_VERSION' and m.version('openai') == '$OPENAI_VERSION'))" 2>/dev/null; then
  echo "installing litellm==$LITELLM_VERSION openai==$OPENAI_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-cache-dir "litellm==$LITELLM_VERSION" "openai==$OPENAI_VERSION"
fi

scale_of() { # SHAPE: its time scale
  local s
  for s in $TIME_SCALES; do [[ "${s%%=*}" == "$1" ]] && { echo "${s#*=}"; return; }; done
  echo "$TIME_SCALE"
}

# A bench scenario per shape, and a private copy of the workspace.
for shape in $SHAPES; do
  [[ -f "$zoo/$shape.yaml" ]] || { echo "no zoo shape $shape (shapes: $ALL_SHAPES)" >&2; exit 2; }
  python3 "$here/zoo.py" scenario "$zoo/$shape.yaml" "$OUT/$shape.scenario.yaml" --instances "$INSTANCES" --time-scale "$(scale_of "$shape")"
done
[[ -d "$OUT/workspace" ]] || cp -r "$here/workspace" "$OUT/workspace"
for c in fanout fanout-quarter fanout-half; do
  python3 "$here/zoo.py" composition "$here/composition-$c.yaml" "$OUT/composition-$c.yaml"
done
python3 - "$OUT/meta.json" "$zoo" "$SHAPES" "$CASES" "$INSTANCES" "$CONCURRENCY" "$LITELLM_VERSION" "$OPENAI_VERSION" \
  "$("$DOCSFAB_BIN" --version) ($built_from)" "$*" "$here" "$(for s in $SHAPES; do echo -n "$s=$(scale_of "$s") "; done)" <<'EOF'
import json, os, sys, time
out, zoo, shapes, cases, n, conc, ll, oa, df, argv, here, scales = sys.argv[1:]
sys.path.insert(0, here)
import zoo as z
scale = dict(s.split("=") for s in scales.split())
command = ("scripts/bench-throttle/run.sh " + argv).strip()
sel = " ".join(f"{k}={os.environ[k]!r}" for k in ("SHAPES", "CASES", "JOBS", "TIME_SCALE", "TIME_SCALES") if os.environ.get(k))
meta = {"shapes": {s: z.capacity(f"{zoo}/{s}.yaml", float(scale[s])) for s in shapes.split()},
        "cases": cases.split(), "instances": int(n), "concurrency": int(conc), "jobs": int(os.environ["JOBS"]),
        "versions": {"litellm": ll, "openai": oa, "docsfab": df, "python": sys.version.split()[0]},
        "command": command, "invocations": [(sel + " " + command).strip()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
if os.path.exists(out):  # a later run into the same OUT adds its shapes and cases to the table
    old = json.load(open(out))
    if old.get("instances") != meta["instances"] or old["versions"] != meta["versions"]:
        sys.exit(f"{out}: made with other instances or versions; use another OUT")
    order = "shared off openai pacer procs4 serve2 litellm".split()
    cases_all = set(old["cases"]) | set(meta["cases"])
    meta["cases"] = [c for c in order if c in cases_all] + sorted(cases_all - set(order))
    meta["shapes"] = {**old["shapes"], **meta["shapes"]}
    meta["invocations"] = old.get("invocations", [old.get("command")]) + meta["invocations"]
    meta["started"] = old["started"]
json.dump(meta, open(out, "w"), indent=2)
EOF

SIM_PID=""

start_sim() { # NAME SHAPE: a fresh simulator logging to $OUT/NAME.sim.jsonl; sets SIM_URL
  "$DOCSFAB_BIN" sim serve --listen 127.0.0.1:0 --scenario "$OUT/$2.scenario.yaml" --log "$OUT/$1.sim.jsonl" \
    >"$OUT/$1.sim.out" 2>"$OUT/$1.sim.err" &
  SIM_PID=$!
  for _ in $(seq 100); do grep -q '^listening on ' "$OUT/$1.sim.out" 2>/dev/null && break; sleep 0.1; done
  SIM_URL=$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$OUT/$1.sim.out")
  [[ -n "$SIM_URL" ]] || { echo "the simulator did not start:" >&2; cat "$OUT/$1.sim.err" >&2; exit 1; }
}
stop_sim() { kill -TERM "$SIM_PID" 2>/dev/null || true; wait "$SIM_PID" 2>/dev/null || true; SIM_PID=""; }

make_home() { # NAME THROTTLE: a fresh DOCSFAB_HOME whose provider `bench` is the simulator
  local home=$OUT/home-$1
  rm -rf "$home" "$home"-w*
  mkdir -p "$home"
  printf 'providers:\n  bench:\n    api: openai-chat\n    baseUrl: %s\n    apiKeyEnv: BENCH_THROTTLE_KEY\n    model: bench-model\n    maxConcurrentRequests: 8\n    throttle: %s\n' \
    "$SIM_URL" "$2" >"$home/host.yaml"
  echo "$home"
}

fail_record() { # NAME SENTENCE: the case could not run
  python3 -c 'import json, sys; json.dump({"error": sys.argv[2]}, open(sys.argv[1], "w"))' "$OUT/$1.json" "$2"
  echo "   failed to run: $2"
}

run_case() { # CASE SHAPE (in a subshell of its own: its simulator dies with it)
  local case=$1 shape=$2 name=$2.$1 limit home
  trap '[[ -n "$SIM_PID" ]] && kill "$SIM_PID" 2>/dev/null || true' EXIT
  limit=$(python3 "$here/zoo.py" timeout "$zoo/$shape.yaml" --instances "$INSTANCES" --time-scale "$(scale_of "$shape")")
  echo "== $shape / $case started $(date -u +%H:%M:%S) (stopped after ${limit} s)"
  start_sim "$name" "$shape"
  local -a guard=(timeout --kill-after=10 $((limit + 120)))
  case $case in
    shared | off | procs4 | serve2)
      home=$(make_home "$name" "$([[ $case == off ]] && echo off || echo shared)")
      local composition=$OUT/composition-fanout.yaml mode=fanout extra=(--processes 1)
      [[ $case == procs4 ]] && composition=$OUT/composition-fanout-quarter.yaml extra=(--processes 4)
      [[ $case == serve2 ]] && composition=$OUT/composition-fanout-half.yaml mode=serve extra=(--workers 2 --pg-admin "$PG_ADMIN")
      DOCSFAB_HOME=$home BENCH_THROTTLE_KEY=$KEY "${guard[@]}" python3 "$here/docsfab_cases.py" "$mode" "$DOCSFAB_BIN" \
        "$composition" "$OUT/workspace" "$OUT/$name.json" --instances "$INSTANCES" --timeout "$limit" "${extra[@]}" \
        2>"$OUT/$name.err" || fail_record "$name" "the harness failed (exit $?); see $name.err" ;;
    openai | litellm | pacer)
      BENCH_THROTTLE_KEY=$KEY LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False "${guard[@]}" \
        "$VENV/bin/python" "$here/peers.py" "$case" "$SIM_URL" "$OUT/$name.json" --instances "$INSTANCES" \
        --concurrency "$CONCURRENCY" --timeout "$limit" \
        --capacity "$(python3 "$here/zoo.py" capacity "$zoo/$shape.yaml" --time-scale "$(scale_of "$shape")")" \
        2>"$OUT/$name.err" || fail_record "$name" "the harness failed (exit $?); see $name.err" ;;
    *) echo "unknown case $case (cases: shared off openai pacer procs4 serve2 litellm)" >&2; exit 2 ;;
  esac
  stop_sim
  echo "== $shape / $case ended $(date -u +%H:%M:%S)"
}

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
for case in $CASES; do
  for shape in $SHAPES; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
    (run_case "$case" "$shape") >"$OUT/$shape.$case.log" 2>&1 &
    pids+=($!)
    echo "$shape / $case: $OUT/$shape.$case.log ($(date -u +%H:%M:%S))"
  done
done
wait || true
cat "$OUT"/*.log | grep -v '^==' || true

python3 - "$OUT/meta.json" <<'EOF'
import json, os, sys, time
meta = json.load(open(sys.argv[1])); meta["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
json.dump(meta, open(sys.argv[1], "w"), indent=2)
EOF
python3 "$here/summarize.py" "$OUT" | tee "$OUT/summary.md"
python3 "$here/summarize.py" "$OUT" --json >"$OUT/summary.json"
echo "results in $OUT"
