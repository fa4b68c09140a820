'use strict';
// The Node helper as an approver (`tools/approval`), driven as the loop drives it.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const sdk = require('../plugin');
const { buildPlugin } = require('../examples/approver-plugin');
const { servedForEachTest, describe, HandleStream } = require('./helpers');

const approvalCall = (callId, toolName) => ({
  callId,
  seam: 'SEAM_TOOLS_APPROVAL',
  agentId: 'a1',
  turn: 1,
  step: 1,
  toolApproval: {
    approval: { approvalId: `ap-${callId}`, callId: 'm1', toolName, arguments: '{}' },
  },
});

const served = servedForEachTest(() => {
  const plugin = buildPlugin({ allow: ['word_count'], reject: ['rm'], reason: 'never rm' });
  plugin.logger = { error() {} };
  return { plugin };
});

test('an approver subscribes to tools/approval', async () => {
  const described = await describe(served.client);
  assert.deepEqual(described.subscriptions.map((s) => s.seam), ['SEAM_TOOLS_APPROVAL']);
});

test('an approver allows once, rejects with a reason, or abstains', async () => {
  const stream = new HandleStream(served.client);
  stream.send(approvalCall('c1', 'word_count'), approvalCall('c2', 'rm'), approvalCall('c3', 'other'));
  const list = await stream.take(3);
  const r = Object.fromEntries(list.map((result) => [result.callId, result]));
  assert.equal(r.c1.toolApproval.decision, 'APPROVAL_DECISION_ALLOW_ONCE');
  assert.deepEqual(
    { decision: r.c2.toolApproval.decision, reason: r.c2.toolApproval.reason },
    { decision: 'APPROVAL_DECISION_REJECT', reason: 'never rm' },
  );
  assert.equal(r.c3.outcome, undefined); // abstains
  assert.deepEqual(await stream.finish(), []);
});

test('the approver helpers build tagged decisions', () => {
  assert.equal(sdk.approveOnce().decision, 'APPROVAL_DECISION_ALLOW_ONCE');
  assert.equal(sdk.rejectTool('no').reason, 'no');
});
