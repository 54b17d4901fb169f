'use strict';
// Stream a generation from an engine server:
//   node examples/generate.js 127.0.0.1:50051
const { connect, unary, generate } = require('../src/client');

async function main() {
  const address = process.argv[2] || '127.0.0.1:50051';
  const clients = connect(address);
  try {
    const info = await unary(clients.control, 'GetServerInfo', {}, 10);
    console.log(`engine ${info.engine_kind} model ${info.model_id} vocab ${info.vocab_size} state ${info.state}`);
    const result = await generate(clients.generate, {
      request_id: `node-example-${process.pid}`,
      session_id: 'node-example',
      prompt_ids: [1, 2, 3, 4],
      sampling_params: { max_new_tokens: 8, temperature: 0, logprobs: true },
    });
    console.log('tokens', result.tokens.join(' '));
    console.log('logprobs', result.logprobs.map((lp) => lp.toFixed(3)).join(' '));
    console.log('finish', result.complete.finish_reason, 'weight version', result.complete.weight_version);
  } finally {
    clients.close();
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
