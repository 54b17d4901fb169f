'use strict';
// ToolExecute from Node, with a client written only from the .proto files: the built-in tools server.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const readline = require('node:readline');
const { connect, unary, grpc } = require('../src/client');

const ROOT = path.resolve(__dirname, '..', '..', '..');
let server;
let clients;

before(async () => {
  const bin = process.env.AGENTLOOP_BIN || path.join(ROOT, '.venv', 'bin', 'agentloop');
  const child = spawn(bin, ['tools', 'serve', '--config', path.join(ROOT, 'agentloop_grpc', 'tools', 'builtin.yaml'), '--port', '0']);
  const address = await new Promise((resolve, reject) => {
    child.on('error', reject);
    child.once('exit', (code) => reject(new Error(`tools server exited with ${code}`)));
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const match = line.match(/listening on (\S+)/);
      if (match) resolve(match[1]);
    });
  });
  server = child;
  clients = connect(address);
});

after(async () => {
  clients.close();
  server.removeAllListeners('exit');
  const exited = new Promise((resolve) => server.once('exit', (code) => resolve(code)));
  server.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('ListTools returns the built-ins with JSON schemas', async () => {
  const response = await unary(clients.tools, 'ListTools', {});
  const names = response.tools.map((t) => t.name).sort();
  assert.deepEqual(names, ['calculator', 'check_answer', 'python']);
  const calculator = response.tools.find((t) => t.name === 'calculator');
  assert.deepEqual(JSON.parse(calculator.parameters_json_schema).required, ['expression']);
});

test('an instance computes, a tool error is a normal response, release is idempotent', async () => {
  const { instance_id } = await unary(clients.tools, 'CreateInstance', { tool_name: 'calculator', trajectory_id: 'node' });
  const ok = await unary(clients.tools, 'Execute', { instance_id, arguments_json: '{"expression": "6 * 7"}' });
  assert.equal(ok.content, '42');
  assert.equal(ok.tool_error, null);
  const bad = await unary(clients.tools, 'Execute', { instance_id, arguments_json: '{"expression": "1 / 0"}' });
  assert.equal(bad.tool_error.kind, 'TOOL_ERROR_KIND_EXCEPTION');
  await unary(clients.tools, 'ReleaseInstance', { instance_id });
  await unary(clients.tools, 'ReleaseInstance', { instance_id });
});

test('an unknown tool is NOT_FOUND', async () => {
  await assert.rejects(
    unary(clients.tools, 'CreateInstance', { tool_name: 'nope', trajectory_id: 'node' }),
    (error) => error.code === grpc.status.NOT_FOUND,
  );
});
