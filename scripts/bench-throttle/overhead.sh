#!/usr/bin/env bash
# The shared throttle's own cost on wide work (issue 25): a fan-out of N instances against an
# unlimited `docsfab sim serve` (no capacity, instant answers), with `throttle: shared` and with
# `throttle: off`, run in turn ROUNDS times; prints each mode's median wall time and the ratio.
# Not run in CI.
#
#   BENCH_DOCSFAB=target/release/docsfab scripts/bench-throttle/overhead.sh      # 200 instances, 5 rounds
#   N=50 ROUNDS=3 scripts/bench-throttle/overhead.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BENCH_DOCSFAB:-$here/../../target/release/docsfab}
N=${N:-200}
ROUNDS=${ROUNDS:-5}
CONCURRENCY=${CONCURRENCY:-16}
OUT=${OUT:-$(mktemp -d /tmp/bench-overhead.XXXXXX)}
[[ -x "$BIN" ]] || { echo "no docsfab binary at $BIN (set BENCH_DOCSFAB)" >&2; exit 2; }

modules=$(python3 -c "import json; print(json.dumps([{'name': f'm{i:03}', 'purpose': f'module {i}'} for i in range($N)]))")
cat >"$OUT/scenario.yaml" <<YAML
name: overhead
lanes:
  - contains: "List the modules"
    responses:
      - answer: {json: {modules: $modules}}
    fallback: repeat-last
responses:
  - answer: {json: {summary: "Done."}}
fallback: repeat-last
YAML
cat >"$OUT/composition.yaml" <<YAML
name: overhead
provider: bench
limits: {timeoutMs: 600000, maxTurns: 4, maxOutputTokens: 256, sourceReadBytes: 65536}
steps:
  - id: outline
    access: read-only
    instructions: 'List the modules as {"modules": [...]}.'
    tools: [list_files]
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: read-only
    forEach: steps.outline.output.modules
    concurrency: $CONCURRENCY
    instructions: 'Say what module {{item.name}} does.'
    tools: [list_files]
YAML
mkdir -p "$OUT/workspace/src"; echo "fn main() {}" >"$OUT/workspace/src/main.rs"

"$BIN" sim serve --listen 127.0.0.1:0 --scenario "$OUT/scenario.yaml" >"$OUT/sim.out" 2>"$OUT/sim.err" &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q listening "$OUT/sim.out" && break; sleep 0.1; done
url=$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$OUT/sim.out")

home() { # MODE
  local h="$OUT/home-$1"; mkdir -p "$h"
  printf 'providers:\n  bench:\n    api: openai-chat\n    baseUrl: %s\n    apiKeyEnv: BENCH_KEY\n    model: bench-model\n    throttle: %s\n    maxConcurrentRequests: 64\n' "$url" "$1" >"$h/host.yaml"
  echo "$h"
}
run() { # MODE: one run, prints its wall seconds
  local h; h=$(home "$1")
  local t0 t1
  t0=$(date +%s.%N)
  DOCSFAB_HOME="$h" BENCH_KEY=k "$BIN" run "$OUT/composition.yaml" --workspace "$OUT/workspace" >"$OUT/run-$1.out" 2>&1 \
    || { echo "run failed ($1):" >&2; tail -5 "$OUT/run-$1.out" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
shared=(); off=()
for _ in $(seq "$ROUNDS"); do
  shared+=("$(run shared)"); off+=("$(run off)")
done
python3 - "${shared[*]}" "${off[*]}" "$N" <<'PY'
import statistics, sys
shared = [float(x) for x in sys.argv[1].split()]
off = [float(x) for x in sys.argv[2].split()]
ratios = [s / o for s, o in zip(shared, off)]
n = sys.argv[3]
print(f"{n} instances, {len(shared)} rounds: shared median {statistics.median(shared):.2f} s "
      f"(min {min(shared):.2f}, max {max(shared):.2f}); off median {statistics.median(off):.2f} s "
      f"(min {min(off):.2f}, max {max(off):.2f}); shared/off per round median {statistics.median(ratios):.3f} "
      f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
PY
echo "results in $OUT"
