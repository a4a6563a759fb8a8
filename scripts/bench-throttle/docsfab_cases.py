"""The throttle benchmark's docsfab cases (issue 20), run by run.sh.

  docsfab_cases.py fanout BIN COMPOSITION WORKSPACE OUT_JSON --instances N [--processes P] [--timeout S]
  docsfab_cases.py serve  BIN COMPOSITION WORKSPACE OUT_JSON --instances N --pg-admin URL
                          [--workers W] [--timeout S]

fanout: P `docsfab run` processes at once of a forEach composition, on the DOCSFAB_HOME of the
        environment (shared, off: P = 1 with N instances at concurrency 8; procs4: P = 4, each of
        N/4 instances at concurrency 2).
serve:  W `docsfab serve --jobs 1` workers, each with a DOCSFAB_HOME of its own (a copy of the
        environment's host.yaml) and one fresh PostgreSQL database as their store; one run per
        worker (N/W instances at concurrency 8/W) submitted with POST /api/runs, followed with
        GET /api/runs/ID until every run has ended. The wall time runs from the first submission.

A unit is a forEach instance; it succeeded when its record says so (an instance that never
started counts as failed). After S seconds a case is stopped (SIGINT, then SIGKILL after 15 s;
serve: POST .../cancel) and reported `timedOut`. Every record is saved beside OUT_JSON. The 429s
and requests are read by run.sh / summarize.py from the simulator's log.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

INSTANCE = re.compile(r"^[A-Za-z0-9_-]+\[\d+\]$")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["fanout", "serve"])
    p.add_argument("bin")
    p.add_argument("composition")
    p.add_argument("workspace")
    p.add_argument("out_json")
    p.add_argument("--instances", type=int, required=True, help="forEach instances in all")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--pg-admin", help="serve: a PostgreSQL URL whose role may create databases")
    p.add_argument("--timeout", type=float, default=600.0)
    return p.parse_args(argv)


def figures(record):
    """What the forEach instances of one run record spent."""
    units = [s for s in record.get("steps") or [] if s.get("forEach") is not None or INSTANCE.match(s.get("stepId") or "")]
    turns = [t for s in units for a in s.get("attempts") or [] for t in a.get("turns") or []]
    return {
        "ok": sum(1 for s in units if s.get("status") == "succeeded"),
        "instances": len(units),
        "attempts": sum(len(s.get("attempts") or []) for s in units),
        "turns": len(turns),
        "replays": sum(t.get("providerRetries") or 0 for t in turns),
        "heldMs": sum(t.get("heldMs") or 0 for t in turns),
        "statuses": sorted({s.get("status") for s in units}),
    }


def result(args, wall, timed_out, records, extra):
    figs = [figures(r) for r in records]
    out = {
        "wall_s": round(wall, 2),
        "timedOut": timed_out,
        "units": args.instances,
        "units_ok": sum(f["ok"] for f in figs),
        "run_statuses": [r.get("status") for r in records],
        "turns": sum(f["turns"] for f in figs),
        "replays": sum(f["replays"] for f in figs),
        "heldMs": sum(f["heldMs"] for f in figs),
        "attempts": sum(f["attempts"] for f in figs),
        **extra,
    }
    with open(args.out_json, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))


def save(args, run_id, text):
    d = os.path.splitext(args.out_json)[0] + "-records"
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, run_id + ".json"), "w") as f:
        f.write(text)


async def fanout(args):
    procs = []
    for _ in range(args.processes):
        procs.append(
            await asyncio.create_subprocess_exec(
                args.bin, "run", args.composition, "--workspace", ".", cwd=args.workspace,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        )
    started = time.monotonic()
    comms = [asyncio.ensure_future(p.communicate()) for p in procs]
    done, pending = await asyncio.wait(comms, timeout=args.timeout)
    timed_out = bool(pending)
    if pending:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGINT)  # as Ctrl-C: docsfab cancels and records the run
        done2, pending = await asyncio.wait(pending, timeout=15)
        for p in procs:
            if p.returncode is None:
                p.kill()
        if pending:
            await asyncio.wait(pending)
    wall = time.monotonic() - started
    records, runs = [], []
    for p, c in zip(procs, comms):
        out, err = c.result()
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        first = out.splitlines()[0].strip() if out.strip() else ""
        run_id = first if first.startswith("run-") else None
        runs.append({"exit": p.returncode, "runId": run_id, "stderrTail": err.strip().splitlines()[-3:]})
        if run_id is None:
            continue
        show = subprocess.run([args.bin, "runs", "show", run_id, "--json"], cwd=args.workspace, capture_output=True, text=True)
        if show.returncode != 0:
            runs[-1]["showError"] = show.stderr.strip()
            continue
        save(args, run_id, show.stdout)
        records.append(json.loads(show.stdout))
    result(args, wall, timed_out, records, {"processes": args.processes, "runs": runs})


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def serve(args):
    base_home = os.environ["DOCSFAB_HOME"]
    db = "bench_" + re.sub(r"[^a-z0-9]", "_", os.path.basename(os.path.splitext(args.out_json)[0]).lower()) + f"_{os.getpid()}"
    admin = args.pg_admin
    subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {db}"], check=True)
    store = admin.rsplit("/", 1)[0] + "/" + db
    composition = open(args.composition).read()
    workers, addrs, logs = [], [], []
    try:
        for w in range(args.workers):
            home = f"{base_home}-w{w}"
            os.makedirs(home, exist_ok=True)
            shutil.copy(os.path.join(base_home, "host.yaml"), os.path.join(home, "host.yaml"))
            env = dict(os.environ, DOCSFAB_HOME=home, DOCSFAB_STORE=store)
            log = open(os.path.splitext(args.out_json)[0] + f".serve{w}.err", "w")
            logs.append(log)
            p = subprocess.Popen(
                [args.bin, "serve", "--listen", "127.0.0.1:0", "--jobs", "1",
                 "--workspace-root", os.path.dirname(os.path.abspath(args.workspace))],
                stdout=subprocess.PIPE, stderr=log, env=env,
            )
            workers.append(p)
            line = p.stdout.readline().decode().strip()
            if not line.startswith("listening on "):
                raise SystemExit(f"docsfab serve did not start: {line!r}")
            addrs.append(line[len("listening on "):])
        started = time.monotonic()
        ids = []
        for w in range(args.workers):
            r = http("POST", f"{addrs[w]}/api/runs",
                     {"composition": composition, "workspace": {"path": os.path.abspath(args.workspace)}})
            ids.append(r["runId"])
        timed_out = False
        while True:
            statuses = [http("GET", f"{addrs[0]}/api/runs/{i}")["status"] for i in ids]
            if all(s not in ("queued", "running") for s in statuses):
                break
            if time.monotonic() - started > args.timeout:
                timed_out = True
                for i in ids:
                    http("POST", f"{addrs[0]}/api/runs/{i}/cancel")
                end = time.monotonic() + 20
                while time.monotonic() < end and any(
                    http("GET", f"{addrs[0]}/api/runs/{i}")["status"] in ("queued", "running") for i in ids
                ):
                    time.sleep(0.5)
                break
            time.sleep(0.1)
        wall = time.monotonic() - started
        records = []
        for i in ids:
            rec = http("GET", f"{addrs[0]}/api/runs/{i}")
            save(args, i, json.dumps(rec, indent=2))
            records.append(rec)
        result(args, wall, timed_out, records, {"workers": args.workers, "database": db, "runIds": ids})
    finally:
        for p in workers:
            p.terminate()
        for p in workers:
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"])


def main(args):
    if args.mode == "fanout":
        asyncio.run(fanout(args))
    else:
        serve(args)


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]))
