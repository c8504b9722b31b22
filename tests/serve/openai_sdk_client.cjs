// `microllm serve` through the official OpenAI SDK for Node.js (the npm package openai, installed by
// scripts/fetch-node-tools.sh): models, completions and chat completions, streamed (with
// stream_options.include_usage) and not, the SDK's error classes for refused requests, and, when given a file
// to signal, a stream that the server's shutdown ends: the SDK must raise an APIError (the error event), not
// stop quietly or fail to parse. Run by tests/serve/serve_clients.sh (mode openai-sdk):
//   node tests/serve/openai_sdk_client.cjs BASE_URL NODE_DIR [SHUTDOWN_SIGNAL_FILE]
// Prints "ok ..." per check and "all checks passed"; exit code 1 on any failure.
const fs = require('fs');
const path = require('path');

const [base, nodeDir, signalFile] = process.argv.slice(2);
const OpenAI = require(path.join(nodeDir, 'node_modules', 'openai')).default;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
}

async function expectError(call, status, param, what) {
  try {
    await call();
    check(false, `${what}: accepted`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status && (param === null || e.param === param),
          `${what}: ${e.constructor.name} ${e.status} param ${e.param} (${e.message})`);
  }
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'tiny', 'models.list');
  check((await client.models.retrieve('tiny')).id === 'tiny', 'models.retrieve');

  const request = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(request);
  check(typeof whole.choices[0].text === 'string' && whole.usage.prompt_tokens === 16, 'completions.create');
  let text = '', usage = null, finish = null;
  for await (const chunk of await client.completions.create({ ...request, stream: true,
                                                             stream_options: { include_usage: true } })) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === whole.choices[0].text && finish === whole.choices[0].finish_reason, 'a stream says what the whole says');
  check(JSON.stringify(usage) === JSON.stringify(whole.usage), `the stream's usage chunk ${JSON.stringify(usage)}`);

  const chat = { model: 'tiny', messages: [{ role: 'user', content: 'Hi!' }], max_tokens: 10, temperature: 0 };
  const reply = await client.chat.completions.create(chat);
  check(reply.choices[0].message.role === 'assistant', 'chat.completions.create');
  let content = '';
  for await (const chunk of await client.chat.completions.create({ ...chat, stream: true })) {
    content += chunk.choices[0]?.delta?.content ?? '';
  }
  check(content === reply.choices[0].message.content, 'a chat stream says what the whole says');
  const biased = await client.chat.completions.create({ ...chat, logit_bias: { 65: 100 }, max_tokens: 4 });
  check(biased.choices[0].message.content === 'AAAA', `logit_bias +100 on 'A': ${JSON.stringify(biased.choices[0].message.content)}`);

  await expectError(() => client.completions.create({ ...request, n: 2 }), 400, 'n', 'n = 2');
  await expectError(() => client.chat.completions.create({ ...chat, tools: [{ type: 'function',
                                                                             function: { name: 'f' } }] }),
                    400, 'tools', 'tools');
  await expectError(() => client.completions.create({ ...request, temprature: 0 }), 400, 'temprature',
                    'an unknown field');
  await expectError(() => client.models.retrieve('gpt-4o'), 404, null, 'models.retrieve of another model');
  await expectError(() => client.completions.create({ ...request, model: 'gpt-4o' }), 404, 'model',
                    'another model');

  if (signalFile) {  // the caller sends SIGTERM to the server once this file exists
    let chunks = 0;
    try {
      const stream = await client.completions.create({ model: 'tiny', prompt: 'Go on', max_tokens: 400,
                                                       temperature: 1, logit_bias: { 256: -100, 258: -100 },
                                                       stream: true });
      for await (const chunk of stream) {
        if (chunks++ === 0) fs.writeFileSync(signalFile, 'streaming\n');
        if (chunk.choices[0]?.finish_reason) check(false, `the stream finished (${chunk.choices[0].finish_reason})`);
      }
      check(false, `the shutdown ended the stream quietly after ${chunks} chunks`);
    } catch (e) {
      check(e instanceof OpenAI.APIError && /shutting down/.test(e.message),
            `the shutdown is an APIError after ${chunks} chunks: ${e.constructor.name}: ${e.message}`);
    }
  }
}

main().then(() => {
  console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}, (e) => {
  console.log(`FAIL ${e.stack}`);
  process.exit(1);
});
