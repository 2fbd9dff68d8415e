#!/usr/bin/env node
// Client of every OpenAI API the gateway serves, for the end-to-end tests
// (Node.js SDK). The twin of test/clients/apis_openai.py, with the same
// arguments and output contract (see there). Embeddings are requested as
// the SDK requests them by default.
//
// Needs `npm ci` in test/clients (scripts/install-test-deps.sh does it):
//   node test/clients/apis_openai.mjs --api responses --stream \
//       --base-url http://127.0.0.1:10000/v1 --model M --max-tokens 16 --prompt "hi"

import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import OpenAI from 'openai';

const { values: args } = parseArgs({
  args: process.argv.slice(2),
  strict: true,
  options: {
    api: { type: 'string' },
    stream: { type: 'boolean', default: false },
    'base-url': { type: 'string' },
    model: { type: 'string' },
    'max-tokens': { type: 'string', default: '16' },
    prompt: { type: 'string' },
    'api-key': { type: 'string', default: 'sk-test' },
  },
});
for (const name of ['api', 'base-url', 'model', 'prompt']) {
  if (args[name] === undefined) {
    process.stderr.write(`missing required argument --${name}\n`);
    process.exit(2);
  }
}
const maxTokens = Number(args['max-tokens']);

async function run() {
  const client = new OpenAI({ baseURL: args['base-url'], apiKey: args['api-key'], maxRetries: 0, timeout: 60_000 });
  // Node loads its fetch implementation on first use: before the clock.
  await (await fetch('data:,')).arrayBuffer();
  const start = performance.now();
  const ms = () => Math.round(performance.now() - start);
  const out = { request_id: null, events: 0, content: '', usage: null, vectors: null, first_content_ms: null, elapsed_ms: null };
  const content = [];
  const text = (s) => {
    if (s) {
      if (out.first_content_ms === null) out.first_content_ms = ms();
      content.push(s);
    }
  };
  const messages = [{ role: 'user', content: args.prompt }];
  const includeUsage = args.stream ? { stream_options: { include_usage: true } } : {};
  let call;
  switch (args.api) {
    case 'chat':
      call = client.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, stream: args.stream, ...includeUsage });
      break;
    case 'completions':
      call = client.completions.create({ model: args.model, prompt: args.prompt, max_tokens: maxTokens, stream: args.stream, ...includeUsage });
      break;
    case 'embeddings':
      call = client.embeddings.create({ model: args.model, input: args.prompt.split('|') });
      break;
    case 'responses':
      call = client.responses.create({ model: args.model, input: args.prompt, max_output_tokens: maxTokens, stream: args.stream });
      break;
    default:
      throw new Error(`unknown --api ${args.api}`);
  }
  try {
    const { data, response } = await call.withResponse();
    out.request_id = response.headers.get('x-request-id');
    if (args.api === 'embeddings') {
      out.vectors = data.data.map((d) => Array.from(d.embedding));
      out.usage = { input: data.usage.prompt_tokens, output: 0 };
    } else if (args.api === 'responses') {
      if (args.stream) {
        for await (const event of data) {
          out.events += 1;
          if (event.type === 'response.output_text.delta') text(event.delta);
          if (event.type === 'response.completed') {
            out.usage = { input: event.response.usage.input_tokens, output: event.response.usage.output_tokens };
          }
        }
      } else {
        text(data.output_text);
        out.usage = { input: data.usage.input_tokens, output: data.usage.output_tokens };
      }
    } else if (args.stream) {
      for await (const chunk of data) {
        out.events += 1;
        for (const choice of chunk.choices ?? []) text(args.api === 'chat' ? choice.delta?.content : choice.text);
        if (chunk.usage) out.usage = { input: chunk.usage.prompt_tokens, output: chunk.usage.completion_tokens };
      }
    } else {
      const choice = data.choices[0];
      text(args.api === 'chat' ? choice.message.content : choice.text);
      out.usage = { input: data.usage.prompt_tokens, output: data.usage.completion_tokens };
    }
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      return { error: { status: err.status, message: err.message } };
    }
    throw err;
  }
  out.content = content.join('');
  out.elapsed_ms = ms();
  return out;
}

try {
  process.stdout.write(`${JSON.stringify(await run())}\n`);
} catch (err) {
  process.stderr.write(`${err?.stack ?? err}\n`);
  process.exitCode = 1;
}
