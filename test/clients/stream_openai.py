#!/usr/bin/env python3
"""Streaming chat-completion client for the end-to-end tests (Python SDK).

Sends one streaming chat completion through the official `openai` SDK and
prints exactly one JSON object on stdout. test/clients/stream_openai.mjs is
the Node.js twin and follows the same contract.

Success:
  {"chunks": <chunks received, role/finish/usage chunks included>,
   "content": "<concatenated delta.content>",
   "usage": {"prompt_tokens": N, "completion_tokens": N, "total_tokens": N} | null,
   "finish_reason": "<last finish_reason seen>" | null,
   "first_content_ms": <int ms from request start to first non-empty content delta> | null,
   "elapsed_ms": <int ms from request start to end of stream>}

API error (exit status 0, so the caller can assert on it):
  {"error": {"status": <HTTP status>, "message": "...", "type": "..." | null, "code": ... | null}}
  - HTTP error status: status is the HTTP status; message/type/code come from
    the body's "error" object (or the body itself / its raw text otherwise).
  - Error event inside a 200 stream: status is the stream's HTTP status (200),
    message/type/code come from the event's "error" object.

Anything else (connection refused, timeout, malformed stream) exits 1 with a
traceback on stderr; bad arguments exit 2.

With --lockstep ID --ack-url URL the request asks the mock for a lock-step
stream (x-mock-lockstep: ID) and, as each chunk arrives, tells the mock at
URL (POST URL/mock/lockstep/ID/ack?n=<chunk number>): the mock writes the
next event only then, so a gateway that buffers the stream deadlocks it.

Run with the venv made by scripts/install-test-deps.sh:
  .tools/py-venv/bin/python test/clients/stream_openai.py \
      --base-url http://127.0.0.1:10000/v1 --model M --max-tokens 16 --prompt "hi"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from typing import Any

import openai


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:10000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--api-key", default="sk-test")
    p.add_argument("--lockstep", help="the mock's lock-step stream id")
    p.add_argument("--ack-url", help="the mock's base URL, for lock-step acknowledgements")
    return p.parse_args(argv)


def ack(args: argparse.Namespace, n: int) -> None:
    """Tells the mock that chunk n arrived (lock-step streams only)."""
    if not args.lockstep:
        return
    url = f"{args.ack_url}/mock/lockstep/{args.lockstep}/ack?n={n}"
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10).close()


def elapsed_ms(start: float) -> int:
    return round((time.perf_counter() - start) * 1000)


def error_fields(body: Any, raw_text: str | None) -> dict[str, Any]:
    """message/type/code from an error body, as the SDKs interpret it.

    body is the decoded JSON body (or the error event's "error" value);
    raw_text is the undecoded HTTP body, used when body carries no message.
    """
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        message = err.get("message")
        if message is not None and not isinstance(message, str):
            message = json.dumps(message)
        if message is None:
            message = raw_text if raw_text else json.dumps(err)
        return {"message": message, "type": err.get("type"), "code": err.get("code")}
    if isinstance(err, str):
        return {"message": err, "type": None, "code": None}
    return {"message": raw_text or "", "type": None, "code": None}


def http_error_json(status: int, text: str) -> dict[str, Any]:
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return {"error": {"status": status, **error_fields(body, text.strip())}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    client = openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        max_retries=0,
        timeout=60.0,
    )

    chunks = 0
    content: list[str] = []
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    first_content_ms: int | None = None
    stream = None

    # The SDK imports its resource modules lazily on first attribute access
    # (~0.4 s); do that before starting the clock so the timings measure the
    # request, not the import.
    completions = client.chat.completions

    start = time.perf_counter()
    try:
        stream = completions.create(
            model=args.model,
            messages=[{"role": "user", "content": args.prompt}],
            max_tokens=args.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-mock-lockstep": args.lockstep} if args.lockstep else None,
        )
        for chunk in stream:
            ack(args, chunks)
            chunks += 1
            if chunk.usage is not None:
                usage = {
                    "prompt_tokens": chunk.usage.prompt_tokens,
                    "completion_tokens": chunk.usage.completion_tokens,
                    "total_tokens": chunk.usage.total_tokens,
                }
            for choice in chunk.choices or []:
                delta = getattr(choice, "delta", None)
                text = getattr(delta, "content", None) if delta is not None else None
                if text:
                    if first_content_ms is None:
                        first_content_ms = elapsed_ms(start)
                    content.append(text)
                if choice.finish_reason:
                    finish_reason = choice.finish_reason
    except openai.APIConnectionError:
        # Includes timeouts: not an API answer, let the caller see a failure.
        raise
    except openai.APIStatusError as e:
        return http_error_json(e.status_code, e.response.text)
    except openai.APIError as e:
        # An error event inside an otherwise successful (HTTP 200) stream.
        status = stream.response.status_code if stream is not None else 200
        return {"error": {"status": status, **error_fields(e.body, e.message)}}

    return {
        "chunks": chunks,
        "content": "".join(content),
        "usage": usage,
        "finish_reason": finish_reason,
        "first_content_ms": first_content_ms,
        "elapsed_ms": elapsed_ms(start),
    }


def main(argv: list[str] | None = None) -> int:
    result = run(parse_args(argv))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
