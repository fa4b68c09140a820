'use strict';
/**
 * @file An example plugin that builds a team: a tool that hands a task to a sub-agent.
 *
 * - the tool `ask_team` ({task, background?}) creates a child of the calling agent
 *   (`<agent>.team-<call id>`, made by this call), sends it the task, follows its
 *   session as it works (each step it ends is printed to stdout), collects its final
 *   answer and disposes it. With `background: true` it answers at once with the
 *   child's id, and the tool `collect_team` ({agent_id}) follows it to its end later.
 *
 * Everything is the plain API (`agents.js`): CreateAgent with `parent`, SendMessage,
 * StreamSessionEvents, DisposeAgent. The child shows its parent in GetAgent, and is
 * disposed with it if the parent goes first.
 *
 * Run it, then register it with the server:
 *
 *     node clients/node/examples/team-plugin.js --listen 127.0.0.1:50106 \
 *         --server 127.0.0.1:50051
 *     .venv/bin/grpcurl -plaintext -d '{"address": "127.0.0.1:50106"}' 127.0.0.1:50051 \
 *         agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
 */

const { parseArgs } = require('node:util');
const { createPlugin } = require('../plugin');
const { connectAgents } = require('../agents');

const ASK_SCHEMA = {
  type: 'object',
  properties: {
    task: { type: 'string', description: 'What the helper must do.' },
    background: { type: 'boolean', description: 'Answer at once; collect it later.' },
  },
  required: ['task'],
};

const COLLECT_SCHEMA = {
  type: 'object',
  properties: { agent_id: { type: 'string', description: 'The helper ask_team started.' } },
  required: ['agent_id'],
};

/**
 * The team plugin, calling back into the server at `server` (host:port).
 * @param {{server: string, token?: string, serverToken?: string}} options
 */
function buildPlugin({ server, token, serverToken = '' }) {
  const plugin = createPlugin({ name: 'team-node', version: '1.0', token });
  const agents = connectAgents(server, { token: serverToken });
  /** Where each background helper's turn starts, by its id. */
  const started = new Map();

  async function collect(childId, fromSeq) {
    try {
      const { text, ending, steps } = await agents.follow(childId, fromSeq, (event) => {
        if (event.payload === 'stepEnd') console.log(`${childId} step ${event.stepEnd.step}`);
      });
      console.log(`${childId} ${ending} after ${steps} step(s)`);
      return ending === 'completed'
        ? `${childId} answered: ${text || '(nothing)'}`
        : `${childId} ended ${ending}: ${text}`;
    } finally {
      await agents.dispose(childId);
    }
  }

  plugin.tool({ name: 'ask_team', description: 'Asks a helper agent.', schema: ASK_SCHEMA, parallelSafe: true },
    async (args, call) => {
      const callId = call.toolExecute.invocation.callId;
      const childId = `${call.agentId}.team-${callId.replace(/[^A-Za-z0-9._:-]/g, '-')}`;
      await agents.createChild(call.agentId, childId, { provider: 'scripted' }, { toolCallId: callId });
      const fromSeq = await agents.send(childId, String(args.task));
      if (args.background) {
        started.set(childId, fromSeq);
        return `started ${childId}; collect it with collect_team`;
      }
      return collect(childId, fromSeq);
    });

  plugin.tool({ name: 'collect_team', description: 'Collects a helper.', schema: COLLECT_SCHEMA, parallelSafe: true },
    async (args) => {
      const childId = String(args.agent_id);
      if (!started.has(childId)) return `unknown helper ${childId}`;
      const fromSeq = started.get(childId);
      started.delete(childId);
      return collect(childId, fromSeq);
    });

  plugin.agents = agents;
  return plugin;
}

async function main() {
  const { values } = parseArgs({
    options: {
      listen: { type: 'string', default: '127.0.0.1:50106' },
      server: { type: 'string', default: '127.0.0.1:50051' },
      token: { type: 'string', default: process.env.AGENTLOOP_PLUGIN_TOKEN || '' },
      'server-token': { type: 'string', default: process.env.AGENTLOOP_TOKEN || '' },
    },
  });
  const plugin = buildPlugin({
    server: values.server, token: values.token, serverToken: values['server-token'],
  });
  await plugin.run(values.listen);
}

if (require.main === module) {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

module.exports = { ASK_SCHEMA, COLLECT_SCHEMA, buildPlugin };
