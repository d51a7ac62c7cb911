// Drives kvx serve with the official openai client, as a user would: the
// Go test (TestServeOpenAIClient) starts the server, runs this with
// KVX_BASE_URL set, and checks the JSON it prints against kvx generate.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.KVX_BASE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const c = await client.completions.create({ model: out.models[0], prompt: "kvx generates", max_tokens: 12 });
out.completion = { text: c.choices[0].text, usage: c.usage };

let text = "";
let usage = null;
const s = await client.completions.create({
  model: out.models[0], prompt: "kvx generates", max_tokens: 12, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of s) {
  for (const ch of chunk.choices) text += ch.text;
  if (chunk.usage) usage = chunk.usage;
}
out.stream = { text, usage };

const chat = await client.chat.completions.create({
  model: out.models[0], messages: [{ role: "user", content: "hello" }], max_tokens: 6,
});
out.chat = { text: chat.choices[0].message.content, usage: chat.usage };

let chatText = "";
const cs = await client.chat.completions.create({
  model: out.models[0], messages: [{ role: "user", content: "hello" }], max_tokens: 6, stream: true,
});
for await (const chunk of cs) chatText += chunk.choices[0]?.delta?.content ?? "";
out.chatStream = { text: chatText };

try {
  await client.completions.create({ model: out.models[0], prompt: "x", max_tokens: 0 });
  out.badRequest = "accepted";
} catch (e) {
  out.badRequest = { status: e.status, message: e.error?.message ?? e.message };
}

console.log(JSON.stringify(out));
