#!/usr/bin/env python3
"""The plainest streaming loops of the official `openai` SDK, as a user
writes them (no stream_options, choices[0] read unguarded), for the
end-to-end tests. Prints the streamed text and nothing else on stdout; an
exception (IndexError on a chunk with no choices) exits 1.

  plain_loop.py --base-url URL --api-key KEY --model M --api chat|completions|responses --prompt P
"""

import argparse

import openai

p = argparse.ArgumentParser()
for a in ("--base-url", "--api-key", "--model", "--api", "--prompt"):
    p.add_argument(a, required=True)
args = p.parse_args()
client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)

if args.api == "chat":
    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": args.prompt}], max_tokens=16, stream=True)
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="")
elif args.api == "completions":
    stream = client.completions.create(model=args.model, prompt=args.prompt, max_tokens=16, stream=True)
    for chunk in stream:
        print(chunk.choices[0].text, end="")
else:
    stream = client.responses.create(model=args.model, input=args.prompt, max_output_tokens=16, stream=True)
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="")
