'use strict';
/**
 * @file An example compactor plugin: it writes compactions' summaries without a model.
 *
 * - `agent/compact`: the summary keeps what the user said (each message cut to
 *   `--max-chars`) and the focus instructions, and drops the rest: an extractive
 *   summariser, cheap and deterministic. Each summary's size is printed to stdout.
 *
 * Run it, then register it with the server:
 *
 *     node clients/node/examples/compactor-plugin.js --listen 127.0.0.1:50105
 *     .venv/bin/grpcurl -plaintext -d '{"address": "127.0.0.1:50105"}' 127.0.0.1:50051 \
 *         agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
 */

const { parseArgs } = require('node:util');
const { createPlugin } = require('../plugin');

const ROLE_USER = 'ROLE_USER'; // enums arrive as their names

/**
 * The compactor plugin.
 * @param {{maxChars?: number, token?: string}} [options]
 */
function buildPlugin({ maxChars = 200, token } = {}) {
  const plugin = createPlugin({ name: 'compactor-node', version: '1.0', token });
  plugin.compact(async (call) => {
    const { messages, instructions } = call.compact;
    const said = messages
      .filter((message) => message.role === ROLE_USER)
      .map((message) => message.content.map((block) => (block.text ? block.text.text : '')).join(''))
      .filter((text) => text);
    let summary = `Earlier, the user said:\n${said.map((text) => `- ${text.slice(0, maxChars)}`).join('\n')}`;
    if (instructions) summary += `\nFocus: ${instructions}`;
    console.log(`summary ${messages.length} messages ${summary.length} chars`);
    return { summary };
  });
  return plugin;
}

async function main() {
  const { values } = parseArgs({
    options: {
      listen: { type: 'string', default: '127.0.0.1:50105' },
      'max-chars': { type: 'string', default: '200' },
      token: { type: 'string', default: process.env.AGENTLOOP_PLUGIN_TOKEN || '' },
    },
  });
  await buildPlugin({ maxChars: Number(values['max-chars']), token: values.token }).run(values.listen);
}

if (require.main === module) {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

module.exports = { buildPlugin };
