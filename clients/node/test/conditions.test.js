'use strict';
// Match conditions in the Node helper: declared in Describe (with the capability they
// require), checked when registered, and honoured when a call outside them comes anyway.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const sdk = require('../plugin');
const { globRegExp, nameMatcher } = require('../conditions');
const { serve, describe } = require('./helpers');

const text = (value) => ({ text: { text: value } });
const prompt = (callId, value) => ({
  callId, kind: 'CALL_KIND_SEAM', seam: 'SEAM_PROMPT_SUBMIT', agentId: 'a1', payload: 'promptSubmit',
  promptSubmit: { content: [text(value)] },
});
const preTool = (callId, name) => ({
  callId, kind: 'CALL_KIND_SEAM', seam: 'SEAM_TOOLS_PRE_EXECUTE', agentId: 'a1',
  payload: 'toolPreExecute', toolPreExecute: { invocation: { callId: 'm1', name, arguments: '{}' } },
});

test('globs match whole names: *, ? and sets', () => {
  const matches = nameMatcher(['bash', 'mcp__*', 'read_?', '[wx]rite', '[!a]b']);
  assert.deepEqual(
    ['bash', 'bash2', 'mcp__git__log', 'read_a', 'read_ab', 'write', 'Write', 'zb', 'ab']
      .map(matches),
    [true, false, true, true, false, true, false, true, false],
  );
  assert.ok(globRegExp('a.b').test('a.b') && !globRegExp('a.b').test('axb'));
});

test('Describe carries the conditions and requires match_conditions', async () => {
  const plugin = sdk.createPlugin({ name: 'conditioned' });
  plugin.toolsPreExecute({ tools: ['word_*'], agentLabels: { team: 'red' } }, () => null);
  plugin.onSessionEvent({ eventKinds: ['turn_end'] }, () => {});
  plugin.onAgentEvent({ eventKinds: ['status'] }, () => {});
  plugin.promptSubmit({ promptPrefix: '/deploy', promptRegex: 'prod|staging' }, () => null);
  const client = await serve(plugin);
  try {
    const described = await describe(client);
    const bySeam = Object.fromEntries(described.subscriptions.map((s) => [s.seam, s]));
    const tools = bySeam.SEAM_TOOLS_PRE_EXECUTE.conditions;
    assert.deepEqual(tools.tools, ['word_*']);
    assert.deepEqual(tools.agentLabels, { team: 'red' });
    // Session event kinds stay in the older field, which every server reads.
    assert.deepEqual(bySeam.SEAM_SESSION_EVENTS.eventKinds, ['turn_end']);
    assert.equal(bySeam.SEAM_SESSION_EVENTS.conditions, null);
    assert.deepEqual(bySeam.SEAM_AGENT_EVENTS.conditions.eventKinds, ['status']);
    const prompts = bySeam.SEAM_PROMPT_SUBMIT.conditions;
    assert.equal(prompts.promptPrefix, '/deploy');
    assert.equal(prompts.promptRegex, 'prod|staging');
    assert.deepEqual(described.capabilities, ['match_conditions']);
  } finally {
    client.close();
    await plugin.stop({ grace: 0 });
  }
});

test('a plugin without conditions requires no capability', () => {
  const plugin = sdk.createPlugin({ name: 'plain' });
  plugin.promptSubmit(() => null);
  assert.deepEqual(plugin.describe().capabilities, []);
});

test('a condition the server would refuse is refused at registration, naming the field', () => {
  const plugin = sdk.createPlugin({ name: 'bad' });
  assert.throws(() => plugin.preStep({ tools: ['bash'] }, () => null), /preStep subscription: tools: tool seams only/);
  assert.throws(() => plugin.request({ promptPrefix: '/x' }, () => null), /promptPrefix: promptSubmit only/);
  assert.throws(() => plugin.toolsPreExecute({ tools: [''] }, () => null), /tools: a pattern is empty/);
  assert.throws(() => plugin.turnStop({ eventKinds: ['status'] }, () => null), /eventKinds: onSessionEvent and onAgentEvent only/);
  assert.throws(() => plugin.promptSubmit({ promptRegex: '(' }, () => null), SyntaxError);
  assert.equal(plugin.subscriptions.size, 0);
});

test('a call outside the conditions is answered "continue unchanged" without the handler', async () => {
  const plugin = sdk.createPlugin({ name: 'guarded' });
  const seen = [];
  plugin.promptSubmit({ promptPrefix: '/deploy', promptRegex: 'prod' }, (call) => {
    seen.push(call.callId);
    return sdk.allowPrompt('rewritten');
  });
  plugin.toolsPreExecute({ tools: ['word_*'] }, (call) => {
    seen.push(call.callId);
    return sdk.deny('no');
  });

  assert.deepEqual(await plugin.handle(prompt('c1', 'hello prod')), { callId: 'c1' });
  assert.deepEqual(await plugin.handle(prompt('c2', '/deploy dev')), { callId: 'c2' });
  assert.deepEqual(await plugin.handle(preTool('c3', 'echo')), { callId: 'c3' });
  const inside = await plugin.handle(prompt('c4', '/deploy prod'));
  const denied = await plugin.handle(preTool('c5', 'word_count'));

  assert.ok(inside.promptSubmit, JSON.stringify(inside));
  assert.ok(denied.toolPreExecute, JSON.stringify(denied));
  assert.deepEqual(seen, ['c4', 'c5']);
});
