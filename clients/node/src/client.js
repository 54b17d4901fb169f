'use strict';
/**
 * Node client for the agentloop.v1 contracts, loaded from the .proto files themselves (no Python involved).
 *
 * `make protos` also writes TypeScript types for these messages into ../generated (proto-loader-gen-types),
 * so TypeScript users get typed requests and responses: see README.md.
 */
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

/** Clients for one server: { generate: TokenGenerate, control: EngineControl, tools: ToolExecute }. */
function connect(address, credentials = grpc.credentials.createInsecure()) {
  const v1 = loadAgentloop();
  return {
    generate: new v1.TokenGenerate(address, credentials),
    control: new v1.EngineControl(address, credentials),
    tools: new v1.ToolExecute(address, credentials),
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

module.exports = { PROTO_ROOT, LOADER_OPTIONS, loadAgentloop, connect, unary, generate, deadline, grpc };
