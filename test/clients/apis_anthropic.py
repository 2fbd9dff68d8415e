#!/usr/bin/env python3
"""Anthropic Messages client for the end-to-end tests (Python SDK).

Sends one request through the official `anthropic` SDK and prints exactly
one JSON object on stdout, in the contract of test/clients/apis_openai.py
(no vectors; "input_tokens" for count_tokens):

  --call create          messages.create (with --stream: stream=True, the raw events)
  --call stream          messages.stream (the SDK's streaming helper)
  --call count_tokens    messages.count_tokens

The gateway key goes as Anthropic's clients send it: x-api-key. An API
error prints {"error": {"status": N, "type": "...", "message": "..."}} and
exits 0; anything else exits 1.

Run with the venv made by scripts/install-test-deps.sh:
  .tools/py-venv/bin/python test/clients/apis_anthropic.py --call stream \\
      --base-url http://127.0.0.1:10000 --model M --max-tokens 16 --prompt "hi"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anthropic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--call", required=True, choices=["create", "stream", "count_tokens"])
    p.add_argument("--stream", action="store_true", help="with --call create: stream=True")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:10000 (the SDK adds /v1)")
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", required=True)
    p.add_argument("--api-key", default="sk-test")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60.0)
    messages = client.messages  # loaded lazily: before the clock
    start = time.perf_counter()
    ms = lambda: round((time.perf_counter() - start) * 1000)  # noqa: E731
    out: dict[str, Any] = {"request_id": None, "events": 0, "content": "", "usage": None,
                           "first_content_ms": None, "elapsed_ms": None}
    content: list[str] = []

    def text(s: str | None) -> None:
        if s:
            if out["first_content_ms"] is None:
                out["first_content_ms"] = ms()
            content.append(s)

    req = {"model": args.model, "messages": [{"role": "user", "content": args.prompt}]}
    try:
        if args.call == "count_tokens":
            raw = messages.with_raw_response.count_tokens(**req)
            out["request_id"] = raw.headers.get("x-request-id")
            out["input_tokens"] = raw.parse().input_tokens
        elif args.call == "stream":
            with messages.stream(max_tokens=args.max_tokens, **req) as stream:
                out["request_id"] = stream.response.headers.get("x-request-id")
                for event in stream:
                    out["events"] += 1
                    if event.type == "text":
                        text(event.text)
                final = stream.get_final_message()
            out["usage"] = {"input": final.usage.input_tokens, "output": final.usage.output_tokens}
        elif args.stream:
            raw = messages.with_raw_response.create(max_tokens=args.max_tokens, stream=True, **req)
            out["request_id"] = raw.headers.get("x-request-id")
            usage = {"input": None, "output": None}
            for event in raw.parse():
                out["events"] += 1
                if event.type == "message_start":
                    usage["input"] = event.message.usage.input_tokens
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text(event.delta.text)
                elif event.type == "message_delta":
                    usage["output"] = event.usage.output_tokens
            out["usage"] = usage
        else:
            raw = messages.with_raw_response.create(max_tokens=args.max_tokens, **req)
            out["request_id"] = raw.headers.get("x-request-id")
            msg = raw.parse()
            for block in msg.content:
                if block.type == "text":
                    text(block.text)
            out["usage"] = {"input": msg.usage.input_tokens, "output": msg.usage.output_tokens}
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        return {"error": {"status": e.status_code, "type": err.get("type"), "message": err.get("message", e.message)}}
    out["content"] = "".join(content)
    out["elapsed_ms"] = ms()
    return out


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(json.dumps(run(parse_args(argv))) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
