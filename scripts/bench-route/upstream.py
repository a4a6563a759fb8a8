#!/usr/bin/env python3
"""A tiny keep-alive OpenAI-compatible upstream for the route benchmark (stdlib only).

Serves one fixed chat-completion event stream for every POST, with Content-Length and
keep-alive, so the benchmark measures what sits between the client and the upstream rather than
connection set-up or the upstream's own work. The body is built once at start.

    upstream.py deltas50|mb1 MODEL      prints "listening on http://127.0.0.1:PORT/v1", then serves
"""
import asyncio
import json
import sys


def chunk(model, delta, finish=None):
    return "data: " + json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1764547200,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        },
        separators=(",", ":"),
    ) + "\n\n"


def body(kind, model):
    words = [" The", " route", " checks", " every", " chunk", " before", " the", " client", " reads", " it."]
    parts = [chunk(model, {"role": "assistant", "content": ""})]
    if kind == "deltas50":
        parts += [chunk(model, {"content": words[i % len(words)]}) for i in range(50)]
    elif kind == "mb1":
        size, i = 0, 0
        while size < 1 << 20:
            # Longer deltas, as a fast model sends them; some escapes and non-ASCII text.
            p = chunk(model, {"content": "".join(words) + (" caf\u00e9\n" if i % 7 == 0 else " ok")})
            parts.append(p)
            size += len(p)
            i += 1
    else:
        sys.exit(f"unknown answer {kind!r}: use deltas50 or mb1")
    parts.append(chunk(model, {}, "stop"))
    parts.append("data: " + json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1764547200,
                                         "model": model, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 50}},
                                        separators=(",", ":")) + "\n\n")
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


async def main():
    kind, model = sys.argv[1], sys.argv[2]
    payload = body(kind, model)
    response = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        + f"content-length: {len(payload)}\r\n".encode()
        + b"connection: keep-alive\r\n\r\n"
        + payload
    )

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length, chunked = 0, False
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"transfer-encoding" and b"chunked" in value.lower():
                        chunked = True
                if chunked:
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        await reader.readexactly(size + 2)
                        if size == 0:
                            break
                else:
                    await reader.readexactly(length)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/v1 ({len(payload)} bytes per answer)", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
