'use strict';
// TLS and bearer tokens from Node: a fake engine server started with a certificate made here by openssl and with
// a user and an admin token; the client reaches it through the same security fields as a discovery file.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');
const readline = require('node:readline');
const { connect, readDiscovery, unary, generate, grpc } = require('../src/client');

const TOKEN = 'node-user-token-5a1';
const ADMIN_TOKEN = 'node-admin-token-c07';
let dir;
let server;
let address;

function openssl(...args) {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
}

function makeCertificates() {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-subj', '/CN=node-test-ca', '-days', '1',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  openssl('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  fs.writeFileSync(path.join(dir, 'server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
    '-out', 'server.pem', '-days', '1', '-extfile', 'server.ext');
  openssl('req', '-x509', ...ec, '-keyout', 'rogue.key', '-out', 'rogue.pem', '-subj', '/CN=rogue', '-days', '1');
  fs.writeFileSync(path.join(dir, 'token'), `${TOKEN}\n`);
  fs.writeFileSync(path.join(dir, 'admin-token'), `${ADMIN_TOKEN}\n`);
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'agentloop-node-tls-'));
  makeCertificates();
  const bin = process.env.AGENTLOOP_BIN || path.resolve(__dirname, '..', '..', '..', '.venv', 'bin', 'agentloop');
  const file = (name) => path.join(dir, name);
  server = spawn(bin, ['engine', 'serve', '--adapter', 'fake', '--port', '0', '--set', 'token_latency_s=0.001',
    '--tls-cert', file('server.pem'), '--tls-key', file('server.key'),
    '--auth-token-file', file('token'), '--admin-token-file', file('admin-token')]);
  address = await new Promise((resolve, reject) => {
    server.on('error', reject);
    server.once('exit', (code) => reject(new Error(`server exited with ${code} before listening`)));
    readline.createInterface({ input: server.stdout }).on('line', (line) => {
      const match = line.match(/listening on (\S+)/);
      if (match) resolve(match[1]);
    });
  });
  // the discovery file a launcher would write: paths, never the tokens themselves
  fs.writeFileSync(file('discovery.json'), JSON.stringify({
    servers: [{ address }],
    security: { tls: true, server_name: 'localhost', ca_file: file('ca.pem'), token_file: file('token'), admin_token_file: file('admin-token') },
  }));
});

after(async () => {
  server.removeAllListeners('exit');
  const exited = new Promise((resolve) => server.once('exit', (code) => resolve(code)));
  server.kill('SIGTERM');
  assert.equal(await exited, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error.code;
  }
  throw new Error('the call succeeded but a refusal was expected');
}

test('admin and user tokens over TLS, from the discovery file', async () => {
  const discovery = readDiscovery(path.join(dir, 'discovery.json'));
  assert.deepEqual(discovery.addresses, [address]);
  const clients = connect(discovery.addresses[0], discovery.security);
  try {
    const request = { request_id: 'node-tls-1', session_id: 's', prompt_ids: [1, 2, 3],
      sampling_params: { max_new_tokens: 3, ignore_eos: true } };
    const result = await generate(clients.generate, request, 30);
    assert.equal(result.tokens.length, 3);
    const paused = await unary(clients.control, 'Pause', { mode: 'PAUSE_MODE_ABORT' });
    assert.equal(paused.state, 'ENGINE_STATE_PAUSED');
    await unary(clients.control, 'Resume', {});
  } finally {
    clients.close();
  }
});

test('the user token cannot pause; no token or a wrong one is unauthenticated', async () => {
  // server_name: Node's TLS wants a host name to check, not the IP address the server announces
  const ca = path.join(dir, 'ca.pem');
  const name = 'localhost';
  const user = connect(address, { ca_file: ca, server_name: name, token_file: path.join(dir, 'token') });
  const anonymous = connect(address, { ca_file: ca, server_name: name });
  process.env.AGENTLOOP_NODE_WRONG = 'guess';
  const wrong = connect(address, { ca_file: ca, server_name: name, token_env: 'AGENTLOOP_NODE_WRONG' });
  try {
    assert.equal(await rejection(unary(user.control, 'Pause', { mode: 'PAUSE_MODE_ABORT' })),
      grpc.status.PERMISSION_DENIED);
    assert.equal((await unary(user.control, 'GetServerInfo', {})).state, 'ENGINE_STATE_RUNNING');
    assert.equal(await rejection(unary(anonymous.control, 'GetServerInfo', {})), grpc.status.UNAUTHENTICATED);
    assert.equal(await rejection(unary(wrong.generate, 'GetLoad', {})), grpc.status.UNAUTHENTICATED);
  } finally {
    user.close();
    anonymous.close();
    wrong.close();
  }
});

test('plaintext and untrusted-CA clients cannot connect', async () => {
  const plain = connect(address, { token_file: path.join(dir, 'token') });
  const rogue = connect(address, {
    ca_file: path.join(dir, 'rogue.pem'), server_name: 'localhost', token_file: path.join(dir, 'token'),
  });
  try {
    assert.equal(await rejection(unary(plain.control, 'GetServerInfo', {}, 5)), grpc.status.UNAVAILABLE);
    assert.equal(await rejection(unary(rogue.control, 'GetServerInfo', {}, 5)), grpc.status.UNAVAILABLE);
  } finally {
    plain.close();
    rogue.close();
  }
});
