'use strict';
/**
 * @file An example approver plugin: it answers tool calls that wait for approval.
 *
 * - `tools/approval`: a call to a tool named by `--allow` is allowed once; one named by
 *   `--reject` is rejected with `--reason`; any other call is left to others (the API,
 *   another approver, or the timeout). Each answer is printed to stdout.
 *
 * Run it, then register it with the server:
 *
 *     node clients/node/examples/approver-plugin.js --listen 127.0.0.1:50103 \
 *         --allow word_count --reject sleep --reason "no sleeping on the job"
 *     .venv/bin/grpcurl -plaintext -d '{"address": "127.0.0.1:50103"}' 127.0.0.1:50051 \
 *         agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
 */

const { parseArgs } = require('node:util');
const { createPlugin, approveOnce, rejectTool } = require('../plugin');

/**
 * The approver plugin.
 * @param {{allow?: string[], reject?: string[], reason?: string, token?: string}} [options]
 */
function buildPlugin({ allow = [], reject = [], reason = '', token } = {}) {
  const plugin = createPlugin({ name: 'approver-node', version: '1.0', token });
  plugin.toolsApproval(async (call) => {
    const { approval } = call.toolApproval;
    if (allow.includes(approval.toolName)) {
      console.log(`allow ${approval.approvalId} ${approval.toolName}`);
      return approveOnce();
    }
    if (reject.includes(approval.toolName)) {
      console.log(`reject ${approval.approvalId} ${approval.toolName}`);
      return rejectTool(reason);
    }
    return undefined; // abstain
  });
  return plugin;
}

async function main() {
  const { values } = parseArgs({
    options: {
      listen: { type: 'string', default: '127.0.0.1:50103' },
      allow: { type: 'string', multiple: true, default: [] },
      reject: { type: 'string', multiple: true, default: [] },
      reason: { type: 'string', default: '' },
      token: { type: 'string', default: process.env.AGENTLOOP_PLUGIN_TOKEN || '' },
    },
  });
  await buildPlugin(values).run(values.listen);
}

if (require.main === module) {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

module.exports = { buildPlugin };
