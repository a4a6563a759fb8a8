"""The provider zoo as the throttle benchmark uses it (docs/throttle.md, "Benchmark").

  zoo.py scenario ZOO_YAML OUT_YAML --instances N [--time-scale T]
  zoo.py capacity ZOO_YAML [--time-scale T]          # the capacity as JSON (for the pacer)
  zoo.py timeout ZOO_YAML --instances N [--time-scale T]   # seconds a case may take
  zoo.py composition TEMPLATE OUT_YAML                # a composition with @PADDING@ filled in

A bench scenario is the zoo file's `capacity` (plus `timeScale` when T is not 1) behind the
work of issue 20: the read step's request (it carries the marker OUTLINE_MARKER) is answered by
a lane with the module list, every other request with ANSWER, each after 200 ms, as the zoo
scenarios answer (their `Done.` as a JSON object, since a docsfab read-only step answers JSON).
The module list has N items in `modules` (one run), N/4 in `quarter` (each of four processes)
and N/2 in `half` (each of two serve workers).

The floor (`floor`) is what the capacity needs for what a case had admitted beyond the first
full bucket: (requests admitted - burst) / rate, or for a token budget (prompt tokens admitted
- the bucket's tokens) / the token rate, whichever is longer; with an outside client, at the
share of the rate left to us. Only the standard library: the zoo files are read line by line.
"""

import json
import math
import sys

OUTLINE_MARKER = "BENCHOUTLINE"
# What the harness assumes of a request's prompt before a case ran (for the time limit only).
TOKENS_PER_REQUEST_GUESS = 1000
# Every instance's prompt carries this text, so a request is about 1,000 prompt tokens (the
# simulator's body bytes / 4), as in crates/docsfab-throttle/tests/pacing_model.rs, and the
# token shape's budget binds. The compositions say @PADDING@ where it goes; peers.py sends it too.
PADDING = " ".join(
    f"Note {k:02d}: say what the module exports, what it depends on, how it is tested and what a new contributor should read first."
    for k in range(30)
)
# Every admitted instance is answered with this JSON object (a read-only step answers JSON).
ANSWER = {"summary": "Done."}


def capacity(path, time_scale=1.0):
    """The `capacity:` block of a zoo file as a dict, with its defaults filled in."""
    cap, inside = {}, False
    for line in open(path):
        if line.startswith("capacity:"):
            inside = True
            continue
        if inside:
            if not line.startswith("  ") or not line.strip():
                if line.strip() and not line.startswith(" "):
                    break
                continue
            key, _, value = line.strip().partition(":")
            value = value.split("#")[0].strip()
            try:
                cap[key] = float(value) if "." in value else int(value)
            except ValueError:
                cap[key] = value
    if "requestsPerMinute" not in cap:
        raise SystemExit(f"{path}: no capacity.requestsPerMinute")
    cap.setdefault("burst", cap["requestsPerMinute"])
    cap.setdefault("headers", "api")
    cap.setdefault("retryAfter", "both")
    cap.setdefault("outsideShare", 0)
    if "tokensPerMinute" in cap:
        secs = cap.get("tokenBurstSeconds")
        cap["tokenBucket"] = (
            cap["tokensPerMinute"] * secs / 60.0
            if secs
            else cap["tokensPerMinute"] * cap["burst"] / cap["requestsPerMinute"]
        )
    cap["timeScale"] = float(time_scale)
    return cap


def floor_s(cap, admitted, admitted_tokens):
    """Seconds the capacity needs for what was admitted beyond the first full bucket."""
    left = 1.0 - float(cap.get("outsideShare") or 0)
    scale = cap["timeScale"]
    per_s = cap["requestsPerMinute"] / 60.0 * scale * left
    requests = max(0.0, admitted - cap["burst"]) / per_s
    tokens = 0.0
    if "tokensPerMinute" in cap:
        tok_per_s = cap["tokensPerMinute"] / 60.0 * scale * left
        tokens = max(0.0, admitted_tokens - cap["tokenBucket"]) / tok_per_s
    return max(requests, tokens), ("tokens" if tokens > requests else "requests")


def module_list(n):
    items = [{"name": f"m{i:03d}", "purpose": f"module {i:03d}"} for i in range(n)]
    return {"modules": items, "quarter": items[: max(1, n // 4)], "half": items[: max(1, n // 2)]}


def scenario(zoo_path, out_path, instances, time_scale):
    lines, inside = [], False
    name = None
    for line in open(zoo_path):
        if line.startswith("name:"):
            name = line.split(":", 1)[1].strip()
        if line.startswith("capacity:"):
            inside = True
            lines.append(line.rstrip("\n"))
            continue
        if inside:
            if line.startswith("  ") and line.strip():
                if not line.strip().startswith("timeScale:"):
                    lines.append(line.rstrip("\n"))
                continue
            break
    if float(time_scale) != 1.0:
        lines.append(f"  timeScale: {float(time_scale):g}")
    answer = json.dumps({"json": module_list(instances)})
    text = "\n".join(
        [
            f"# Generated by scripts/bench-throttle/zoo.py from {zoo_path.split('/')[-1]}: its capacity,",
            "# the read step's request (marker " + OUTLINE_MARKER + ") answered with the module list,",
            "# everything else with {\"summary\": \"Done.\"}, each after 200 ms.",
            f"name: bench-{name or 'zoo'}",
            *lines,
            "responses:",
            f"  - answer: {json.dumps({'json': ANSWER})}",
            "    delay_ms: 200",
            "fallback: repeat-last",
            "lanes:",
            f'  - contains: "{OUTLINE_MARKER}"',
            "    responses:",
            f"      - answer: {answer}",
            "        delay_ms: 200",
            "",
        ]
    )
    with open(out_path, "w") as f:
        f.write(text)


def timeout_s(cap, instances):
    requests = instances + 4  # up to four read steps (four processes)
    floor, _ = floor_s(cap, requests, requests * TOKENS_PER_REQUEST_GUESS)
    return math.ceil(4 * floor + 60)


def main(argv):
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["scenario", "capacity", "timeout", "composition"])
    p.add_argument("zoo")
    p.add_argument("out", nargs="?")
    p.add_argument("--instances", type=int, default=120)
    p.add_argument("--time-scale", type=float, default=1.0)
    a = p.parse_args(argv)
    if a.what == "scenario":
        scenario(a.zoo, a.out, a.instances, a.time_scale)
    elif a.what == "composition":
        with open(a.out, "w") as f:
            f.write(open(a.zoo).read().replace("@PADDING@", PADDING))
    elif a.what == "capacity":
        print(json.dumps(capacity(a.zoo, a.time_scale)))
    else:
        print(timeout_s(capacity(a.zoo, a.time_scale), a.instances))


if __name__ == "__main__":
    main(sys.argv[1:])
