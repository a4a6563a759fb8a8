#!/usr/bin/env python3
"""Scale-out benchmark for `docsfab serve` (docs/scale-out.md, "Benchmark").

For each store (SQLite: every worker on one DOCSFAB_HOME; PostgreSQL: every worker on one
database) and each worker count, it starts the simulator (an instant provider, so what is
measured is docsfab's own work), W `docsfab serve` workers with --jobs J, submits N runs of a
one-step read-only composition as fast as the API takes them, and waits until every run ended.

Reported per configuration (median of --rounds, configurations interleaved round by round so
that the machine's noise falls on all of them alike):
  claimed/s     runs ended per second, from the first submission to the last end
  run ms        mean duration of a run in its record (claim to end: docsfab's per-run overhead
                with a provider that answers at once)
Only the standard library; usage:
  scripts/bench-scaleout/bench.py --docsfab target/release/docsfab \
      --postgres postgres://postgres:postgres@127.0.0.1:5432/postgres [--runs 200] [--rounds 3]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time, urllib.request

COMPOSITION = """name: bench
limits:
  timeoutMs: 60000
  maxTurns: 4
steps:
  - id: outline
    access: read-only
    instructions: Return an object with a modules array.
    contract:
      schema: {type: object, required: [modules]}
"""
SCENARIO = "responses:\n  - answer: {json: {modules: [core, cli]}}\n"


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def first_line(proc):
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("listening on "):
        raise SystemExit(f"unexpected first line: {line!r}")
    return line[len("listening on "):]


def one(args, store, workers, tmp):
    home = os.path.join(tmp, "home")
    ws = os.path.join(tmp, "ws")
    os.makedirs(os.path.join(ws, "src"), exist_ok=True)
    os.makedirs(home, exist_ok=True)
    open(os.path.join(ws, "src", "lib.rs"), "w").write("pub fn f() {}\n")
    scen = os.path.join(tmp, "scenario.yaml")
    open(scen, "w").write(SCENARIO)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCSFAB_")}
    env.update(DOCSFAB_HOME=home, BENCH_KEY="sk-bench", DOCSFAB_STORE=store)
    sim = subprocess.Popen([args.docsfab, "sim", "serve", "--listen", "127.0.0.1:0",
                            "--scenario", scen], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env)
    base = first_line(sim)
    open(os.path.join(home, "host.yaml"), "w").write(
        f"providers:\n  default:\n    api: openai-chat\n    baseUrl: {base}\n"
        f"    apiKeyEnv: BENCH_KEY\n    model: sim-model\n    maxConcurrentRequests: 64\n")
    procs, addrs = [], []
    try:
        for _ in range(workers):
            p = subprocess.Popen([args.docsfab, "serve", "--listen", "127.0.0.1:0",
                                  "--jobs", str(args.jobs), "--workspace-root", tmp],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            procs.append(p)
            addrs.append(first_line(p))
        start = time.monotonic()
        ids = []
        for i in range(args.runs):
            r = http("POST", f"{addrs[i % workers]}/api/runs",
                     {"composition": COMPOSITION, "workspace": {"path": ws}})
            ids.append(r["runId"])
        while True:
            rows = http("GET", f"{addrs[0]}/api/runs?limit={args.runs + 10}")["runs"]
            live = [r for r in rows if r["status"] in ("queued", "running")]
            if not live and len(rows) >= args.runs:
                break
            time.sleep(0.02)
        wall = time.monotonic() - start
        bad = [r for r in rows if r["status"] != "succeeded"]
        if bad:
            raise SystemExit(f"{len(bad)} runs did not succeed, e.g. {bad[0]}")
        run_ms = statistics.mean(r["durationMs"] for r in rows)
        return args.runs / wall, run_ms
    finally:
        for p in procs + [sim]:
            p.terminate()
        for p in procs + [sim]:
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docsfab", required=True)
    ap.add_argument("--postgres", required=True, help="admin URL; a database per round is made")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    results = {}
    for rnd in range(args.rounds):
        for kind in ("sqlite", "postgres"):
            for w in counts:
                tmp = tempfile.mkdtemp(prefix="docsfab-bench-")
                db = None
                if kind == "sqlite":
                    store = f"sqlite:{tmp}/home/runs.db"
                else:
                    db = f"bench_{os.getpid()}_{rnd}_{w}"
                    subprocess.run(["psql", args.postgres, "-qc", f"CREATE DATABASE {db}"], check=True)
                    store = args.postgres.rsplit("/", 1)[0] + "/" + db
                try:
                    rate, run_ms = one(args, store, w, tmp)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if db:
                        subprocess.run(["psql", args.postgres, "-qc",
                                        f"DROP DATABASE {db} WITH (FORCE)"], check=True)
                results.setdefault((kind, w), []).append((rate, run_ms))
                print(f"round {rnd + 1} {kind} workers={w}: {rate:.1f} runs/s, run {run_ms:.1f} ms",
                      file=sys.stderr, flush=True)
    base = statistics.median(r for r, _ in results[("sqlite", counts[0])])
    print(f"| store | workers (--jobs {args.jobs}) | claimed/s (median of {args.rounds}) | vs SQLite x{counts[0]} | run ms (median) |")
    print("| --- | --- | --- | --- | --- |")
    for (kind, w), vals in results.items():
        rate = statistics.median(r for r, _ in vals)
        ms = statistics.median(m for _, m in vals)
        print(f"| {kind} | {w} | {rate:.1f} | {rate / base:.2f}x | {ms:.1f} |")


if __name__ == "__main__":
    main()
