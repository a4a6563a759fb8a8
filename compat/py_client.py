#!/usr/bin/env python3
"""One streaming request through the real Python SDK; prints what the SDK delivered.

Usage:
  py_client.py --api openai-chat|anthropic-messages --base-url URL [--model M] [--case NAME]
  py_client.py --batch < requests.jsonl   (one {"case","api","base_url","model"} per line)

Output: JSON Lines, one per delivered chunk/event ({"kind":"event","event":{...}}), then either
{"kind":"error",...} when the SDK raised or {"kind":"end"}. Every line carries "case" and
"client". Exits 0 whatever the SDK did, so the harness can compare.
"""
import argparse
import json
import sys


def emit(record):
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def as_json(obj):
    # to_dict keeps the members the server sent (extra ones too) under their wire names.
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def run_one(api, base_url, model, case):
    client_name = "py-openai" if api == "openai-chat" else "py-anthropic"
    base = {"case": case, "client": client_name}
    try:
        if api == "openai-chat":
            import openai

            client = openai.OpenAI(base_url=base_url, api_key="sk-compat-test", max_retries=0, timeout=20)
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        elif api == "anthropic-messages":
            import anthropic

            client = anthropic.Anthropic(base_url=base_url, api_key="compat-test", max_retries=0, timeout=20)
            stream = client.messages.create(
                model=model, max_tokens=64, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        else:
            raise SystemExit(f"unknown api {api}")
        for item in stream:
            emit({**base, "kind": "event", "event": as_json(item)})
    except SystemExit:
        raise
    except BaseException as err:  # the harness wants every failure as data, not a traceback
        emit({**base, "kind": "error", "error_type": type(err).__name__, "message": str(err)[:500]})
        return
    emit({**base, "kind": "end"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--api")
    p.add_argument("--base-url")
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--case", default="")
    p.add_argument("--batch", action="store_true")
    a = p.parse_args()
    if a.batch:
        for line in sys.stdin:
            if line.strip():
                r = json.loads(line)
                run_one(r["api"], r["base_url"], r["model"], r["case"])
    else:
        if not a.api or not a.base_url:
            p.error("--api and --base-url are required without --batch")
        run_one(a.api, a.base_url, a.model, a.case)


if __name__ == "__main__":
    main()
