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

// Seeded sampling: the same seed twice gives the same text (and kvx
// generate's, which the Go test checks).
const sampled = { model: out.models[0], prompt: "kvx generates", max_tokens: 12, temperature: 1.1, top_p: 0.9, seed: 11 };
const s1 = await client.completions.create(sampled);
const s2 = await client.completions.create(sampled);
out.sampled = { text: s1.choices[0].text, again: s2.choices[0].text, finish: s1.choices[0].finish_reason };

// n: two choices, choice 1 with the next seed.
const n2 = await client.completions.create({ ...sampled, n: 2 });
const n2chat = await client.chat.completions.create({
  model: out.models[0], messages: [{ role: "user", content: "hello" }], max_tokens: 6, n: 2, temperature: 1.1, seed: 11,
});
out.n = {
  texts: n2.choices.map((c) => c.text), indexes: n2.choices.map((c) => c.index), usage: n2.usage,
  chat: n2chat.choices.map((c) => c.message.content),
};

// n 4, streamed and not: choice i with seed 11 + i; the stream's chunks
// name their index, and its usage chunk counts the prompt once.
const n4 = await client.completions.create({ ...sampled, n: 4 });
const n4s = await client.completions.create({ ...sampled, n: 4, stream: true, stream_options: { include_usage: true } });
const byIndex = ["", "", "", ""];
let n4usage = null;
for await (const chunk of n4s) {
  for (const ch of chunk.choices) byIndex[ch.index] += ch.text;
  if (chunk.usage) n4usage = chunk.usage;
}
out.n4 = { texts: n4.choices.map((c) => c.text), stream: byIndex, usage: n4.usage, streamUsage: n4usage };

// stop: two letters or digits of the greedy completion's text.
const m = /[a-zA-Z0-9]{2}/.exec(out.completion.text.slice(1));
if (m) {
  const stop = m[0];
  const st = await client.completions.create({ model: out.models[0], prompt: "kvx generates", max_tokens: 12, stop: [stop] });
  let stText = "";
  let stFinish = null;
  const ss = await client.completions.create({
    model: out.models[0], prompt: "kvx generates", max_tokens: 12, stop: [stop], stream: true,
  });
  for await (const chunk of ss) {
    for (const ch of chunk.choices) {
      stText += ch.text;
      if (ch.finish_reason) stFinish = ch.finish_reason;
    }
  }
  out.stop = { stop, text: st.choices[0].text, finish: st.choices[0].finish_reason, streamText: stText, streamFinish: stFinish };
}

// logprobs: completions (logprobs: N) and chat (logprobs + top_logprobs).
const lp = await client.completions.create({ model: out.models[0], prompt: "kvx generates", max_tokens: 12, logprobs: 2 });
out.logprobs = lp.choices[0].logprobs;
const clp = await client.chat.completions.create({
  model: out.models[0], messages: [{ role: "user", content: "hello" }], max_tokens: 6, logprobs: true, top_logprobs: 2,
});
out.chatLogprobs = clp.choices[0].logprobs;

try {
  await client.completions.create({ model: out.models[0], prompt: "x", max_tokens: 0 });
  out.badRequest = "accepted";
} catch (e) {
  out.badRequest = { status: e.status, message: e.error?.message ?? e.message };
}

console.log(JSON.stringify(out));
