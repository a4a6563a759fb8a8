"""The throttle benchmark's docsfab cases (issue 12), run by run.sh.

  docsfab_cases.py standin BIN COMPOSITION WORKSPACE OUT_JSON [--runs 40] [--concurrency 8]
  docsfab_cases.py fanout  BIN COMPOSITION WORKSPACE OUT_JSON [--processes 1] [--instances 40]

DOCSFAB_HOME and the provider's key variable come from the environment (run.sh sets them: one
home per case, shared by every process of the case).

standin: RUNS separate `docsfab run` processes of a one-step composition, CONCURRENCY at a time:
         today's docsfab, which has no fan-out and no shared throttle (the "before" figure).
fanout:  PROCESSES `docsfab run` processes at once, each of a composition with a forEach step
         (cases a and b with 1 process of 40 instances; c with 4 processes of 10 instances).

Either way the unit counted is an agent: a run's step (standin) or a forEach step instance
(fanout); it succeeded when its record says so. Figures come from `docsfab runs show ID --json`
(docs/run-record.md); every record is also saved beside OUT_JSON. The 429s and requests are read
by run.sh from the simulator's log.
"""

import argparse
import asyncio
import json
import os
import re
import sys
import time

INSTANCE = re.compile(r"^[A-Za-z0-9_-]+\[\d+\]$")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["standin", "fanout"])
    p.add_argument("bin")
    p.add_argument("composition")
    p.add_argument("workspace")
    p.add_argument("out_json")
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--instances", type=int, default=40, help="fanout: forEach instances in all")
    return p.parse_args(argv)


async def docsfab(args, *argv):
    """Runs `BIN ARGV...` in the workspace; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        args.bin,
        *argv,
        cwd=args.workspace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def one_run(args, gate):
    async with gate:
        code, out, err = await docsfab(args, "run", args.composition, "--workspace", ".")
    # The first stdout line of `docsfab run` is the run id (absent when it refused to start).
    first = out.splitlines()[0].strip() if out.strip() else ""
    run_id = first if first.startswith("run-") else None
    return {"exit": code, "runId": run_id, "stderrTail": err.strip().splitlines()[-3:]}


def turns_of(step):
    for attempt in step.get("attempts") or []:
        yield from attempt.get("turns") or []


def step_figures(step):
    """What one agent spent: attempts, turns, in-turn replays, and the throttle's holds if recorded."""
    turns = list(turns_of(step))
    return {
        "stepId": step.get("stepId"),
        "status": step.get("status"),
        "attempts": len(step.get("attempts") or []),
        "turns": len(turns),
        "replays": sum(t.get("providerRetries") or 0 for t in turns),
        "heldMs": sum(t.get("heldMs") or 0 for t in turns),
    }


def agents_of(mode, record):
    """The units the benchmark counts in one run record."""
    steps = record.get("steps") or []
    if mode == "standin":
        return steps
    return [s for s in steps if s.get("forEach") is not None or INSTANCE.match(s.get("stepId") or "")]


async def main(args):
    records_dir = os.path.splitext(args.out_json)[0] + "-records"
    os.makedirs(records_dir, exist_ok=True)
    if args.mode == "standin":
        count, gate = args.runs, asyncio.Semaphore(args.concurrency)
    else:
        count, gate = args.processes, asyncio.Semaphore(args.processes)
    started = time.monotonic()
    runs = await asyncio.gather(*(one_run(args, gate) for _ in range(count)))
    wall = time.monotonic() - started

    agents, statuses = [], []
    for run in runs:
        if run["runId"] is None:
            statuses.append("did-not-start")
            continue
        code, out, err = await docsfab(args, "runs", "show", run["runId"], "--json")
        if code != 0:
            statuses.append("unreadable")
            run["showError"] = err.strip()
            continue
        with open(os.path.join(records_dir, run["runId"] + ".json"), "w") as f:
            f.write(out)
        record = json.loads(out)
        statuses.append(record.get("status"))
        agents += [step_figures(s) for s in agents_of(args.mode, record)]

    # Counted against what was asked for, so a run that never reached its instances counts them failed.
    expected = args.runs if args.mode == "standin" else args.instances
    result = {
        "case": args.mode,
        "wall_s": round(wall, 2),
        "processes": count,
        "runs_succeeded": statuses.count("succeeded"),
        "run_statuses": statuses,
        "units": expected,
        "units_ok": sum(1 for a in agents if a["status"] == "succeeded"),
        "attempts": sum(a["attempts"] for a in agents),
        "turns": sum(a["turns"] for a in agents),
        "replays": sum(a["replays"] for a in agents),
        "heldMs": sum(a["heldMs"] for a in agents),
        "runs": runs,
    }
    with open(args.out_json, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "run_statuses")}))


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
