#!/usr/bin/env python3
"""How many of `sim serve`'s seeded throttle runs are short enough for a step to succeed.

A replica of docsfab-sim's SplitMix64 and its `random` throttle expansion
(crates/docsfab-sim/src/rng.rs, scenario.rs): per seed, a 429, then another while
`chance(persistence)` holds (max_run 23). A step with W requests per throttled turn succeeds
when the run is at most W - 1 long. This separates the sample the scripts draw from what docsfab
does with them. Usage: script_draws.py PERSISTENCE WINDOW FIRST_SEED COUNT
"""

import sys

M = (1 << 64) - 1


def splitmix(seed):
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        yield z ^ (z >> 31)


def run_length(seed, persistence, max_run=23):
    rng = splitmix(seed)
    n = 1
    while n < max_run and ((next(rng) >> 11) / float(1 << 53)) < persistence:
        n += 1
    return n


def main():
    p, window, first, count = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    short = sum(run_length(s, p) <= window - 1 for s in range(first, first + count))
    print(f"persistence {p}, window {window}, seeds {first}..{first + count - 1}: "
          f"{short}/{count} = {short / count:.4f} runs short enough (1 - p^(window-1) = {1 - p ** (window - 1):.4f})")


if __name__ == "__main__":
    main()
