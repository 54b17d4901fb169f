'use strict';
// Core contract cases from Node, with a client written only from the .proto files.
// Starts `agentloop engine serve --adapter fake --port 0` (AGENTLOOP_BIN, default ../../.venv/bin/agentloop),
// or uses a running server at AGENTLOOP_ADDRESS.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const readline = require('node:readline');
const { connect, unary, generate, grpc } = require('../src/client');

let server;
let clients;

function startServer() {
  const bin = process.env.AGENTLOOP_BIN || path.resolve(__dirname, '..', '..', '..', '.venv', 'bin', 'agentloop');
  const child = spawn(bin, ['engine', 'serve', '--adapter', 'fake', '--port', '0', '--set', 'token_latency_s=0.001']);
  return new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: child.stdout });
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`server exited with ${code} before listening`)));
    lines.on('line', (line) => {
      const match = line.match(/listening on (\S+)/);
      if (match) resolve({ child, address: match[1] });
    });
  });
}

async function waitRunning() {
  for (let i = 0; i < 100; i += 1) {
    const info = await unary(clients.control, 'GetServerInfo', {}, 5);
    if (info.state === 'ENGINE_STATE_RUNNING') return info;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('engine never reached ENGINE_STATE_RUNNING');
}

before(async () => {
  let address = process.env.AGENTLOOP_ADDRESS;
  if (!address) {
    server = await startServer();
    address = server.address;
  }
  clients = connect(address);
  await waitRunning();
});

after(async () => {
  if (clients) clients.close();
  if (server) {
    server.child.removeAllListeners('exit'); // the start-up listener
    const exited = new Promise((resolve) => server.child.once('exit', (code) => resolve(code)));
    server.child.kill('SIGTERM');
    assert.equal(await exited, 0, 'server exits 0 on SIGTERM');
  }
});

test('stream_options.final_only: one message carries every token', async () => {
  const request = (id, options) => ({
    request_id: id,
    session_id: 'node',
    prompt_ids: [5, 6, 7],
    sampling_params: { max_new_tokens: 20, ignore_eos: true, logprobs: true, temperature: 0 },
    stream_options: options,
  });
  const streamed = await generate(clients.generate, request('node-final-1', undefined));
  const final = await generate(clients.generate, request('node-final-2', { final_only: true }));
  assert.deepEqual(final.messages.map((m) => m.response), ['complete']);
  assert.deepEqual(final.tokens, streamed.tokens);
  assert.equal(final.tokens.length, 20);
  assert.equal(final.logprobs.length, 20);
  assert.equal(final.complete.completion_tokens, 20);
});

test('GenerateUnary answers in one message what Generate streams', async () => {
  const request = (id) => ({
    request_id: id,
    session_id: 'node',
    prompt_ids: [5, 6, 7],
    sampling_params: { max_new_tokens: 12, ignore_eos: true, logprobs: true, temperature: 0 },
  });
  const streamed = await generate(clients.generate, request('node-unary-1'));
  const response = await unary(clients.generate, 'GenerateUnary', { request: request('node-unary-2') });
  assert.deepEqual(response.chunks, []);
  assert.deepEqual(response.complete.tokens.token_ids, streamed.tokens);
  assert.equal(response.complete.tokens.logprobs.length, 12);
  assert.equal(response.complete.finish_reason, 'FINISH_REASON_LENGTH');
  await assert.rejects(
    unary(clients.generate, 'GenerateUnary', { request: { ...request('node-unary-3'), stream_options: { final_only: true } } }),
    (error) => error.code === grpc.status.INVALID_ARGUMENT && error.details.includes('stream_options'),
  );
});

test('GetServerInfo describes the engine', async () => {
  const info = await unary(clients.control, 'GetServerInfo', {}, 10);
  assert.equal(info.engine_kind, 'fake');
  assert.ok(info.vocab_size > 0);
  assert.ok(info.max_model_len > 0);
  assert.equal(info.state, 'ENGINE_STATE_RUNNING');
});

test('a Generate without max_new_tokens gets the default GetServerInfo reports', async () => {
  const info = await unary(clients.control, 'GetServerInfo', {}, 10);
  assert.ok(info.default_max_new_tokens > 0);
  const result = await generate(clients.generate, {
    request_id: 'node-default-length',
    session_id: 'node',
    prompt_ids: [5, 6, 7],
    sampling_params: { ignore_eos: true },
  });
  assert.equal(result.complete.finish_reason, 'FINISH_REASON_LENGTH');
  assert.equal(result.complete.completion_tokens, info.default_max_new_tokens);
});

test('Generate streams chunks then exactly one complete message', async () => {
  const result = await generate(clients.generate, {
    request_id: 'node-stream-1',
    session_id: 'node',
    prompt_ids: [5, 6, 7],
    sampling_params: { max_new_tokens: 12, ignore_eos: true, logprobs: true, seed: 42 },
  });
  const kinds = result.messages.map((m) => m.response);
  assert.equal(kinds[kinds.length - 1], 'complete');
  assert.equal(kinds.filter((k) => k === 'complete').length, 1);
  assert.ok(kinds.slice(0, -1).every((k) => k === 'chunk'));
  assert.equal(result.tokens.length, 12);
  assert.equal(result.logprobs.length, 12);
  assert.equal(result.complete.finish_reason, 'FINISH_REASON_LENGTH');
  assert.equal(result.complete.completion_tokens, 12);
  assert.equal(result.complete.prompt_tokens, 3);
});

test('the same seed gives the same tokens', async () => {
  const request = (id) => ({
    request_id: id,
    prompt_ids: [9, 8, 7],
    sampling_params: { max_new_tokens: 6, ignore_eos: true, seed: 7 },
  });
  const a = await generate(clients.generate, request('node-seed-a'));
  const b = await generate(clients.generate, request('node-seed-b'));
  assert.deepEqual(a.tokens, b.tokens);
});

test('a bad input is INVALID_ARGUMENT naming the field', async () => {
  await assert.rejects(
    generate(clients.generate, { request_id: 'node-bad-1', prompt_ids: [], sampling_params: { max_new_tokens: 2 } }),
    (error) => error.code === grpc.status.INVALID_ARGUMENT && error.details.includes('prompt_ids'),
  );
  await assert.rejects(
    generate(clients.generate, {
      request_id: 'node-bad-2',
      prompt_ids: [1, 2],
      sampling_params: { temperature: -1, max_new_tokens: 2 },
    }),
    (error) => error.code === grpc.status.INVALID_ARGUMENT && error.details.includes('temperature'),
  );
});

test('an image in the prompt is counted; a bad one is INVALID_ARGUMENT naming media[0]', async () => {
  // a 1 x 1 red PNG; the fake engine takes any span (it has no processor), so 19 ids stand for its expansion
  const red = Buffer.from(
    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==', 'base64');
  const request = (id, data) => ({
    request_id: id,
    session_id: 'node',
    prompt_ids: [1, 2, ...Array(19).fill(7), 3],
    media: [{ mime_type: 'image/png', data, offset: 2, length: 19 }],
    sampling_params: { max_new_tokens: 3, ignore_eos: true },
  });
  const info = await unary(clients.control, 'GetServerInfo', {}, 10);
  assert.equal(info.supports_images, true);
  assert.ok(info.max_images_per_request >= 1);
  const result = await generate(clients.generate, request('node-image-1', red));
  assert.equal(result.complete.prompt_images, 1);
  assert.equal(result.tokens.length, 3);
  await assert.rejects(
    generate(clients.generate, request('node-image-2', red.subarray(0, 20))),
    (error) => error.code === grpc.status.INVALID_ARGUMENT && error.details.startsWith('media[0]: '),
  );
});

test('GetLoad answers after the streams ended', async () => {
  const load = await unary(clients.generate, 'GetLoad', {}, 10);
  assert.equal(load.running_requests, 0);
  assert.ok(load.max_running_requests >= 1);
});
