#!/usr/bin/env python3
"""Real `docsfab run`s against `docsfab sim serve` vs `docsfab sim goodput` on the same fault model.

For each fault model, every real step is one `docsfab run` of a one-step read-only composition
against its own `sim serve`, whose seeded `random` throttle run (a 429, then another with
probability `persistence`) is the fault model the Monte Carlo is given. Waits are lowered to
milliseconds through host.yaml's catalog, as in crates/docsfab/tests/sim_goodput_reality.rs.
Prints one table row per model: real successes with their 95 % Wilson interval, the simulated
success rate, and mean attempts and requests per step, real vs simulated.

Usage: scripts/goodput-reality/compare.py [--bin target/debug/docsfab] [--steps 300]
                                          [--first-seed 1] [--model NAME]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

KEY_VAR = "DOCSFAB_GOODPUT_REALITY_KEY"

COMPOSITION = """name: small
limits:
  timeoutMs: 60000
  maxTurns: 6
steps:
  - id: outline
    access: read-only
    instructions: Survey src/ and return an object with a modules array.
    tools: [list_files, read_file]
    contract:
      schema: {type: object, required: [modules]}
"""

# name, throttle persistence, requests per throttled turn (providerAttempt.maxThrottledAttemptsPerTurn)
MODELS = [
    ("throttle-0.7-window-3", 0.7, 3),
    ("throttle-0.85-window-4", 0.85, 4),
]

ENV = {"DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES": "0", "DOCSFAB_RETRY_BASE_DELAY_MS": "20"}


def host_yaml(base_url, window):
    return (
        f"providers:\n  default:\n    api: openai-chat\n    baseUrl: {base_url}\n"
        f"    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n    throttle: off\n"
        "catalog:\n  providerAttempt.baseDelayMs: 1\n  providerAttempt.maxDelayMs: 5\n"
        f"  providerAttempt.maxThrottledAttemptsPerTurn: {window}\n"
    )


def scenario(seed, persistence):
    return (
        "responses:\n  - name: t\n    random:\n"
        f"      seed: {seed}\n      episodes: 1\n      throttle:\n        persistence: {persistence}\n"
        "      then:\n        answer: {json: {modules: [lib]}}\n"
    )


def fault_model(persistence):
    return (
        "good: {rateLimit: 1.0}\nbad: {}\ngoodToBad: 0\nbadToGood: 0\n"
        f"repeatAfter429: [{{afterWaitMs: 0, probability: {persistence}}}]\n"
        "okLatency: {minMs: 1, maxMs: 1}\nfaultLatency: {minMs: 1, maxMs: 1}\n"
        "streamLatency: {minMs: 1, maxMs: 1}\n"
    )


def env_for(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCSFAB_")}
    env.update(ENV)
    env["DOCSFAB_HOME"] = home
    env[KEY_VAR] = "sk-goodput-reality-not-a-secret"
    return env


def wilson(k, n, z=1.96):
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def real_step(binary, seed, persistence, window):
    """One real step: returns (succeeded, attempts, requests)."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "scenario.yaml"), "w") as f:
            f.write(scenario(seed, persistence))
        sim = subprocess.Popen(
            [binary, "sim", "serve", "--listen", "127.0.0.1:0", "--scenario",
             os.path.join(tmp, "scenario.yaml")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            first = sim.stdout.readline().strip()
            base_url = first.removeprefix("listening on ")
            home, ws = os.path.join(tmp, "home"), os.path.join(tmp, "ws")
            os.makedirs(os.path.join(ws, "src"))
            os.makedirs(home)
            with open(os.path.join(home, "host.yaml"), "w") as f:
                f.write(host_yaml(base_url, window))
            with open(os.path.join(ws, "src", "lib.rs"), "w") as f:
                f.write("//! A tiny crate.\npub fn count() -> usize { 3 }\n")
            comp = os.path.join(tmp, "composition.yaml")
            with open(comp, "w") as f:
                f.write(COMPOSITION)
            env = env_for(home)
            run = subprocess.run([binary, "run", comp, "--workspace", ws], env=env,
                                 capture_output=True, text=True)
            if run.returncode not in (0, 1):
                sys.exit(f"docsfab run exited {run.returncode}: {run.stderr.strip()}")
            runs = json.loads(subprocess.run([binary, "runs", "list", "--json"], env=env,
                                             capture_output=True, text=True, check=True).stdout)
            run_id = runs[0].get("runId") or runs[0].get("id")
            record = json.loads(subprocess.run([binary, "runs", "show", run_id, "--json"], env=env,
                                               capture_output=True, text=True, check=True).stdout)
        finally:
            sim.kill()
            sim.wait()
    attempts = record["steps"][0]["attempts"]
    requests = sum(1 + t["providerRetries"] for a in attempts for t in a["turns"])
    return run.returncode == 0, len(attempts), requests


def simulated(binary, persistence, window, steps):
    with tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        with open(os.path.join(home, "host.yaml"), "w") as f:
            f.write(host_yaml("http://127.0.0.1:9/v1", window))
        model = os.path.join(tmp, "model.yaml")
        with open(model, "w") as f:
            f.write(fault_model(persistence))
        out = subprocess.run(
            [binary, "sim", "goodput", "--policy", "effective", "--steps", str(steps), "--seed", "1",
             "--fault-model", model, "--json"],
            env=env_for(home), capture_output=True, text=True, check=True)
    p = json.loads(out.stdout)["policies"][0]
    ok = p["succeeded"]
    requests_per_step = p["requestsPerSuccess"] * ok / p["steps"]
    return p["successRate"], p["successCi95"], p["meanAttempts"], requests_per_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/docsfab")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sim-steps", type=int, default=1_000_000)
    ap.add_argument("--first-seed", type=int, default=1, help="sim serve seeds start here")
    ap.add_argument("--model", help="run only this model")
    args = ap.parse_args()
    print(f"{'model':<24} {'real ok':>9} {'real 95% CI':>15} {'sim ok':>7} {'sim 95% CI':>15} "
          f"{'in CI':>5} {'att real':>8} {'att sim':>7} {'req real':>8} {'req sim':>7}")
    for name, persistence, window in MODELS:
        if args.model and args.model != name:
            continue
        ok = attempts = requests = 0
        for seed in range(args.first_seed, args.first_seed + args.steps):
            s, a, r = real_step(args.bin, seed, persistence, window)
            ok += s
            attempts += a
            requests += r
        low, high = wilson(ok, args.steps)
        rate, ci, att, req = simulated(args.bin, persistence, window, args.sim_steps)
        inside = "yes" if low <= rate <= high else "NO"
        print(f"{name:<24} {ok:>4}/{args.steps:<4} {low:>6.3f}..{high:<6.3f} {rate:>7.4f} "
              f"{ci['low']:>6.4f}..{ci['high']:<6.4f} {inside:>5} {attempts / args.steps:>8.3f} "
              f"{att:>7.3f} {requests / args.steps:>8.3f} {req:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
