'use strict';
// The Node plugin helper, driven as the loop drives a plugin: Describe, then Handle.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { once } = require('node:events');
const grpc = require('@grpc/grpc-js');
const sdk = require('../plugin');
const { buildPlugin, REVERSE_SCHEMA } = require('../examples/guard-plugin');
const {
  deferred, within, connect, serve, servedForEachTest, describe, HandleStream,
} = require('./helpers');

const text = (value) => ({ text: { text: value } });
const prompt = (callId, value) => ({
  callId, seam: 'SEAM_PROMPT_SUBMIT', agentId: 'a1', turn: 1, promptSubmit: { content: [text(value)] },
});
const invocation = (callId, name, args) => ({ invocation: { callId: `m-${callId}`, name, arguments: args } });
const toolCall = (callId, name, args) =>
  ({ callId, kind: 'CALL_KIND_TOOL_EXECUTE', toolExecute: invocation(callId, name, args) });
const preTool = (callId, name) =>
  ({ callId, seam: 'SEAM_TOOLS_PRE_EXECUTE', toolPreExecute: invocation(callId, name, '{}') });

/** The example plugin plus handlers on other seams: gated, slow, throwing, observing. */
function testPlugin(options) {
  const plugin = buildPlugin(options);
  plugin.logger = { error() {} }; // the observer below fails on purpose
  const probe = {
    gate: deferred(), started: deferred(), cancelled: deferred(), events: [], agentEvents: [],
  };
  plugin.stepResult(async () => {
    await probe.gate.promise; // opened by the turnStop handler: needs concurrency
    return sdk.replaceMessage('rewritten');
  });
  plugin.turnStop(() => {
    probe.gate.resolve();
    return sdk.terminalStop();
  });
  plugin.preStep({ order: -5, timeout: 2.5 }, (call, { signal }) => {
    probe.started.resolve();
    return new Promise((resolve) => {
      signal.addEventListener('abort', () => {
        probe.cancelled.resolve(signal.reason.message);
        resolve(sdk.addContext('too late'));
      });
    });
  });
  const checkOptions = { order: 20, failurePolicy: 'FAIL_OPEN', agentIds: ['a1', 'a2'] };
  plugin.toolsPreExecute(checkOptions, (call) => {
    const { name } = call.toolPreExecute.invocation;
    if (name === 'boom') throw new Error('boom is not allowed to run');
    if (name === 'wrong') return sdk.stopTurn();
    if (name === 'malformed') return { deny: 'not an object' };
    return name === 'delete' ? sdk.deny('no deletes') : null;
  });
  plugin.turnContinuation(() => sdk.continueTurn('one more step'));
  plugin.onSessionEvent((call) => { probe.events.push(call.sessionEvent.event.seq); });
  plugin.onAgentEvent((call) => {
    probe.agentEvents.push(call.agentEvent.event.agentId);
    throw new Error("observers' failures are only logged");
  });
  return { plugin, probe };
}

const served = servedForEachTest(testPlugin);

test('Describe reports the subscriptions and tools', async () => {
  const described = await describe(served.client);
  assert.equal(described.name, 'guard-node');
  assert.equal(described.version, '1.0');
  const seams = described.subscriptions.map((s) => s.seam);
  assert.deepEqual(seams, [
    'SEAM_PROMPT_SUBMIT', 'SEAM_PRE_STEP', 'SEAM_STEP_RESULT', 'SEAM_TURN_CONTINUATION',
    'SEAM_TURN_STOP', 'SEAM_TOOLS_PRE_EXECUTE', 'SEAM_SESSION_EVENTS', 'SEAM_AGENT_EVENTS',
  ]);
  const bySeam = Object.fromEntries(described.subscriptions.map((s) => [s.seam, s]));
  assert.equal(bySeam.SEAM_PROMPT_SUBMIT.order, 10);
  assert.equal(bySeam.SEAM_PROMPT_SUBMIT.timeout, null);
  assert.equal(bySeam.SEAM_PRE_STEP.order, -5);
  assert.deepEqual(bySeam.SEAM_PRE_STEP.timeout, { seconds: 2, nanos: 500000000 });
  assert.equal(bySeam.SEAM_TOOLS_PRE_EXECUTE.failurePolicy, 'FAILURE_POLICY_FAIL_OPEN');
  assert.deepEqual(bySeam.SEAM_TOOLS_PRE_EXECUTE.agentIds, ['a1', 'a2']);
  assert.equal(bySeam.SEAM_STEP_RESULT.failurePolicy, 'FAILURE_POLICY_UNSPECIFIED');
  assert.equal(described.tools.length, 1);
  const [reverse] = described.tools;
  assert.equal(reverse.name, 'reverse');
  assert.equal(reverse.parallelSafe, true);
  assert.deepEqual(sdk.fromStruct(reverse.inputSchema), REVERSE_SCHEMA);
});

test('concurrent calls are answered as they finish', async () => {
  const stream = new HandleStream(served.client);
  // c1 waits for a gate only c2 opens: served one at a time, it would never finish.
  stream.send(
    { callId: 'c1', seam: 'SEAM_STEP_RESULT', stepResult: { message: { content: [text('old')] } } },
    { callId: 'c2', seam: 'SEAM_TURN_STOP', turnStop: {} },
    prompt('c3', 'please rm -rf /'),
    prompt('c4', 'hello'),
    toolCall('c5', 'reverse', '{"text": "abc"}'),
    preTool('c6', 'delete'),
    preTool('c7', 'read'),
    { callId: 'c8', seam: 'SEAM_TURN_CONTINUATION', turnContinuation: {} },
  );
  const list = await stream.take(8);
  const order = list.map((r) => r.callId);
  assert.deepEqual([...order].sort(), ['c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', 'c8']);
  assert.ok(order.indexOf('c2') < order.indexOf('c1'));
  const r = Object.fromEntries(list.map((result) => [result.callId, result]));
  for (const result of list) assert.equal(result.error, undefined, result.error);
  assert.equal(r.c1.outcome, 'stepResult');
  assert.equal(r.c1.stepResult.message.role, 'ROLE_ASSISTANT');
  assert.equal(sdk.textOf(r.c1.stepResult.message.content), 'rewritten');
  assert.equal(r.c2.turnStop.stop, true);
  assert.equal(r.c3.promptSubmit.block.reason, 'destructive command');
  assert.equal(r.c4.promptSubmit.decision, 'allow');
  assert.deepEqual(r.c4.promptSubmit.allow.content, []);
  const [note] = r.c4.promptSubmit.allow.additionalContexts;
  assert.match(sdk.textOf(note.content), /^The plugin's clock reads /);
  assert.deepEqual(note.source, { kind: 'plugin', name: 'guard-node' });
  assert.equal(sdk.textOf(r.c5.toolExecute.content), 'cba');
  assert.equal(r.c5.toolExecute.isError, false);
  assert.equal(r.c6.toolPreExecute.deny.reason, 'no deletes');
  assert.equal(r.c7.outcome, undefined); // continue unchanged
  assert.equal(sdk.textOf(r.c8.turnContinuation.continueTurn.reason), 'one more step');
  assert.deepEqual(await stream.finish(), []);
});

test('many calls in flight are each answered once', async () => {
  const stream = new HandleStream(served.client);
  const count = 300;
  for (let n = 0; n < count; n += 1) {
    stream.send(toolCall(`e${n}`, 'reverse', JSON.stringify({ text: `${n}x` })));
  }
  const list = await stream.take(count);
  assert.equal(new Set(list.map((r) => r.callId)).size, count);
  for (const result of list) {
    const n = result.callId.slice(1);
    assert.equal(sdk.textOf(result.toolExecute.content), `x${[...n].reverse().join('')}`);
  }
  assert.deepEqual(await stream.finish(), []);
});

test('CancelCall aborts the handler and no result is sent for it', async () => {
  const stream = new HandleStream(served.client);
  stream.send({ callId: 'slow', seam: 'SEAM_PRE_STEP', preStep: { system: '' } });
  await within(served.probe.started.promise, 'the slow handler');
  stream.cancel('slow');
  assert.equal(await within(served.probe.cancelled.promise, 'the cancellation'), 'x');
  stream.cancel('unknown'); // a cancel for a call already answered is ignored
  stream.send(prompt('after', 'hello'));
  assert.equal((await stream.result()).callId, 'after');
  assert.deepEqual(await stream.finish(), []);
});

test('a call past its deadline is aborted and not answered', async () => {
  const stream = new HandleStream(served.client);
  const timeout = { seconds: 0, nanos: 100000000 };
  stream.send({ callId: 'late', seam: 'SEAM_PRE_STEP', preStep: {}, timeout });
  assert.equal(await within(served.probe.cancelled.promise, 'the deadline'), 'deadline exceeded');
  assert.deepEqual(await stream.finish(), []);
});

test('failures are answered with HookResult.error', async () => {
  const stream = new HandleStream(served.client);
  stream.send(
    preTool('boom', 'boom'),
    preTool('wrong', 'wrong'),
    preTool('malformed', 'malformed'),
    toolCall('missing', 'no_such_tool', '{}'),
    { callId: 'unsubscribed', sessionPrefix: {} },
    { callId: 'empty' },
  );
  const r = Object.fromEntries((await stream.take(6)).map((result) => [result.callId, result]));
  assert.equal(r.boom.error.message, 'boom is not allowed to run');
  assert.match(r.wrong.error.message, /toolPreExecute handler returned a turnContinuation decision/);
  assert.match(r.malformed.error.message, /malformed toolPreExecute result/);
  assert.match(r.missing.error.message, /no tool "no_such_tool"/);
  assert.match(r.unsubscribed.error.message, /no handler for sessionPrefix/);
  assert.match(r.empty.error.message, /no handler/);
  assert.equal(r.unsubscribed.error.code, 12); // a call it does not know: UNIMPLEMENTED
  assert.equal(r.empty.error.code, 12);
  for (const result of Object.values(r)) assert.equal(result.outcome, 'error');
  // Arguments that are not JSON are the model's mistake: a tool error it sees.
  stream.send(toolCall('bad-json', 'reverse', '{not json'));
  const bad = await stream.result();
  assert.equal(bad.error, undefined);
  assert.equal(bad.toolExecute.isError, true);
  assert.equal(bad.toolExecute.error.code, 'INVALID_ARGUMENTS');
  assert.match(sdk.textOf(bad.toolExecute.content), /^Error: invalid JSON arguments/);
  assert.deepEqual(await stream.finish(), []);
});

test('notifications get no result', async () => {
  const stream = new HandleStream(served.client);
  stream.send(
    { callId: 'n1', sessionEvent: { event: { seq: 7 } } },
    { callId: 'n2', agentEvent: { event: { agentId: 'a1' } } },
    { callId: 'n3', toolResult: {} }, // not subscribed
    prompt('p', 'hello'),
  );
  assert.equal((await stream.result()).callId, 'p');
  assert.deepEqual(await stream.finish(), []);
  assert.deepEqual(served.probe.events, [7]);
  assert.deepEqual(served.probe.agentEvents, ['a1']);
});

test('a CallBatch is handled call by call, in order', async () => {
  const stream = new HandleStream(served.client);
  stream.call.write({
    batch: {
      calls: [
        { callId: 'n1', sessionEvent: { event: { seq: 1 } } },
        { callId: 'n2', agentEvent: { event: { agentId: 'a1' } } },
        { callId: 'n3', sessionEvent: { event: { seq: 2 } } },
      ],
    },
  });
  stream.call.write({
    batch: { calls: [{ callId: 'n4', sessionEvent: { event: { seq: 3 } } }, prompt('p', 'hello')] },
  });
  assert.equal((await stream.result()).callId, 'p');
  assert.deepEqual(await stream.finish(), []);
  assert.deepEqual(served.probe.events, [1, 2, 3]);
  assert.deepEqual(served.probe.agentEvents, ['a1']);
});

test('a watched seam (observeOnly) is never answered but as "continue unchanged"', async () => {
  const plugin = new sdk.Plugin({ name: 'watcher' });
  plugin.logger = { error() {} }; // the preStep watcher fails on purpose
  const seen = [];
  plugin.turnStop({ observeOnly: true }, (call) => {
    seen.push(call.kind);
    return sdk.terminalStop(); // ignored: the plugin only watches
  });
  plugin.preStep({ observeOnly: true }, (call) => {
    seen.push(call.kind);
    throw new Error("a watcher's failure is contained");
  });
  const client = await serve(plugin);
  try {
    const description = await describe(client);
    assert.deepEqual(description.subscriptions.map((s) => s.observeOnly), [true, true]);
    const stream = new HandleStream(client);
    stream.send(
      { callId: 'n', kind: 'CALL_KIND_NOTIFICATION', seam: 'SEAM_TURN_STOP', turnStop: {} },
      // A server without observe_only sends calls: answered "continue unchanged".
      { callId: 's', kind: 'CALL_KIND_SEAM', seam: 'SEAM_TURN_STOP', turnStop: {} },
    );
    const answer = await stream.result();
    assert.equal(answer.callId, 's');
    assert.equal(answer.outcome, undefined);
    stream.send({ callId: 'p', kind: 'CALL_KIND_SEAM', seam: 'SEAM_PRE_STEP', preStep: {} });
    const failed = await stream.result();
    assert.equal(failed.callId, 'p');
    assert.equal(failed.outcome, undefined);
    assert.deepEqual(await stream.finish(), []);
    assert.deepEqual(seen, ['CALL_KIND_NOTIFICATION', 'CALL_KIND_SEAM', 'CALL_KIND_SEAM']);
  } finally {
    client.close();
    await plugin.stop({ grace: 0 });
  }
});

test('Describe asks for call batches only when the server offers them', async () => {
  const ask = (capabilities) => within(new Promise((resolve, reject) => {
    served.client.Describe({ capabilities }, (error, response) =>
      (error ? reject(error) : resolve(response)));
  }), 'Describe');
  assert.deepEqual((await ask(['model_stream', 'call_batch'])).capabilities,
    ['call_batch']);
  assert.deepEqual((await ask(['model_stream'])).capabilities, []);
});

test('stop answers the calls in flight, then ends the stream', async () => {
  const started = deferred();
  const release = deferred();
  const drain = sdk.createPlugin({ name: 'drain' });
  drain.turnStop(async () => {
    started.resolve();
    await release.promise;
    return sdk.terminalStop();
  });
  const drainClient = await serve(drain);
  try {
    const stream = new HandleStream(drainClient);
    stream.send({ callId: 't', turnStop: {} });
    await within(started.promise, 'the call in flight');
    const stopping = drain.stop({ grace: 5 });
    release.resolve();
    const result = await stream.result();
    assert.equal(result.callId, 't');
    assert.equal(result.turnStop.stop, true);
    assert.equal((await within(stream.ended.promise, 'the end')).code, grpc.status.OK);
    await within(stopping, 'stop');
  } finally {
    drainClient.close();
  }
});

test('the token is required when configured', async () => {
  const guarded = testPlugin({ token: 's3cret' }).plugin;
  const guardedClient = await serve(guarded);
  try {
    const wrong = new grpc.Metadata();
    wrong.set('authorization', 'Bearer wrong');
    for (const metadata of [new grpc.Metadata(), wrong]) {
      const refused = { code: grpc.status.UNAUTHENTICATED };
      await assert.rejects(describe(guardedClient, metadata), refused);
      const stream = new HandleStream(guardedClient, metadata);
      await assert.rejects(stream.result(), refused);
    }
    const good = new grpc.Metadata();
    good.set('authorization', 'Bearer s3cret');
    assert.equal((await describe(guardedClient, good)).name, 'guard-node');
    const stream = new HandleStream(guardedClient, good);
    stream.send(prompt('p', 'hi'));
    assert.equal((await stream.result()).callId, 'p');
    assert.deepEqual(await stream.finish(), []);
  } finally {
    guardedClient.close();
    await guarded.stop({ grace: 0 });
  }
});

test('registrations are checked', () => {
  assert.throws(() => sdk.createPlugin({ name: 'no spaces' }), /plugin name/);
  const p = sdk.createPlugin({ name: 'p' });
  p.onToolResult(() => {});
  assert.throws(() => p.onToolResult({ order: 3 }, () => {}), /already has a toolResult handler/);
  assert.throws(() => p.preStep({ failurePolicy: 'SOMETIMES' }, () => {}), /failurePolicy/);
  assert.throws(() => p.tool({ name: '' }, () => {}), /empty or taken/);
});

test('the example runs as a process', async () => {
  const example = path.join(__dirname, '..', 'examples', 'guard-plugin.js');
  const child = spawn(process.execPath, [example, '--listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  try {
    const [chunk] = await within(once(child.stdout, 'data'), 'the listening line', 10000);
    const line = chunk.toString();
    assert.match(line, /^plugin guard-node listening on 127\.0\.0\.1:\d+\n$/);
    const address = line.trim().split(' ').pop();
    const exampleClient = connect(address);
    try {
      assert.deepEqual((await describe(exampleClient)).tools.map((t) => t.name), ['reverse']);
    } finally {
      exampleClient.close();
    }
    child.kill('SIGTERM');
    const [code] = await within(once(child, 'exit'), 'the exit', 10000);
    assert.equal(code, 0);
  } finally {
    if (child.exitCode === null) child.kill('SIGKILL');
  }
});
