// The plainest streaming loops of the official `openai` Node SDK, as a user
// writes them (no stream_options, choices[0] read unguarded), for the
// end-to-end tests: test/clients/plain_loop.py's twin, same arguments and
// output (the streamed text; a TypeError on a chunk with no choices exits 1).
import OpenAI from "openai";
import { parseArgs } from "node:util";

const opt = { type: "string" };
const { values: a } = parseArgs({
  options: { "base-url": opt, "api-key": opt, model: opt, api: opt, prompt: opt },
});
const client = new OpenAI({ baseURL: a["base-url"], apiKey: a["api-key"] });

if (a.api === "chat") {
  const stream = await client.chat.completions.create({
    model: a.model, messages: [{ role: "user", content: a.prompt }], max_tokens: 16, stream: true,
  });
  for await (const chunk of stream) process.stdout.write(chunk.choices[0].delta.content || "");
} else if (a.api === "completions") {
  const stream = await client.completions.create({ model: a.model, prompt: a.prompt, max_tokens: 16, stream: true });
  for await (const chunk of stream) process.stdout.write(chunk.choices[0].text);
} else {
  const stream = await client.responses.create({ model: a.model, input: a.prompt, max_output_tokens: 16, stream: true });
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") process.stdout.write(event.delta);
  }
}
