#!/usr/bin/env node
// Streaming chat-completion client for the end-to-end tests (Node.js SDK).
//
// Sends one streaming chat completion through the official `openai` npm
// package and prints exactly one JSON object on stdout. It is the twin of
// test/clients/stream_openai.py and follows the same contract:
//
// Success:
//   {"chunks": <chunks received, role/finish/usage chunks included>,
//    "content": "<concatenated delta.content>",
//    "usage": {"prompt_tokens": N, "completion_tokens": N, "total_tokens": N} | null,
//    "finish_reason": "<last finish_reason seen>" | null,
//    "first_content_ms": <int ms from request start to first non-empty content delta> | null,
//    "elapsed_ms": <int ms from request start to end of stream>}
//
// API error (exit status 0, so the caller can assert on it):
//   {"error": {"status": <HTTP status>, "message": "...", "type": "..." | null, "code": ... | null}}
//   - HTTP error status: status is the HTTP status; message/type/code come
//     from the body's "error" object (or the body itself / its raw text).
//   - Error event inside a 200 stream: status is the stream's HTTP status
//     (200), message/type/code come from the event's "error" object.
//
// Anything else (connection refused, timeout, malformed stream) exits 1 with
// the stack trace on stderr; bad arguments exit 2.
//
// With --lockstep ID --ack-url URL the request asks the mock for a lock-step
// stream (x-mock-lockstep: ID) and, as each chunk arrives, tells the mock at
// URL (POST URL/mock/lockstep/ID/ack?n=<chunk number>): the mock writes the
// next event only then, so a gateway that buffers the stream deadlocks it.
//
// Needs `npm ci` in test/clients (scripts/install-test-deps.sh does it):
//   node test/clients/stream_openai.mjs \
//       --base-url http://127.0.0.1:10000/v1 --model M --max-tokens 16 --prompt "hi"

import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import OpenAI from 'openai';

function usage(message) {
  process.stderr.write(
    `${message}\nusage: stream_openai.mjs --base-url URL --model M --max-tokens N --prompt TEXT [--api-key K]\n`,
  );
  process.exit(2);
}

function parseCli(argv) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        'base-url': { type: 'string' },
        model: { type: 'string' },
        'max-tokens': { type: 'string' },
        prompt: { type: 'string' },
        'api-key': { type: 'string', default: 'sk-test' },
        lockstep: { type: 'string' },
        'ack-url': { type: 'string' },
      },
    }));
  } catch (err) {
    usage(err.message);
  }
  for (const name of ['base-url', 'model', 'max-tokens', 'prompt']) {
    if (values[name] === undefined) usage(`missing required argument --${name}`);
  }
  const maxTokens = Number(values['max-tokens']);
  if (!Number.isInteger(maxTokens)) usage(`--max-tokens must be an integer, got '${values['max-tokens']}'`);
  return {
    baseURL: values['base-url'],
    model: values.model,
    maxTokens,
    prompt: values.prompt,
    apiKey: values['api-key'],
    lockstep: values.lockstep,
    ackURL: values['ack-url'],
  };
}

// ack tells the mock that chunk n arrived (lock-step streams only).
async function ack(opts, n) {
  if (!opts.lockstep) return;
  const res = await fetch(`${opts.ackURL}/mock/lockstep/${opts.lockstep}/ack?n=${n}`, { method: 'POST' });
  if (!res.ok) throw new Error(`lock-step ack ${n}: status ${res.status}`);
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// message/type/code from an error body, interpreted as the Python client does.
// body: decoded JSON body (or the error event's "error" value);
// rawText: the undecoded HTTP body, used when body carries no message.
function errorFields(body, rawText) {
  const err = isObject(body) && 'error' in body ? body.error : body;
  if (isObject(err)) {
    let message = err.message ?? null;
    if (message !== null && typeof message !== 'string') message = JSON.stringify(message);
    if (message === null) message = rawText ? rawText : JSON.stringify(err);
    return { message, type: err.type ?? null, code: err.code ?? null };
  }
  if (typeof err === 'string') return { message: err, type: null, code: null };
  return { message: rawText ?? '', type: null, code: null };
}

function httpErrorJSON(status, text) {
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: fall back to the raw text
  }
  return { error: { status, ...errorFields(body, text.trim()) } };
}

async function run(opts) {
  // The SDK keeps only the decoded "error" member of an error body; keep the
  // raw body of HTTP errors too, so both clients report the same message.
  let lastErrorBody = null;
  const captureFetch = async (url, init) => {
    const res = await fetch(url, init);
    if (!res.ok) lastErrorBody = await res.clone().text();
    return res;
  };

  const client = new OpenAI({
    baseURL: opts.baseURL,
    apiKey: opts.apiKey,
    maxRetries: 0,
    timeout: 60_000,
    fetch: captureFetch,
  });

  let chunks = 0;
  const content = [];
  let usageOut = null;
  let finishReason = null;
  let firstContentMs = null;
  let response = null;

  // Node loads its fetch implementation on first use (~20-30 ms); do that
  // with a local data: URL (no network) before starting the clock, so the
  // timings measure the request rather than module loading.
  await (await fetch('data:,')).arrayBuffer();

  const start = performance.now();
  const elapsedMs = () => Math.round(performance.now() - start);
  try {
    const { data: stream, response: res } = await client.chat.completions
      .create({
        model: opts.model,
        messages: [{ role: 'user', content: opts.prompt }],
        max_tokens: opts.maxTokens,
        stream: true,
        stream_options: { include_usage: true },
      }, opts.lockstep ? { headers: { 'x-mock-lockstep': opts.lockstep } } : undefined)
      .withResponse();
    response = res;
    for await (const chunk of stream) {
      await ack(opts, chunks);
      chunks += 1;
      if (chunk.usage) {
        usageOut = {
          prompt_tokens: chunk.usage.prompt_tokens,
          completion_tokens: chunk.usage.completion_tokens,
          total_tokens: chunk.usage.total_tokens,
        };
      }
      for (const choice of chunk.choices ?? []) {
        const text = choice?.delta?.content;
        if (text) {
          if (firstContentMs === null) firstContentMs = elapsedMs();
          content.push(text);
        }
        if (choice?.finish_reason) finishReason = choice.finish_reason;
      }
    }
  } catch (err) {
    // Connection failures and timeouts are not API answers: rethrow (exit 1).
    if (err instanceof OpenAI.APIConnectionError || err instanceof OpenAI.APIUserAbortError) throw err;
    if (err instanceof OpenAI.APIError) {
      if (err.status !== undefined) {
        return httpErrorJSON(err.status, lastErrorBody ?? '');
      }
      // An error event inside an otherwise successful (HTTP 200) stream.
      return { error: { status: response?.status ?? 200, ...errorFields(err.error, err.message) } };
    }
    throw err;
  }

  return {
    chunks,
    content: content.join(''),
    usage: usageOut,
    finish_reason: finishReason,
    first_content_ms: firstContentMs,
    elapsed_ms: elapsedMs(),
  };
}

try {
  const result = await run(parseCli(process.argv.slice(2)));
  process.stdout.write(`${JSON.stringify(result)}\n`);
} catch (err) {
  process.stderr.write(`${err?.stack ?? err}\n`);
  for (let cause = err?.cause, depth = 0; cause && depth < 5; cause = cause.cause, depth++) {
    process.stderr.write(`caused by: ${cause?.stack ?? cause}\n`);
  }
  process.exitCode = 1;
}
