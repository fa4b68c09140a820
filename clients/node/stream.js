'use strict';
/**
 * @file The `Handle` stream of a plugin, and its bearer-token check.
 *
 * Every `HookCall` runs at once (its handler's promise), so many calls are in flight;
 * each result is written when its call finishes. A `modelStream` call's chunks are
 * written as they are produced, and its deadline is the silence between two chunks.
 * A `CancelCall` aborts the call's `AbortSignal` and nothing more is sent for it;
 * neither is anything after the call's deadline. Notifications get no result. The calls of a
 * `CallBatch` are handled one by one as if each had come alone. When the
 * server closes its side, the calls in flight are answered, then the stream ends.
 */

const crypto = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const { seconds: secondsOf } = require('./proto');
const { withTraceContext } = require('./trace');

/**
 * Whether the call carries the plugin's token (always true when it has none).
 * @param {{token: string}} plugin
 * @param {{metadata: import('@grpc/grpc-js').Metadata}} call
 */
function authorized(plugin, call) {
  if (!plugin.token) return true;
  const sent = Buffer.from(String(call.metadata.get('authorization')[0] || ''));
  const expected = Buffer.from(`Bearer ${plugin.token}`);
  return sent.length === expected.length && crypto.timingSafeEqual(sent, expected);
}

/** The UNAUTHENTICATED status of a call without the token. @param {{name: string}} plugin */
function refuse(plugin) {
  return {
    code: grpc.status.UNAUTHENTICATED,
    details: `plugin ${plugin.name} requires 'authorization: Bearer <token>'`,
  };
}

/** Listed in `Describe` when the server offers it: calls may come several in a message. */
const BATCH_CAPABILITY = 'call_batch';

/**
 * The `Describe` answer to `request`: `description`, asking for call batches when the
 * server offers them (this helper reads them).
 * @param {object} description @param {{capabilities?: string[]}} request
 */
function describeFor(description, request) {
  const offered = (request && request.capabilities) || [];
  if (!offered.includes(BATCH_CAPABILITY)) return description;
  return { ...description, capabilities: [...(description.capabilities || []), BATCH_CAPABILITY] };
}

/** The `CancelCall` or deadline that withdrew a call. */
class CallWithdrawn extends Error {}

/**
 * Serve one `Handle` stream until the server closes it or the plugin stops.
 * @param {import('./plugin').Plugin} plugin
 * @param {import('@grpc/grpc-js').ServerDuplexStream<object, object>} stream
 */
function serveStream(plugin, stream) {
  if (!authorized(plugin, stream)) {
    stream.emit('error', refuse(plugin));
    return;
  }
  stream.sendMetadata(new grpc.Metadata()); // the server sees the stream open at once
  /** Cancellable calls in flight, by call id. @type {Map<string, AbortController>} */
  const calls = new Map();
  /** Every call still running (cancelled or not). @type {Set<AbortController>} */
  const running = new Set();
  let closing = false; // the server closed its side, or the plugin is stopping
  let ended = false;

  const endIfIdle = () => {
    if (closing && running.size === 0 && !ended) {
      ended = true;
      stream.end();
    }
  };
  const abortAll = (why) => {
    ended = true;
    for (const controller of running) controller.abort(new CallWithdrawn(why));
    plugin.streams.delete(handle);
  };

  const start = (call) => {
    if (call.callId && calls.has(call.callId)) {
      plugin.logger.error(`plugin ${plugin.name}: duplicate call id ${call.callId} ignored`);
      return;
    }
    if (closing) {
      stream.write({ result: { callId: call.callId, error: { code: 2, message: 'the plugin is stopping' } } });
      return;
    }
    const controller = new AbortController();
    running.add(controller);
    if (call.callId) calls.set(call.callId, controller);
    const seconds = secondsOf(call.timeout);
    let timer = null;
    const expire = () => controller.abort(new CallWithdrawn('deadline exceeded'));
    const arm = () => { // (re)start the deadline; a model call's restarts with each chunk
      if (seconds <= 0) return;
      clearTimeout(timer);
      timer = setTimeout(expire, seconds * 1000);
    };
    const emit = (chunk) => {
      if (controller.signal.aborted || ended) return;
      stream.write({ chunk: { callId: call.callId, chunk } });
      arm();
    };
    arm();
    // In the server's trace context, when OpenTelemetry is there (trace.js).
    withTraceContext(call, () => plugin.handle(call, controller.signal, emit)).then((result) => {
      clearTimeout(timer);
      running.delete(controller);
      if (calls.get(call.callId) === controller) calls.delete(call.callId);
      if (result && !controller.signal.aborted && !ended) stream.write({ result });
      endIfIdle();
    });
  };

  const handle = {
    /** Refuse new calls; end the stream once the calls in flight are answered. */
    drain() {
      closing = true;
      endIfIdle();
    },
  };
  plugin.streams.add(handle);

  stream.on('data', (request) => {
    if (request.kind === 'call') {
      start(request.call);
    } else if (request.kind === 'batch') { // each as if it had come alone
      for (const call of request.batch.calls) start(call);
    } else if (request.kind === 'cancel') {
      const controller = calls.get(request.cancel.callId);
      calls.delete(request.cancel.callId);
      if (controller) controller.abort(new CallWithdrawn(request.cancel.reason || 'cancelled'));
    }
  });
  stream.on('end', () => handle.drain());
  stream.on('cancelled', () => abortAll('the stream was cancelled'));
  stream.on('error', () => abortAll('the stream failed'));
  stream.on('finish', () => plugin.streams.delete(handle));
}

module.exports = {
  BATCH_CAPABILITY, CallWithdrawn, authorized, describeFor, refuse, serveStream,
};
