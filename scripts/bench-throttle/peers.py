"""The throttle benchmark's peer clients (issue 12, cases d1, d2 and e), run by run.sh.

  peers.py CASE BASE_URL OUT_JSON [--tasks 40] [--turns 3] [--concurrency 8]

CASE is one of
  litellm-rpm    LiteLLM Router, one deployment with rpm = the true capacity (120), under the
                 strategy that enforces rpm (usage-based-routing-v2; the default simple-shuffle
                 reads rpm only as a weight between deployments)
  litellm-rpm-shuffle  the same deployment under the default strategy, to show that rpm alone
                 does not pace the requests
  litellm-norpm  LiteLLM Router, one deployment, no rpm, default strategy and retries
  openai         the openai SDK's AsyncOpenAI with its default retries (max_retries=2)

Each task is an agent: TURNS sequential chat completions, each sent with the conversation so far
(the answer, its tool calls and a tool result are appended after every turn), CONCURRENCY tasks
at once under asyncio. A task fails when any of its calls finally raises. The 429s and request
counts are read by run.sh from the simulator's log, not from here: this prints only what the
client saw (wall time, tasks succeeded, the exception classes of failed tasks).
"""

import argparse
import asyncio
import collections
import json
import os
import sys
import time

MODEL = "bench-model"
KEY = os.environ.get("BENCH_THROTTLE_KEY", "benchkey-peer")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files under a directory of the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
TOOL_RESULT = "README.md\nsrc/\nsrc/main.rs"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=["litellm-rpm", "litellm-rpm-shuffle", "litellm-norpm", "openai"])
    p.add_argument("base_url")
    p.add_argument("out_json")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rpm", type=int, default=120, help="the deployment's rpm for litellm-rpm")
    return p.parse_args(argv)


def make_client(args):
    """An async `complete(messages)` for the case, and a description of its settings."""
    if args.case == "openai":
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=args.base_url, api_key=KEY)  # max_retries: the default

        async def complete(messages):
            return await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)

        return complete, {"max_retries": client.max_retries}

    import litellm
    from litellm import Router

    litellm.telemetry = False
    deployment = {
        "model_name": "bench",
        "litellm_params": {"model": f"openai/{MODEL}", "api_base": args.base_url, "api_key": KEY},
    }
    settings = {}
    if args.case.startswith("litellm-rpm"):
        deployment["rpm"] = args.rpm
    if args.case == "litellm-rpm":
        settings["routing_strategy"] = "usage-based-routing-v2"
    router = Router(model_list=[deployment], **settings)  # num_retries, cooldowns: the defaults

    async def complete(messages):
        return await router.acompletion(model="bench", messages=messages, tools=TOOLS)

    shown = dict(settings, rpm=deployment.get("rpm"))
    return complete, shown


def assistant_turn(message):
    """The answer as the next request's messages: the assistant message, then a tool result per call."""
    calls = list(getattr(message, "tool_calls", None) or [])
    out = {"role": "assistant", "content": message.content or ""}
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls
        ]
    return [out] + [{"role": "tool", "tool_call_id": c.id, "content": TOOL_RESULT} for c in calls]


def failure_kind(error):
    """The exception's class, and whether LiteLLM refused locally rather than relaying a 429."""
    text = str(error)
    if "No deployments available" in text or "over defined rpm limit" in text or "user-defined ratelimit" in text:
        return type(error).__name__ + " (router's own limit)"
    return type(error).__name__


async def task(index, complete, turns, gate):
    messages = [
        {"role": "system", "content": "You document a Rust workspace."},
        {"role": "user", "content": f"Survey module m{index:02d} and say in one sentence what it does."},
    ]
    async with gate:
        for _ in range(turns):
            try:
                response = await complete(messages)
            except Exception as e:  # the task fails: any call that finally raises
                return failure_kind(e)
            messages += assistant_turn(response.choices[0].message)
    return None


async def main(args):
    complete, shown = make_client(args)
    gate = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    outcomes = await asyncio.gather(*(task(i, complete, args.turns, gate) for i in range(args.tasks)))
    wall = time.monotonic() - started
    failures = collections.Counter(o for o in outcomes if o is not None)
    result = {
        "case": args.case,
        "settings": shown,
        "wall_s": round(wall, 2),
        "units": args.tasks,
        "units_ok": args.tasks - sum(failures.values()),
        "failures": dict(failures),
    }
    with open(args.out_json, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
