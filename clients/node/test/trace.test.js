'use strict';
// The server's trace context on each call: on the handler's context, and, with
// @opentelemetry/api installed (a dev dependency here), as the active OpenTelemetry
// context the handler runs in.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { AsyncLocalStorage } = require('node:async_hooks');
const api = require('@opentelemetry/api');
const sdk = require('../plugin');
const { spanContextOf } = require('../trace');
const { serve, HandleStream } = require('./helpers');

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN_ID = '00f067aa0ba902b7';
const TRACEPARENT = `00-${TRACE_ID}-${SPAN_ID}-01`;
const TRACESTATE = 'vendor=abc,other=1';

/** The context manager an application's OpenTelemetry SDK registers, over AsyncLocalStorage. */
class StorageContextManager {
  constructor() { this.storage = new AsyncLocalStorage(); }

  active() { return this.storage.getStore() || api.ROOT_CONTEXT; }

  with(context, fn, thisArg, ...args) { return this.storage.run(context, () => fn.apply(thisArg, args)); }

  bind(context, target) {
    return typeof target === 'function' ? (...args) => this.with(context, target, undefined, ...args) : target;
  }

  enable() { return this; }

  disable() { this.storage.disable(); return this; }
}

const text = (value) => ({ text: { text: value } });
const seen = [];

/** What a handler sees: its context's trace fields and the active span context. */
function record(kind, context) {
  const active = api.trace.getSpanContext(api.context.active());
  seen.push({
    kind,
    traceparent: context.traceparent,
    tracestate: context.tracestate,
    traceId: active && active.traceId,
    spanId: active && active.spanId,
    isRemote: active && active.isRemote,
    state: active && active.traceState && active.traceState.serialize(),
  });
}

let plugin;
let client;
before(async () => {
  api.context.setGlobalContextManager(new StorageContextManager());
  plugin = sdk.createPlugin({ name: 'traced', version: 'test' });
  plugin.promptSubmit({}, async (call, context) => {
    await new Promise((resolve) => { setImmediate(resolve); }); // across an await too
    record('prompt', context);
    return null;
  });
  plugin.tool({ name: 'echo' }, async (args, call, context) => {
    record('tool', context);
    return args.text;
  });
  plugin.model({ provider: 'traced-model' }, async function* model(call, context) {
    record('model', context);
    yield* sdk.textChunks('hi');
  });
  client = await serve(plugin);
});

after(async () => {
  client.close();
  await plugin.stop({ grace: 0 });
  api.context.disable();
});

test('the traceparent arrives on the call context, and the handler runs in it', async () => {
  seen.length = 0;
  const stream = new HandleStream(client);
  const traced = { traceparent: TRACEPARENT, tracestate: TRACESTATE };
  stream.send(
    { callId: 'p1', seam: 'SEAM_PROMPT_SUBMIT', promptSubmit: { content: [text('x')] }, ...traced },
    {
      callId: 't1', kind: 'CALL_KIND_TOOL_EXECUTE', ...traced,
      toolExecute: { invocation: { callId: 'c1', name: 'echo', arguments: '{"text": "e"}' } },
    },
  );
  const results = await stream.take(2);
  assert.deepEqual(results.map((r) => r.callId).sort(), ['p1', 't1']);
  stream.send({
    callId: 'm1', kind: 'CALL_KIND_MODEL_STREAM', ...traced,
    modelStream: { provider: 'traced-model', messages: [] },
  });
  await stream.chunks('m1');
  await stream.finish();
  assert.deepEqual(seen.map((s) => s.kind).sort(), ['model', 'prompt', 'tool']);
  for (const one of seen) {
    assert.deepEqual(one, {
      kind: one.kind, traceparent: TRACEPARENT, tracestate: TRACESTATE,
      traceId: TRACE_ID, spanId: SPAN_ID, isRemote: true, state: TRACESTATE,
    });
  }
});

test('a call without a traceparent has empty trace fields and no active span', async () => {
  seen.length = 0;
  const stream = new HandleStream(client);
  stream.send({ callId: 'p2', seam: 'SEAM_PROMPT_SUBMIT', promptSubmit: { content: [text('x')] } });
  await stream.take(1);
  await stream.finish();
  assert.deepEqual(seen, [{
    kind: 'prompt', traceparent: '', tracestate: '',
    traceId: undefined, spanId: undefined, isRemote: undefined, state: undefined,
  }]);
});

test('only a valid traceparent names a parent', () => {
  assert.equal(spanContextOf(TRACEPARENT).traceId, TRACE_ID);
  assert.equal(spanContextOf(`00-${TRACE_ID}-${SPAN_ID}-03`).traceFlags, 3);
  for (const bad of ['', 'junk', `00-${'0'.repeat(32)}-${SPAN_ID}-01`,
    `00-${TRACE_ID}-${'0'.repeat(16)}-01`, `ff-${TRACE_ID}-${SPAN_ID}-01`,
    `00-${TRACE_ID.toUpperCase()}-${SPAN_ID}-01`]) {
    assert.equal(spanContextOf(bad), null, bad);
  }
});
