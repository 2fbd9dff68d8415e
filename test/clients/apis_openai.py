#!/usr/bin/env python3
"""Client of every OpenAI API the gateway serves, for the end-to-end tests
(Python SDK).

Sends one request through the official `openai` SDK, in the SDK's own way
for each API, and prints exactly one JSON object on stdout.
test/clients/apis_openai.mjs is the Node.js twin and follows the same
contract:

  {"request_id": "<the response's x-request-id>",
   "events": <stream events or chunks received; 0 when not streamed>,
   "content": "<the output text: delta contents, or the answer's text>",
   "usage": {"input": N, "output": N} | null,
   "vectors": [[float, ...], ...] | null   (embeddings, decoded by the SDK),
   "first_content_ms": <ms from the request to the first content> | null,
   "elapsed_ms": <ms from the request to the end>}

--api is chat, completions, embeddings or responses; --stream streams (not
for embeddings). Embeddings are requested as the SDK requests them by
default (the Python SDK asks for base64 and decodes it). An API error
prints {"error": {"status": N, "message": "..."}} and exits 0; anything
else exits 1.

Run with the venv made by scripts/install-test-deps.sh:
  .tools/py-venv/bin/python test/clients/apis_openai.py --api responses \\
      --stream --base-url http://127.0.0.1:10000/v1 --model M --max-tokens 16 --prompt "hi"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import openai


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", required=True, choices=["chat", "completions", "embeddings", "responses"])
    p.add_argument("--stream", action="store_true")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:10000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", required=True, help="for embeddings: inputs separated by '|'")
    p.add_argument("--api-key", default="sk-test")
    return p.parse_args(argv)


class Result:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.events = 0
        self.content: list[str] = []
        self.first_content_ms: int | None = None
        self.usage: dict[str, int] | None = None
        self.vectors: list[list[float]] | None = None
        self.request_id: str | None = None

    def ms(self) -> int:
        return round((time.perf_counter() - self.start) * 1000)

    def text(self, s: str | None) -> None:
        if s:
            if self.first_content_ms is None:
                self.first_content_ms = self.ms()
            self.content.append(s)

    def json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "events": self.events,
            "content": "".join(self.content),
            "usage": self.usage,
            "vectors": self.vectors,
            "first_content_ms": self.first_content_ms,
            "elapsed_ms": self.ms(),
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60.0)
    # Import the resource modules lazily loaded on first use before the clock.
    resource = {"chat": client.chat.completions, "completions": client.completions,
                "embeddings": client.embeddings, "responses": client.responses}[args.api].with_raw_response
    r = Result()
    messages = [{"role": "user", "content": args.prompt}]
    try:
        if args.api == "chat":
            raw = resource.create(model=args.model, messages=messages, max_tokens=args.max_tokens, stream=args.stream,
                                  **({"stream_options": {"include_usage": True}} if args.stream else {}))
            r.request_id = raw.headers.get("x-request-id")
            out = raw.parse()
            if args.stream:
                for chunk in out:
                    r.events += 1
                    for choice in chunk.choices or []:
                        r.text(choice.delta.content)
                    if chunk.usage is not None:
                        r.usage = {"input": chunk.usage.prompt_tokens, "output": chunk.usage.completion_tokens}
            else:
                r.text(out.choices[0].message.content)
                r.usage = {"input": out.usage.prompt_tokens, "output": out.usage.completion_tokens}
        elif args.api == "completions":
            raw = resource.create(model=args.model, prompt=args.prompt, max_tokens=args.max_tokens, stream=args.stream,
                                  **({"stream_options": {"include_usage": True}} if args.stream else {}))
            r.request_id = raw.headers.get("x-request-id")
            out = raw.parse()
            if args.stream:
                for chunk in out:
                    r.events += 1
                    for choice in chunk.choices or []:
                        r.text(choice.text)
                    if chunk.usage is not None:
                        r.usage = {"input": chunk.usage.prompt_tokens, "output": chunk.usage.completion_tokens}
            else:
                r.text(out.choices[0].text)
                r.usage = {"input": out.usage.prompt_tokens, "output": out.usage.completion_tokens}
        elif args.api == "embeddings":
            raw = resource.create(model=args.model, input=args.prompt.split("|"))
            r.request_id = raw.headers.get("x-request-id")
            out = raw.parse()
            r.vectors = [list(d.embedding) for d in out.data]
            r.usage = {"input": out.usage.prompt_tokens, "output": 0}
        else:  # responses
            raw = resource.create(model=args.model, input=args.prompt, max_output_tokens=args.max_tokens,
                                  stream=args.stream)
            r.request_id = raw.headers.get("x-request-id")
            out = raw.parse()
            if args.stream:
                for event in out:
                    r.events += 1
                    if event.type == "response.output_text.delta":
                        r.text(event.delta)
                    elif event.type == "response.completed":
                        u = event.response.usage
                        r.usage = {"input": u.input_tokens, "output": u.output_tokens}
            else:
                r.text(out.output_text)
                r.usage = {"input": out.usage.input_tokens, "output": out.usage.output_tokens}
    except openai.APIStatusError as e:
        return {"error": {"status": e.status_code, "message": e.message}}
    return r.json()


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(json.dumps(run(parse_args(argv))) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
