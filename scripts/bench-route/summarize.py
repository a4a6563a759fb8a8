#!/usr/bin/env python3
"""Reads the hey outputs and GNU time reports that run.sh wrote, prints one Markdown table.

    summarize.py OUT_DIR
"""
import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1])


def hey(path):
    text = path.read_text()

    def num(pattern):
        m = re.search(pattern, text)
        return float(m.group(1)) if m else None

    statuses = {int(c): int(n) for c, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", text)}
    tail = text.split("Error distribution:", 1)[1] if "Error distribution:" in text else ""
    errors = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", tail, re.M))
    return {
        "total_s": num(r"Total:\s+([\d.]+) secs"),
        "rps": num(r"Requests/sec:\s+([\d.]+)"),
        "bytes": num(r"Total data:\s+(\d+) bytes"),
        "p50": num(r"50%+ in ([\d.]+) secs"),
        "p99": num(r"99%+ in ([\d.]+) secs"),
        "ok": statuses.get(200, 0),
        "not_ok": sum(n for c, n in statuses.items() if c != 200) + errors,
    }


def rss_mb(name):
    p = out / f"{name}.time"
    if not p.exists():
        return None
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.read_text())
    return int(m.group(1)) / 1024 if m else None


def ms(x):
    return "-" if x is None else f"{x * 1000:.2f}"


def answer_bytes(case):
    m = re.search(r"\((\d+) bytes per answer\)", (out / f"{case}-upstream.out").read_text())
    return int(m.group(1)) if m else None


rows = []
cases = sorted({p.name.split("-")[0] for p in out.glob("*.hey")})
for case in cases:
    targets = sorted({p.name[len(case) + 1:].split(".c")[0] for p in out.glob(f"{case}-*.hey")},
                     key=lambda t: ["direct", "route-before", "route-after", "litellm"].index(t)
                     if t in ["direct", "route-before", "route-after", "litellm"] else 9)
    conc = sorted({int(re.search(r"\.c(\d+)\.hey$", p.name).group(1)) for p in out.glob(f"{case}-*.hey")})
    direct = {c: hey(out / f"{case}-direct.c{c}.hey") for c in conc if (out / f"{case}-direct.c{c}.hey").exists()}
    for t in targets:
        for c in conc:
            p = out / f"{case}-{t}.c{c}.hey"
            if not p.exists():
                continue
            h = hey(p)
            d = direct.get(c)
            # The upstream's answer bytes: LiteLLM re-encodes the stream (chunked, its own
            # framing), so hey cannot count its bytes and they would not compare anyway.
            size = answer_bytes(case)
            mbps = size * h["ok"] / h["total_s"] / 1e6 if c == 1 and size and h["total_s"] else None
            add50 = h["p50"] - d["p50"] if d and h["p50"] is not None and t != "direct" else None
            add99 = h["p99"] - d["p99"] if d and h["p99"] is not None and t != "direct" else None
            rss_name = f"{case}-upstream" if t == "direct" else f"{case}-{t}"
            rows.append((case, t, c, "-" if mbps is None else f"{mbps:.1f}", f"{h['rps'] or 0:.0f}",
                         ms(h["p50"]), ms(h["p99"]), ms(add50), ms(add99),
                         "-" if rss_mb(rss_name) is None else f"{rss_mb(rss_name):.0f}",
                         f"{h['ok']}/{h['not_ok']}"))

print("| answer | path | streams | MB/s (1 stream) | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | peak RSS MiB | 200s/other |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
print()
print("MB/s = 10^6 bytes of the upstream's answer delivered per second with one stream (requests back to back).")
print("Added latency = the path's percentile minus the direct percentile at the same concurrency.")
print("Peak RSS of `direct` is the upstream's own.")
