#!/usr/bin/env bash
# Constraint on and off, side by side, on a real llama.cpp server (issue 31): runs outline.yaml
# N times with providers.default.structuredOutput json-schema and N times with off, in turn (so
# the machine's load falls on both alike), and prints per mode: runs succeeded, attempts per
# run, and prompt/answer tokens per succeeded step. Needs compat/llama/install.sh's server and
# model, and a built docsfab.
#   scripts/bench-structured/run.sh [N] [DOCSFAB_BINARY]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/../.."
n="${1:-5}"
docsfab="${2:-$root/target/release/docsfab}"
llama="$root/target/llama"
[[ -x "$llama/bin/llama-server" ]] || { echo "run compat/llama/install.sh first" >&2; exit 2; }
[[ -x "$docsfab" ]] || { echo "no docsfab binary at $docsfab (cargo build --release)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$llama/bin/llama-server" -m "$llama/model.gguf" --alias smollm2 --host 127.0.0.1 --port "$port" \
  -c 8192 -np 1 --seed 1 >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done

for mode in json-schema off; do
  mkdir -p "$work/$mode"
  cat >"$work/$mode/host.yaml" <<YAML
providers:
  default:
    api: openai-chat
    baseUrl: http://127.0.0.1:$port/v1
    apiKeyEnv: BENCH_NO_KEY
    model: smollm2
    structuredOutput: $mode
YAML
done
export BENCH_NO_KEY=none
for i in $(seq 1 "$n"); do
  for mode in json-schema off; do
    DOCSFAB_HOME="$work/$mode" "$docsfab" run "$here/outline.yaml" \
      --workspace "$root/examples/quickstart/workspace" --json >"$work/$mode/run-$i.json" 2>/dev/null || true
  done
done
python3 - "$work" "$n" <<'PY'
import json, sys, pathlib
work, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
print(f"{'structuredOutput':<17} {'succeeded':>9} {'attempts/run':>12} {'tokens in/run':>13} {'tokens out/run':>14} {'tokens in+out/ok step':>21}")
for mode in ["json-schema", "off"]:
    ok = attempts = tin = tout = 0
    for i in range(1, n + 1):
        lines = (work / mode / f"run-{i}.json").read_text().splitlines()
        rec = json.loads("\n".join(lines[1:]))  # line 1 is the run id
        step = rec["steps"][0]
        attempts += len(step["attempts"])
        tin += sum(a["usage"]["inputTokens"] or 0 for a in step["attempts"])
        tout += sum(a["usage"]["outputTokens"] or 0 for a in step["attempts"])
        ok += step["status"] == "succeeded"
    per_ok = f"{(tin + tout) / ok:.0f}" if ok else "- (none succeeded)"
    print(f"{mode:<17} {ok:>5} of {n:<2} {attempts / n:>12.1f} {tin / n:>13.0f} {tout / n:>14.0f} {per_ok:>21}")
PY
