"""Prints the throttle benchmark's tables from a results directory written by run.sh.

  summarize.py OUT_DIR [--json]

For each shape and case it reads OUT_DIR/SHAPE.CASE.json (what the client saw: wall time,
instances that succeeded) and OUT_DIR/SHAPE.CASE.sim.jsonl (the simulator's request log: every
request it received, and those it refused over capacity, `entry: "capacity (429)"`). The floor
is zoo.floor_s of what the simulator admitted (zoo.py's docstring).

The table: a row per shape, a column per client, each cell `wall / floor · 429s / requests ·
instances succeeded`. Then the issue's targets for `docsfab shared`, and the details per case.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

CAPACITY_ENTRY = "capacity (429)"  # docsfab_sim::CAPACITY_ENTRY

LABELS = {
    "shared": "docsfab shared",
    "off": "docsfab off",
    "procs4": "4 processes, one home",
    "serve2": "2 serve workers, one PostgreSQL",
    "openai": "openai SDK (max_retries=10)",
    "litellm": "LiteLLM Router (defaults)",
    "pacer": "pacer told capacity + 1 %",
}
SHAPE_LABELS = {
    "burst1-openai": "burst 1, OpenAI headers, `retry-after` s",
    "burstN-openai": "burst 10, OpenAI headers, `retry-after` s",
    "burst1-anthropic": "burst 1, Anthropic headers, `retry-after` s",
    "retry-after-ms": "burst 1, OpenAI headers, `retry-after-ms` only",
    "retry-after-none": "burst 1, OpenAI headers, no Retry-After",
    "prompt-tokens": "prompt tokens 60k/min, 10 s bucket",
    "no-headers": "burst 1, no rate-limit headers",
    "outside-client": "burst 1 + outside client 30 % (floor: the 70 % left)",
}


def sim_figures(path):
    entries = []
    if os.path.exists(path):
        with open(path) as f:
            entries = [json.loads(line) for line in f if line.strip()]
    refused = [e for e in entries if e.get("entry") == CAPACITY_ENTRY]
    admitted = [e for e in entries if e.get("entry") != CAPACITY_ENTRY]
    return {
        "requests": len(entries),
        "refused": len(refused),
        "admitted": len(admitted),
        "admitted_tokens": sum(e.get("prompt_tokens") or 0 for e in admitted),
    }


def targets(shape, cap):
    if cap.get("headers") == "none":
        return {"wall_over_floor": 1.3, "refused_share": 0.05}
    return {"wall_over_floor": 1.15, "refused_share": 0.025}


def cell(out, shape, case, meta):
    base = os.path.join(out, f"{shape}.{case}")
    if not os.path.exists(base + ".json"):
        return {"shape": shape, "case": case, "missing": "not run"}
    try:
        client = json.load(open(base + ".json"))
    except ValueError:
        return {"shape": shape, "case": case, "missing": "its result file is not JSON (the case was cut short)"}
    if "error" in client:
        return {"shape": shape, "case": case, "missing": client["error"]}
    cap = meta["shapes"][shape]
    sim = sim_figures(base + ".sim.jsonl")
    floor, binds = zoo.floor_s(cap, sim["admitted"], sim["admitted_tokens"])
    r = {"shape": shape, "case": case, **sim, "floor_s": round(floor, 2), "binds": binds}
    for k in ("wall_s", "units", "units_ok", "failures", "replays", "heldMs", "turns", "timedOut", "run_statuses", "outline"):
        if k in client:
            r[k] = client[k]
    r["wall_over_floor"] = round(client["wall_s"] / floor, 3) if floor else None
    r["refused_share"] = round(sim["refused"] / sim["requests"], 4) if sim["requests"] else 0.0
    err = base + ".sim.err"
    if os.path.exists(err):
        outside = [l.strip() for l in open(err) if "outside client" in l]
        if outside:
            r["outside"] = outside[-1]
    return r


def text(r):
    if "missing" in r:
        return "n/a"
    ratio = f"{r['wall_over_floor']:.2f}" if r["wall_over_floor"] is not None else "-"
    t = f"{ratio} · {r['refused']} / {r['requests']} · {r['units_ok']} / {r['units']}"
    if r.get("timedOut"):
        t += " (timed out)"
    return t


def verdicts(rows, shape, meta):
    """The issue's targets for docsfab shared on one shape: a list of (target, met, detail)."""
    by = {r["case"]: r for r in rows if r["shape"] == shape and "missing" not in r}
    s = by.get("shared")
    if s is None:
        return []
    cap = meta["shapes"][shape]
    t = targets(shape, cap)
    out = [
        ("all succeed", s["units_ok"] == s["units"], f"{s['units_ok']} / {s['units']}"),
        (f"wall <= {t['wall_over_floor']} x floor", s["wall_over_floor"] is not None and s["wall_over_floor"] <= t["wall_over_floor"], f"{s['wall_over_floor']:.3f}" if s["wall_over_floor"] is not None else "no floor"),
        (f"429s <= {100 * t['refused_share']:g} %", s["refused_share"] <= t["refused_share"], f"{100 * s['refused_share']:.1f} %"),
    ]

    def behind(a, b):  # a is behind b: fewer instances done, or as many and slower
        return a["units_ok"] < b["units_ok"] or (a["units_ok"] == b["units_ok"] and a["wall_s"] > b["wall_s"])

    for other, name in (("off", "not slower than off"), ("openai", "not behind the openai SDK")):
        if other in by:
            o = by[other]
            out.append((name, not behind(s, o), f"{s['wall_s']:.1f} s vs {o['wall_s']:.1f} s, {s['units_ok']} vs {o['units_ok']} done"))
    return out


def main(argv):
    out = argv[0]
    meta = json.load(open(os.path.join(out, "meta.json")))
    shapes, cases = list(meta["shapes"]), meta["cases"]
    rows = [cell(out, s, c, meta) for s in shapes for c in cases]
    if "--json" in argv:
        print(json.dumps({"meta": meta, "rows": rows, "targets": {s: verdicts(rows, s, meta) for s in shapes}}, indent=2))
        return
    v = meta["versions"]
    scales = sorted({meta["shapes"][s]["timeScale"] for s in shapes})
    print(
        f"{meta['instances']} instances at concurrency {meta['concurrency']} after one read step; "
        f"timeScale {', '.join(f'{x:g}' for x in scales)}; {v['docsfab']}; litellm {v['litellm']}, "
        f"openai {v['openai']}, Python {v.get('python', '?')}; `{meta['command']}`, "
        f"{meta.get('started', '?')} to {meta.get('ended', '?')}.\n"
    )
    print("Each cell: wall / floor · 429s / requests (simulator's log) · instances succeeded.\n")
    print("| shape | " + " | ".join(LABELS.get(c, c) for c in cases) + " |")
    print("| --- |" + " ---: |" * len(cases))
    for s in shapes:
        cells = {r["case"]: r for r in rows if r["shape"] == s}
        print(f"| {SHAPE_LABELS.get(s, s)} | " + " | ".join(text(cells[c]) for c in cases) + " |")
    print("\nTargets for docsfab shared (issue 20):\n")
    print("| shape | target | met | figure |\n| --- | --- | --- | --- |")
    for s in shapes:
        for name, ok, detail in verdicts(rows, s, meta):
            print(f"| {s} | {name} | {'yes' if ok else '**no**'} | {detail} |")
    print("\nDetails:\n")
    print("| shape | client | wall s | floor s (binds) | requests | 429s | admitted | notes |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if "missing" in r:
            print(f"| {r['shape']} | {r['case']} | | | | | | {r['missing']} |")
            continue
        notes = []
        if r.get("timedOut"):
            notes.append("timed out")
        if r.get("failures"):
            notes.append("failed: " + ", ".join(f"{n} {k}" for k, n in sorted(r["failures"].items())))
        if r.get("outline"):
            notes.append(f"read step failed: {r['outline']}")
        if r.get("replays") is not None:
            notes.append(f"{r['turns']} turns, {r['replays']} in-turn replays, held {r.get('heldMs', 0) / 1000:.1f} s")
        if r.get("run_statuses") and any(x != "succeeded" for x in r["run_statuses"]):
            notes.append("runs: " + ", ".join(map(str, r["run_statuses"])))
        if r.get("outside"):
            notes.append(r["outside"])
        print(
            f"| {r['shape']} | {r['case']} | {r['wall_s']:.1f} | {r['floor_s']:.1f} ({r['binds']}) | {r['requests']} "
            f"| {r['refused']} | {r['admitted']} | {'; '.join(notes)} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
