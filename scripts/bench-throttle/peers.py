"""The throttle benchmark's peer clients (issue 20), run by run.sh.

  peers.py CASE BASE_URL OUT_JSON --instances N [--concurrency 8] [--timeout S] [--capacity JSON]

The work is the docsfab cases': one call answering the module list (its prompt carries the
marker BENCHOUTLINE, as the read step's does), then N calls, CONCURRENCY at a time under
asyncio, one chat completion each, non-streaming. A unit (one of the N calls) fails when its
call finally raises. CASE is one of

  openai   the openai SDK's AsyncOpenAI with max_retries=10 (issue 20's figure)
  litellm  LiteLLM's Router, one deployment `openai/bench-model`, every setting at its default
  pacer    a simple client told the true capacity plus 1 % (--capacity: the zoo capacity as
           zoo.py prints it): a token bucket of the burst and the rate (and of the token budget,
           charging each request body bytes / 4, what the simulator charges), both 1 % larger
           than the truth, that spaces the sends; on a 429 it waits retry-after-ms, else
           retry-after, else 1 s, and asks the bucket again (at most 10 retries). httpx, which
           the openai SDK brings.

After S seconds the calls still going are cancelled and the case is reported `timedOut`. The
429s and request counts are read by summarize.py from the simulator's log, not from here.
"""

import argparse
import asyncio
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo import PADDING  # noqa: E402  the instances' prompts carry what the compositions carry

MODEL = "bench-model"
KEY = os.environ.get("BENCH_THROTTLE_KEY", "benchkey-peer")
SYSTEM = "You document a Rust workspace."


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=["openai", "litellm", "pacer"])
    p.add_argument("base_url")
    p.add_argument("out_json")
    p.add_argument("--instances", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--capacity", help="pacer: the capacity as JSON (zoo.py capacity)")
    return p.parse_args(argv)


def messages(prompt):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


class Pacer:
    """A token bucket per budget, told the capacity plus 1 %: a send reserves its cost at once
    and waits until every bucket has it, so the sends queue in the order they asked."""

    def __init__(self, cap):
        scale = float(cap.get("timeScale", 1))
        self.buckets = [[cap["burst"] * 1.01, cap["requestsPerMinute"] / 60.0 * scale * 1.01]]
        if "tokensPerMinute" in cap:
            self.buckets.append([cap["tokenBucket"] * 1.01, cap["tokensPerMinute"] / 60.0 * scale * 1.01])
        self.level = [b[0] for b in self.buckets]
        self.at = time.monotonic()

    async def wait(self, tokens):
        now = time.monotonic()
        wait = 0.0
        for i, (size, rate) in enumerate(self.buckets):
            self.level[i] = min(size, self.level[i] + (now - self.at) * rate)
            self.level[i] -= 1 if i == 0 else min(tokens, size)
            if self.level[i] < 0:
                wait = max(wait, -self.level[i] / rate)
        self.at = now
        if wait > 0:
            await asyncio.sleep(wait)


def make_client(args):
    """An async `complete(prompt)` for the case, and its settings as shown in the results."""
    if args.case == "openai":
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=args.base_url, api_key=KEY, max_retries=10)

        async def complete(prompt):
            return await client.chat.completions.create(model=MODEL, messages=messages(prompt))

        return complete, {"max_retries": client.max_retries}

    if args.case == "litellm":
        import litellm
        from litellm import Router

        litellm.telemetry = False
        deployment = {
            "model_name": "bench",
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": args.base_url, "api_key": KEY},
        }
        router = Router(model_list=[deployment])  # retries, cooldowns, strategy: the defaults

        async def complete(prompt):
            return await router.acompletion(model="bench", messages=messages(prompt))

        return complete, {"router": "defaults", "num_retries": router.num_retries}

    import httpx

    cap = json.loads(args.capacity)
    pacer = Pacer(cap)
    http = httpx.AsyncClient(base_url=args.base_url, timeout=60.0)
    url = "/v1/chat/completions" if not args.base_url.rstrip("/").endswith("/v1") else "/chat/completions"

    async def complete(prompt):
        body = json.dumps({"model": MODEL, "messages": messages(prompt)}).encode()
        for attempt in range(11):
            await pacer.wait(max(1, len(body) // 4))
            r = await http.post(url, content=body,
                                headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"})
            if r.status_code == 200:
                return r.json()
            if r.status_code != 429 or attempt == 10:
                raise RuntimeError(f"HTTP {r.status_code}")
            ms = r.headers.get("retry-after-ms")
            s = r.headers.get("retry-after")
            await asyncio.sleep(float(ms) / 1000 if ms else float(s) if s else 1.0)

    told = {k: v for k, v in cap.items() if k in ("requestsPerMinute", "burst", "tokensPerMinute", "tokenBucket", "timeScale")}
    return complete, {"told": told, "plus": "1 %"}


async def unit(complete, prompt, gate):
    async with gate:
        try:
            await complete(prompt)
        except Exception as e:  # the unit fails: its call finally raised
            return type(e).__name__
    return None


async def work(args, complete, state):
    try:
        await complete(f"BENCHOUTLINE: list the workspace's modules.")
    except Exception as e:
        state["outline"] = type(e).__name__
        return
    gate = asyncio.Semaphore(args.concurrency)
    tasks = [
        asyncio.ensure_future(unit(complete, f"Survey module m{i:03d} (module {i:03d}) and say in one sentence what it does.\n{PADDING}", gate))
        for i in range(args.instances)
    ]
    state["tasks"] = tasks
    await asyncio.gather(*tasks)


async def main(args):
    complete, shown = make_client(args)
    state = {}
    started = time.monotonic()
    timed_out = False
    try:
        await asyncio.wait_for(work(args, complete, state), timeout=args.timeout)
    except asyncio.TimeoutError:
        timed_out = True
    wall = time.monotonic() - started
    tasks = state.get("tasks", [])
    outcomes = [t.result() if t.done() and not t.cancelled() else "unfinished" for t in tasks]
    outcomes += ["not started"] * (args.instances - len(tasks))
    failures = collections.Counter(o for o in outcomes if o is not None)
    result = {
        "case": args.case,
        "settings": shown,
        "wall_s": round(wall, 2),
        "timedOut": timed_out,
        "units": args.instances,
        "units_ok": args.instances - sum(failures.values()),
        "failures": dict(failures),
        "outline": state.get("outline"),
    }
    with open(args.out_json, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
