"""Prints the throttle benchmark's table from a results directory written by run.sh.

  summarize.py OUT_DIR [--json]

For each case it reads OUT_DIR/CASE.json (what the client side saw: wall time, units that
succeeded) and OUT_DIR/CASE.sim.jsonl (the simulator's request log: every request it received,
and the ones it refused over capacity with 429). The floor is the time the capacity needs for
the requests it admitted: admitted x 60 / requestsPerMinute / timeScale (60 s for 120 requests
at 120 a minute, as the issue counts it).
"""

import json
import os
import sys

CAPACITY_ENTRY = "capacity (429)"  # docsfab_sim::CAPACITY_ENTRY
TARGET = {"wall_over_floor": 1.15, "refused_share": 0.025}  # issue 12's target for docsfab

LABELS = {
    "standin": "docsfab today (before): 40 `docsfab run` processes of one agent, 8 at a time",
    "a": "(a) docsfab fan-out, shared throttle: 40 instances, concurrency 8",
    "b": "(b) docsfab fan-out, `throttle: off`",
    "c": "(c) docsfab fan-out, 4 processes x 10 instances, one DOCSFAB_HOME",
    "d1": "(d1) LiteLLM Router, deployment rpm 120 (usage-based-routing-v2, which enforces rpm)",
    "d1s": "(d1s) LiteLLM Router, deployment rpm 120, default strategy (simple-shuffle)",
    "d2": "(d2) LiteLLM Router, no rpm (defaults)",
    "e": "(e) openai SDK AsyncOpenAI, default retries (max_retries=2)",
}


def sim_figures(path):
    entries = []
    if os.path.exists(path):
        with open(path) as f:
            entries = [json.loads(line) for line in f if line.strip()]
    refused = sum(1 for e in entries if e.get("entry") == CAPACITY_ENTRY)
    return {"requests": len(entries), "refused": refused, "admitted": len(entries) - refused}


def row(out, case, meta):
    client_path = os.path.join(out, case + ".json")
    if not os.path.exists(client_path):
        return {"case": case, "label": LABELS.get(case, case), "skipped": "not run"}
    with open(client_path) as f:
        client = json.load(f)
    if "skipped" in client:
        return {"case": case, "label": LABELS.get(case, case), "skipped": client["skipped"]}
    sim = sim_figures(os.path.join(out, case + ".sim.jsonl"))
    cap = meta["capacity"]
    work = max(meta["tasks"] * meta["turns"], sim["admitted"])
    floor = work * 60.0 / cap["requestsPerMinute"] / cap.get("timeScale", 1)
    r = {"case": case, "label": LABELS.get(case, case), **sim, "floor_s": round(floor, 1)}
    r.update({k: client.get(k) for k in ("wall_s", "units", "units_ok", "failures", "replays", "heldMs", "turns")})
    r["wall_over_floor"] = round(client["wall_s"] / floor, 2) if floor else None
    r["refused_share"] = round(sim["refused"] / sim["requests"], 4) if sim["requests"] else 0.0
    r["meets_target"] = (
        r["units_ok"] == r["units"]
        and r["refused_share"] <= TARGET["refused_share"]
        and r["wall_over_floor"] is not None
        and r["wall_over_floor"] <= TARGET["wall_over_floor"]
    )
    return r


def notes(r):
    if r.get("failures"):
        return "failed: " + ", ".join(f"{n} {k}" for k, n in sorted(r["failures"].items()))
    if r.get("replays") is not None:
        held = f", held {r['heldMs'] / 1000:.1f} s" if r.get("heldMs") else ""
        return f"{r['turns']} turns, {r['replays']} in-turn replays{held}"
    return ""


def table(rows):
    head = (
        "| case | wall s | floor s | wall / floor | 429s (sim log) | requests (sim log) | 429 share "
        "| succeeded | target met | notes |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    )
    lines = [head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['label']} | | | | | | | | | skipped: {r['skipped']} |")
            continue
        lines.append(
            f"| {r['label']} | {r['wall_s']:.1f} | {r['floor_s']:.1f} | {r['wall_over_floor']:.2f} "
            f"| {r['refused']} | {r['requests']} | {100 * r['refused_share']:.1f} % "
            f"| {r['units_ok']} / {r['units']} | {'yes' if r['meets_target'] else 'no'} | {notes(r)} |"
        )
    return "\n".join(lines)


def main(argv):
    out = argv[0]
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    rows = [row(out, case, meta) for case in meta["cases"]]
    if "--json" in argv:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    cap = meta["capacity"]
    print(
        f"Capacity {cap['requestsPerMinute']} requests/minute, burst {cap['burst']}, timeScale "
        f"{cap.get('timeScale', 1)}; {meta['tasks']} agents x {meta['turns']} turns at concurrency "
        f"{meta['concurrency']}; litellm {meta['versions']['litellm']}, openai {meta['versions']['openai']}, "
        f"{meta['versions']['docsfab']}.\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
