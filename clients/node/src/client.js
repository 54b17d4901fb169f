'use strict';
/**
 * Node client for the agentloop.v1 contracts, loaded from the .proto files themselves (no Python involved).
 *
 * `make protos` also writes TypeScript types for these messages into ../generated (proto-loader-gen-types),
 * so TypeScript users get typed requests and responses: see README.md.
 */
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', '..', 'protos');
const PROTO_FILES = ['agentloop/v1/generation.proto', 'agentloop/v1/engine.proto', 'agentloop/v1/tool.proto'];

/** Options shared with proto-loader-gen-types (package.json "generate"), so the types match the objects. */
const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };

/** Load the agentloop.v1 package: service constructors and message types. */
function loadAgentloop(protoRoot = PROTO_ROOT) {
  const definition = protoLoader.loadSync(PROTO_FILES, { ...LOADER_OPTIONS, includeDirs: [protoRoot] });
  return grpc.loadPackageDefinition(definition).agentloop.v1;
}

/** Calls that need the admin token where a server has one (Abort too: its `all` flag is in the message, sent
 * after the token, so every Abort carries the admin token when the client has one). */
const CONTROL_METHODS = new Set(['Sleep', 'WakeUp', 'Pause', 'Resume', 'UpdateWeights', 'FlushCache']
  .map((name) => `/agentloop.v1.EngineControl/${name}`).concat(['/agentloop.v1.TokenGenerate/Abort']));

/** Keepalive on every channel: a server that stops answering pings (stopped, partitioned) fails its calls in
 * seconds instead of at their deadlines. Servers permit pings this frequent. */
const KEEPALIVE_OPTIONS = {
  'grpc.keepalive_time_ms': 5000,
  'grpc.keepalive_timeout_ms': 5000,
  'grpc.keepalive_permit_without_calls': 1,
};

/** A secret from a file (trimmed) or an environment variable, as the Python client reads it. */
function readSecret(file, env, what) {
  if (file && env) throw new Error(`${what}: give a file or an environment variable, not both`);
  const value = file ? fs.readFileSync(file, 'utf8').trim() : env ? (process.env[env] || '').trim() : undefined;
  if ((file || env) && !value) throw new Error(`${what}: ${file ? `the file ${file} is empty` : `${env} is not set`}`);
  return value;
}

/**
 * Channel credentials and client options from a security object with the fields of the Python ClientSecurity
 * (and of a discovery file's "security"): tls, ca_file, cert_file, key_file, server_name, token_file, token_env,
 * admin_token_file, admin_token_env. Tokens go in `authorization: Bearer ...` metadata on every call.
 */
function securityOptions(security = {}) {
  const tls = Boolean(security.tls || security.ca_file || security.cert_file || security.server_name);
  const read = (file) => (file ? fs.readFileSync(file) : null);
  const credentials = tls
    ? grpc.credentials.createSsl(read(security.ca_file), read(security.key_file), read(security.cert_file))
    : grpc.credentials.createInsecure();
  const options = security.server_name ? { 'grpc.ssl_target_name_override': security.server_name } : {};
  const user = readSecret(security.token_file, security.token_env, 'token');
  const admin = readSecret(security.admin_token_file, security.admin_token_env, 'admin token');
  if (user || admin) {
    const addToken = (callOptions, nextCall) => new grpc.InterceptingCall(nextCall(callOptions), {
      start(metadata, listener, next) {
        const control = CONTROL_METHODS.has(callOptions.method_definition.path);
        metadata.set('authorization', `Bearer ${control ? admin || user : user || admin}`);
        next(metadata, listener);
      },
    });
    options.interceptors = [addToken];
  }
  return { credentials, options };
}

/**
 * Clients for one server: { generate: TokenGenerate, control: EngineControl, tools: ToolExecute }.
 * `security` is grpc.ChannelCredentials, or a security object (see securityOptions) for TLS and tokens.
 */
function connect(address, security = grpc.credentials.createInsecure()) {
  const v1 = loadAgentloop();
  const { credentials, options: securityOpts } = security instanceof grpc.ChannelCredentials
    ? { credentials: security, options: {} } : securityOptions(security);
  const options = { ...KEEPALIVE_OPTIONS, ...securityOpts };
  return {
    generate: new v1.TokenGenerate(address, credentials, options),
    control: new v1.EngineControl(address, credentials, options),
    tools: new v1.ToolExecute(address, credentials, options),
    close() {
      this.generate.close();
      this.control.close();
      this.tools.close();
    },
  };
}

/** Seconds from now as a gRPC deadline. */
function deadline(seconds) {
  return new Date(Date.now() + seconds * 1000);
}

/** Promise wrapper for a unary call: `await unary(client.control, 'GetServerInfo', {}, 10)`. */
function unary(client, method, request, seconds = 30) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline(seconds) }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

/**
 * Run a Generate stream to its end. Resolves with { tokens, logprobs, complete, messages }, where tokens and
 * logprobs are every chunk's followed by those sent with the completion (request.stream_options groups tokens
 * into fewer messages); rejects with the gRPC error (error.code is a grpc.status value).
 */
function generate(client, request, seconds = 120) {
  return new Promise((resolve, reject) => {
    const messages = [];
    const call = client.Generate(request, { deadline: deadline(seconds) });
    call.on('data', (message) => messages.push(message));
    call.on('error', reject);
    call.on('end', () => {
      const chunks = messages.filter((m) => m.response === 'chunk').map((m) => m.chunk);
      const last = messages[messages.length - 1];
      if (last && last.response === 'complete' && last.complete.tokens) chunks.push(last.complete.tokens);
      resolve({
        messages,
        tokens: chunks.flatMap((c) => c.token_ids),
        logprobs: chunks.flatMap((c) => c.logprobs),
        complete: last && last.response === 'complete' ? last.complete : undefined,
      });
    });
  });
}

/** The servers of a discovery file (`agentloop engine launch`): { addresses, security } for connect(). */
function readDiscovery(file) {
  const document = JSON.parse(fs.readFileSync(file, 'utf8'));
  return { addresses: document.servers.map((server) => server.address), security: document.security || {} };
}

module.exports = {
  PROTO_ROOT, LOADER_OPTIONS, loadAgentloop, connect, securityOptions, readDiscovery, unary, generate, deadline, grpc,
};
