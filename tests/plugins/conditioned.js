'use strict';
/**
 * @file A test plugin whose subscriptions carry match conditions (used by tests/e2e).
 * The Node twin of conditioned.py, with the same flags and records:
 *
 *     node tests/plugins/conditioned.js --listen 127.0.0.1:0 --name p --record PATH
 *
 * Every subscription is limited to agents labelled `plugin=NAME`; each handled call
 * appends `PAYLOAD AGENT DETAIL` (snake_case payload) to PATH: promptSubmit for prompts
 * starting with "/deploy" that mention prod or staging (rewritten to `TEXT-NAME`),
 * toolsPreExecute for the tools `word_*`, onAgentEvent for `status` events, turnStop
 * for agents also labelled `team=red`. `--bad kind` asks for an unknown agent event
 * kind, which the server refuses (the helper itself refuses a bad regex or a condition
 * on the wrong seam before serving).
 */

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const sdk = require(path.join(__dirname, '..', '..', 'clients', 'node', 'plugin'));

const { values: args } = parseArgs({
  options: {
    listen: { type: 'string', default: '127.0.0.1:0' },
    name: { type: 'string', default: 'conditioned-node' },
    record: { type: 'string', default: '/dev/null' },
    bad: { type: 'string', default: '' },
  },
});

const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const note = (call, detail) =>
  fs.appendFileSync(args.record, `${snake(call.payload)} ${call.agentId} ${detail}\n`);

const plugin = sdk.createPlugin({ name: args.name, version: 'test' });
const mine = { plugin: args.name };

plugin.promptSubmit(
  { agentLabels: mine, promptPrefix: '/deploy', promptRegex: 'prod|staging' },
  (call) => {
    const text = sdk.textOf(call.promptSubmit.content);
    note(call, text.replace(/ /g, '_'));
    return sdk.allowPrompt(`${text}-${args.name}`);
  },
);
plugin.toolsPreExecute({ agentLabels: mine, tools: ['word_*'] }, (call) => {
  note(call, call.toolPreExecute.invocation.name);
});
const kinds = args.bad === 'kind' ? ['no_such_kind'] : ['status'];
plugin.onAgentEvent({ agentLabels: mine, eventKinds: kinds }, (call) => {
  note(call, call.agentEvent.event.event || '');
});
plugin.turnStop({ agentLabels: { ...mine, team: 'red' } }, (call) => {
  note(call, '-');
});

plugin.run(args.listen).catch((error) => {
  console.error(error);
  process.exit(1);
});
