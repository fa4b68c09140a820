'use strict';
/**
 * @file An example agentloop plugin: a prompt guard, a clock note and a `reverse` tool.
 *
 * - `agent/prompt-submit`: blocks a prompt containing "rm -rf"; any other prompt is
 *   allowed with a context note carrying the plugin's clock.
 * - the tool `reverse` (parallel-safe) reverses its `text` argument.
 *
 * Run it, then register it with the server:
 *
 *     node clients/node/examples/guard-plugin.js --listen 127.0.0.1:50101
 *     .venv/bin/grpcurl -plaintext -d '{"address": "127.0.0.1:50101"}' 127.0.0.1:50051 \
 *         agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
 */

const { parseArgs } = require('node:util');
const { createPlugin, allowPrompt, blockPrompt, context, textOf } = require('../plugin');

const REVERSE_SCHEMA = {
  type: 'object',
  properties: { text: { type: 'string', description: 'The text to reverse.' } },
  required: ['text'],
};

/**
 * The guard plugin.
 * @param {{token?: string}} [options] `token`, when set, is required from the server
 */
function buildPlugin({ token } = {}) {
  const plugin = createPlugin({ name: 'guard-node', version: '1.0', token });
  const source = { kind: 'plugin', name: plugin.name };

  plugin.promptSubmit({ order: 10 }, async (call) => {
    if (textOf(call.promptSubmit.content).includes('rm -rf')) {
      return blockPrompt('destructive command');
    }
    const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    return allowPrompt(undefined, [context(`The plugin's clock reads ${now}.`, source)]);
  });

  plugin.tool(
    { name: 'reverse', description: 'Reverses text.', schema: REVERSE_SCHEMA, parallelSafe: true },
    async (args) => [...String(args.text)].reverse().join(''),
  );

  return plugin;
}

async function main() {
  const { values } = parseArgs({
    options: {
      listen: { type: 'string', default: '127.0.0.1:50101' },
      token: { type: 'string', default: process.env.AGENTLOOP_PLUGIN_TOKEN || '' },
    },
  });
  await buildPlugin({ token: values.token }).run(values.listen);
}

if (require.main === module) {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

module.exports = { REVERSE_SCHEMA, buildPlugin };
