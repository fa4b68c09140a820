'use strict';
// Model providers of the Node plugin helper, driven as the loop drives them over Handle.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const sdk = require('../plugin');
const { deferred, within, servedForEachTest, describe, HandleStream } = require('./helpers');

const user = (text) => ({ role: 'ROLE_USER', content: [{ text: { text } }] });
/** A `modelStream` call of `provider`. */
function modelCall(callId, provider, { messages = [user('hi')], model = '', timeout } = {}) {
  return {
    callId,
    kind: 'CALL_KIND_MODEL_STREAM',
    agentId: 'a1',
    turn: 1,
    step: 1,
    timeout: timeout === undefined ? null : sdk.duration(timeout),
    modelStream: { provider, header: { config: { provider, model } }, messages },
  };
}
const kindOf = (chunk) => chunk.chunk; // the oneof member set, on received chunks
const textOf = (chunks) =>
  chunks.filter((c) => c.blockDelta).map((c) => c.blockDelta.text).join('');

/** A plugin serving one provider per behaviour under test, and what they saw. */
function testPlugin() {
  const plugin = sdk.createPlugin({ name: 'models', version: '2.0' });
  const probe = { started: deferred(), closed: deferred(), gate: deferred(), reason: deferred() };
  plugin.model({ provider: 'full', defaultModel: 'm1', timeout: 2.5 }, async function* full() {
    yield* sdk.textChunks('thinking', { kind: 'REASONING', chunkSize: 4 });
    yield* sdk.textChunks('hello world', { index: 1, chunkSize: 5 });
    yield* sdk.toolCallChunks('call_1', 'lookup', { q: 'x' }, 2);
    yield sdk.usageChunk({ inputTokens: 3, outputTokens: 4 });
    try {
      yield sdk.finishChunk();
      yield sdk.finishChunk(); // never sent: the finish ends the stream
    } finally {
      probe.closed.resolve('closed after the finish');
    }
  });
  plugin.model({ provider: 'open-ended' }, async function* openEnded(call) {
    yield* sdk.textChunks(sdk.lastUserText(call.modelStream.messages));
  });
  plugin.model({ provider: 'plain' }, async (call) =>
    `model ${call.modelStream.header.config.model}`);
  plugin.model({ provider: 'listed' }, () =>
    [...sdk.textChunks('out of tokens'), sdk.finishChunk('MAX_TOKENS')]);
  plugin.model({ provider: 'empty' }, async () => null);
  plugin.model({ provider: 'boom' }, async function* boom() {
    yield sdk.textChunks('partial')[0];
    throw new Error('the model broke');
  });
  plugin.model({ provider: 'bad' }, async function* bad() { yield 'not a chunk'; });
  plugin.model({ provider: 'two-kinds' }, async function* twoKinds() {
    yield { blockEnd: { index: 0 }, usage: {} };
  });
  plugin.model({ provider: 'ticker' }, async function* ticker(call, { signal }) {
    yield sdk.textChunks('tick')[0];
    try {
      for (;;) { // endless: only a CancelCall (or the deadline) stops it
        yield { blockDelta: { index: 0, text: 'tick' } };
        probe.started.resolve();
        await sleep(5);
      }
    } finally {
      probe.reason.resolve(signal.reason && signal.reason.message);
      probe.closed.resolve('closed');
    }
  });
  plugin.model({ provider: 'stuck' }, async function* stuck(call, { signal }) {
    yield sdk.textChunks('first')[0];
    await new Promise((resolve) => signal.addEventListener('abort', resolve));
    probe.reason.resolve(signal.reason.message);
  });
  plugin.model({ provider: 'steady' }, async function* steady() {
    for (const chunk of sdk.textChunks('abcde', { chunkSize: 1 })) {
      await sleep(100);
      yield chunk;
    }
  });
  plugin.model({ provider: 'gated' }, async function* gated() {
    for (const chunk of sdk.textChunks('abcdef', { chunkSize: 2 })) {
      yield chunk;
      await probe.gate.promise; // opened by the "opener" model: needs concurrency
    }
  });
  plugin.model({ provider: 'opener' }, async () => {
    probe.gate.resolve();
    return 'opened';
  });
  plugin.turnStop(() => sdk.terminalStop());
  return { plugin, probe };
}

const served = servedForEachTest(testPlugin);

test('Describe lists the models', async () => {
  const described = await describe(served.client);
  assert.deepEqual(described.models.map((m) => m.provider), [
    'full', 'open-ended', 'plain', 'listed', 'empty', 'boom', 'bad', 'two-kinds', 'ticker',
    'stuck', 'steady', 'gated', 'opener',
  ]);
  const [full, openEnded] = described.models;
  assert.equal(full.defaultModel, 'm1');
  assert.deepEqual(full.timeout, { seconds: 2, nanos: 500000000 });
  assert.equal(openEnded.timeout, null);
  assert.equal(openEnded.defaultModel, '');
  assert.deepEqual(described.subscriptions.map((s) => s.seam), ['SEAM_TURN_STOP']);
});

test('a model call streams its chunks in order up to the finish', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('m1', 'full'));
  const chunks = await stream.chunks('m1');
  assert.deepEqual(chunks.map(kindOf), [
    'blockStart', 'blockDelta', 'blockDelta', 'blockEnd', // reasoning
    'blockStart', 'blockDelta', 'blockDelta', 'blockDelta', 'blockEnd', // text
    'blockStart', 'blockDelta', 'blockEnd', // tool call
    'usage', 'finish',
  ]);
  assert.deepEqual(chunks[0].blockStart,
    { index: 0, kind: 'BLOCK_KIND_REASONING', toolCallId: '', toolName: '' });
  assert.deepEqual(chunks.slice(5, 8).map((c) => [c.blockDelta.index, c.blockDelta.text]),
    [[1, 'hello'], [1, ' worl'], [1, 'd']]);
  assert.deepEqual(chunks[9].blockStart,
    { index: 2, kind: 'BLOCK_KIND_TOOL_CALL', toolCallId: 'call_1', toolName: 'lookup' });
  assert.equal(chunks[10].blockDelta.text, '{"q":"x"}');
  assert.deepEqual(chunks[12].usage, { inputTokens: 3, outputTokens: 4, cachedInputTokens: 0 });
  assert.deepEqual(chunks[13].finish, { kind: 'FINISH_KIND_STOP', message: '', code: '' });
  const closed = await within(served.probe.closed.promise, 'the generator closed');
  assert.equal(closed, 'closed after the finish');
  assert.deepEqual(await stream.finish(), []);
});

test('a missing finish is appended and plain handlers are wrapped', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('m1', 'open-ended', { messages: [user('say this')] }));
  let chunks = await stream.chunks('m1');
  assert.equal(textOf(chunks), 'say this');
  assert.deepEqual(chunks.slice(-2).map(kindOf), ['blockEnd', 'finish']);
  assert.equal(chunks.at(-1).finish.kind, 'FINISH_KIND_STOP');
  stream.send(modelCall('m2', 'plain', { model: 'tiny' }));
  chunks = await stream.chunks('m2');
  assert.equal(textOf(chunks), 'model tiny');
  assert.equal(chunks[0].blockStart.kind, 'BLOCK_KIND_TEXT');
  stream.send(modelCall('m3', 'listed'));
  chunks = await stream.chunks('m3');
  assert.equal(textOf(chunks), 'out of tokens');
  assert.equal(chunks.at(-1).finish.kind, 'FINISH_KIND_MAX_TOKENS');
  stream.send(modelCall('m4', 'empty'));
  assert.deepEqual((await stream.chunks('m4')).map(kindOf), ['finish']);
  assert.deepEqual(await stream.finish(), []);
});

test('a failing model answers an error result', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('m1', 'boom'));
  const first = await stream.response();
  assert.deepEqual([first.chunk.callId, kindOf(first.chunk.chunk)], ['m1', 'blockStart']);
  const failed = await stream.response();
  assert.equal(failed.kind, 'result');
  assert.deepEqual([failed.result.callId, failed.result.error.message], ['m1', 'the model broke']);
  stream.send(modelCall('m2', 'bad'), modelCall('m3', 'two-kinds'), modelCall('m4', 'unknown'));
  const results = Object.fromEntries((await Promise.all([1, 2, 3].map(() => stream.response())))
    .map((r) => [r.result.callId, r.result.error.message]));
  assert.match(results.m2, /produced not a chunk, not a StreamChunk/);
  assert.match(results.m3, /not a StreamChunk/);
  assert.equal(results.m4, 'plugin models serves no model provider "unknown"');
  assert.deepEqual(await stream.finish(), []);
});

for (const provider of ['ticker', 'stuck']) {
  test(`CancelCall stops the chunks and closes the generator (${provider})`, async () => {
    const stream = new HandleStream(served.client);
    stream.send(modelCall('m1', provider));
    const first = await stream.response();
    assert.deepEqual([first.chunk.callId, kindOf(first.chunk.chunk)], ['m1', 'blockStart']);
    if (provider === 'ticker') await within(served.probe.started.promise, 'the ticking');
    stream.cancel('m1');
    assert.equal(await within(served.probe.reason.promise, 'the abort'), 'x');
    stream.send({ callId: 'after', seam: 'SEAM_TURN_STOP', turnStop: {} });
    let after = await stream.response();
    while (after.kind === 'chunk') { // sent before the cancel arrived
      assert.equal(after.chunk.callId, 'm1');
      assert.notEqual(kindOf(after.chunk.chunk), 'finish');
      after = await stream.response();
    }
    assert.deepEqual([after.result.callId, after.result.turnStop.stop], ['after', true]);
    assert.deepEqual(await stream.finish(), []); // nothing more of the cancelled call
  });
}

test('the silence deadline withdraws a model call', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('m1', 'stuck', { timeout: 0.2 }));
  assert.equal((await stream.response()).chunk.callId, 'm1');
  assert.equal(await within(served.probe.reason.promise, 'the deadline'), 'deadline exceeded');
  assert.deepEqual(await stream.finish(), []); // neither a finish nor an error
});

test('the silence deadline restarts with each chunk', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('m1', 'steady', { timeout: 0.3 })); // 7 chunks, 100 ms apart
  assert.equal(textOf(await stream.chunks('m1')), 'abcde');
  assert.deepEqual(await stream.finish(), []);
});

test('concurrent model calls interleave, each in order', async () => {
  const stream = new HandleStream(served.client);
  stream.send(modelCall('g', 'gated'), modelCall('o', 'opener'));
  const byCall = { g: [], o: [] };
  const order = [];
  while (!Object.values(byCall).every((chunks) => chunks.length && chunks.at(-1).finish)) {
    const { chunk } = await stream.response();
    byCall[chunk.callId].push(chunk.chunk);
    order.push(chunk.callId);
  }
  assert.ok(order.indexOf('o') < order.lastIndexOf('g'));
  assert.equal(textOf(byCall.g), 'abcdef');
  assert.equal(textOf(byCall.o), 'opened');
  assert.deepEqual(await stream.finish(), []);
});

test('handle runs a model call in process', async () => {
  const { plugin } = served;
  const chunks = [];
  const call = { ...modelCall('h', 'plain', { model: 'x' }), payload: 'modelStream' };
  assert.equal(await plugin.handle(call, undefined, (chunk) => chunks.push(chunk)), null);
  assert.deepEqual(chunks.map((c) => Object.keys(c)[0]),
    ['blockStart', 'blockDelta', 'blockEnd', 'finish']);
  assert.equal(chunks[1].blockDelta.text, 'model x');
  const failed = await plugin.handle({ ...modelCall('b', 'boom'), payload: 'modelStream' });
  assert.deepEqual(failed, { callId: 'b', error: { code: 2, message: 'the model broke' } });
});

test('registrations and chunk helpers are checked', () => {
  const { plugin } = served;
  assert.throws(() => plugin.model({ provider: 'full' }, async () => ''), /invalid or taken/);
  assert.throws(() => plugin.model({ provider: 'no spaces' }, async () => ''), /invalid or taken/);
  assert.throws(() => plugin.model({ provider: 'fine' }), /not a function/);
  assert.deepEqual(sdk.textChunks(''), []);
  assert.throws(() => sdk.textChunks('x', { chunkSize: 0 }), /chunkSize/);
  assert.deepEqual(sdk.textChunks('🙂🙂', { chunkSize: 1 }).slice(1, 3)
    .map((c) => c.blockDelta.text), ['🙂', '🙂']);
  assert.deepEqual(sdk.toolCallChunks('c', 't').map((c) => Object.keys(c)[0]),
    ['blockStart', 'blockEnd']);
  assert.equal(sdk.toolCallChunks('c', 't', '{"a": 1}')[1].blockDelta.text, '{"a": 1}');
  assert.deepEqual(sdk.finishChunk('ERROR', 'overloaded', '503'),
    { finish: { kind: 'FINISH_KIND_ERROR', message: 'overloaded', code: '503' } });
  assert.equal(sdk.usageChunk({ cachedInputTokens: 2 }).usage.cachedInputTokens, 2);
  assert.equal(sdk.lastUserText([user('a'), { role: 'ROLE_USER', content: [] }]), 'a');
  assert.equal(sdk.lastUserText([]), '');
});
