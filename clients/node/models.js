'use strict';
/**
 * @file Model providers served by a plugin: the chunk helpers, and running one call.
 *
 * A model handler `(call, {signal})` receives the `HookCall` (`call.modelStream`:
 * `provider`, `header` with the config, system prompt and tools, and `messages`) and
 * either
 * - is an async generator (or returns any async iterable) of `StreamChunk`s: block
 *   starts, deltas and ends (`textChunks`, `toolCallChunks`), then `usageChunk(...)`,
 *   then `finishChunk(...)`. A finish `STOP` is appended when it ends without one; a
 *   finish ends the stream and the generator is closed; or
 * - returns (or resolves to) a string (one text block, then a finish `STOP`), an array
 *   of chunks (sent as they are, a finish appended when missing), or nothing.
 *
 * Every chunk is written as soon as it is produced. A handler that throws, or produces
 * something that is not a chunk, answers `HookResult.error`. The `signal` is aborted by
 * the server's `CancelCall` and when no chunk came within `call.timeout` (the silence
 * deadline); nothing more is sent then and the generator is closed.
 */

const { HookService } = require('./proto');
const { failure, textOf } = require('./decisions');
const { callContext } = require('./trace');

/**
 * @callback ModelHandler
 * @param {object} call the `HookCall`: `call.modelStream.provider`, `.header` (`config`
 *   with the `model`, `system`, `tools`, `messagePrefix`) and `.messages`
 * @param {{signal: AbortSignal, traceparent: string, tracestate: string}} context aborted
 *   on `CancelCall` or past the silence; the server's trace context (see `trace.js`)
 *   deadline; nothing more is sent then
 * @returns {AsyncIterable<object>|Promise<string|object[]|null|undefined>} an async
 *   generator of `StreamChunk`s, or text, chunks, or nothing
 */

const CHUNK_KINDS = ['blockStart', 'blockDelta', 'blockEnd', 'usage', 'finish'];

/** `'TEXT'` or `'BLOCK_KIND_TEXT'` as the enum name. @param {string} kind */
const blockKind = (kind) => (kind.startsWith('BLOCK_KIND_') ? kind : `BLOCK_KIND_${kind}`);

/**
 * A block at `index`: its start, `text` in deltas of `chunkSize` characters, its end.
 * Empty text gives no chunks.
 * @param {string} text
 * @param {{index?: number, chunkSize?: number, kind?: 'TEXT'|'REASONING'}} [options]
 * @returns {object[]}
 */
function textChunks(text, { index = 0, chunkSize = 8, kind = 'TEXT' } = {}) {
  if (!(chunkSize >= 1)) throw new RangeError('chunkSize must be at least 1');
  if (!text) return [];
  const chunks = [{ blockStart: { index, kind: blockKind(kind) } }];
  const chars = [...text]; // code points, as the Python helper cuts them
  for (let i = 0; i < chars.length; i += chunkSize) {
    chunks.push({ blockDelta: { index, text: chars.slice(i, i + chunkSize).join('') } });
  }
  chunks.push({ blockEnd: { index } });
  return chunks;
}

/**
 * A tool-call block at `index`; `args` is JSON text, or a value sent as JSON.
 * @param {string} id the call id results refer to
 * @param {string} name the tool name
 * @param {string|any} [args='']
 * @param {number} [index=0]
 * @returns {object[]}
 */
function toolCallChunks(id, name, args = '', index = 0) {
  const text = typeof args === 'string' ? args : JSON.stringify(args);
  const start = { index, kind: 'BLOCK_KIND_TOOL_CALL', toolCallId: id, toolName: name };
  const chunks = [{ blockStart: start }];
  if (text) chunks.push({ blockDelta: { index, text } });
  chunks.push({ blockEnd: { index } });
  return chunks;
}

/**
 * A usage chunk.
 * @param {{inputTokens?: number, outputTokens?: number, cachedInputTokens?: number}} [usage]
 */
function usageChunk({ inputTokens = 0, outputTokens = 0, cachedInputTokens = 0 } = {}) {
  return { usage: { inputTokens, outputTokens, cachedInputTokens } };
}

/**
 * The finish chunk: `'STOP'`, `'MAX_TOKENS'`, or `'ERROR'` with a message and code.
 * @param {'STOP'|'MAX_TOKENS'|'ERROR'|'ABORTED'} [kind='STOP']
 * @param {string} [message='']
 * @param {string} [code='']
 */
function finishChunk(kind = 'STOP', message = '', code = '') {
  const name = kind.startsWith('FINISH_KIND_') ? kind : `FINISH_KIND_${kind}`;
  return { finish: { kind: name, message, code } };
}

/**
 * The text of the latest user message that has text; '' when none has.
 * @param {object[]} messages
 */
function lastUserText(messages) {
  for (const message of [...(messages || [])].reverse()) {
    const text = message.role === 'ROLE_USER' ? textOf(message.content) : '';
    if (text) return text;
  }
  return '';
}

/** `chunk`, checked: exactly one kind set, and it serializes. */
function checked(chunk, callId) {
  const set = chunk && typeof chunk === 'object'
    ? CHUNK_KINDS.filter((kind) => chunk[kind] !== undefined && chunk[kind] !== null) : [];
  if (set.length !== 1) {
    const shown = typeof chunk === 'object' ? JSON.stringify(chunk) : String(chunk);
    throw new TypeError(`the model handler produced ${shown}, not a StreamChunk`);
  }
  HookService.service.Handle.responseSerialize({ chunk: { callId, chunk } });
  return chunk;
}

/** What a handler produced, as an async iterator. */
async function iteratorOf(produced) {
  if (produced && typeof produced[Symbol.asyncIterator] === 'function') {
    return produced[Symbol.asyncIterator]();
  }
  const value = await produced;
  if (value === null || value === undefined) return [][Symbol.iterator]();
  if (typeof value === 'string') return [...textChunks(value), finishChunk()][Symbol.iterator]();
  if (Array.isArray(value)) return value[Symbol.iterator]();
  throw new TypeError(`the model handler returned ${typeof value}, not text or chunks`);
}

/** Resolves to `WITHDRAWN` when `signal` aborts. */
const WITHDRAWN = Symbol('withdrawn');
function withdrawn(signal) {
  if (signal.aborted) return Promise.resolve(WITHDRAWN);
  return new Promise((resolve) => {
    signal.addEventListener('abort', () => resolve(WITHDRAWN), { once: true });
  });
}

/**
 * Run one `modelStream` call: each chunk goes to `emit` as it is produced.
 * Never rejects.
 * @param {import('./plugin').Plugin} plugin
 * @param {object} call the `HookCall` with `modelStream`
 * @param {AbortSignal} signal withdraws the call: nothing more is emitted
 * @param {(chunk: object) => void} emit receives each `StreamChunk`, the finish last
 * @returns {Promise<object|null>} a `HookResult` with `error`, or null (finished or
 *   withdrawn)
 */
async function runModel(plugin, call, signal, emit) {
  const { provider: name } = call.modelStream || {};
  const provider = plugin.models.get(name);
  if (!provider) {
    return failure(
      call.callId, `plugin ${plugin.name} serves no model provider ${JSON.stringify(name)}`,
    );
  }
  const stopped = withdrawn(signal);
  let iterator = null;
  let exhausted = false;
  try {
    const starting = iteratorOf(provider.handler(call, callContext(call, signal)));
    starting.catch(() => {}); // a handler failing after its call was withdrawn
    iterator = await Promise.race([starting, stopped]);
    if (iterator === WITHDRAWN) return null;
    for (;;) {
      const pending = Promise.resolve(iterator.next());
      pending.catch(() => {}); // likewise
      const next = await Promise.race([pending, stopped]);
      if (next === WITHDRAWN) return null;
      if (next.done) {
        exhausted = true;
        emit(finishChunk());
        return null;
      }
      const chunk = checked(next.value, call.callId);
      emit(chunk);
      if (chunk.finish) return null;
    }
  } catch (error) {
    if (signal.aborted) return null;
    return failure(call.callId, (error && error.message) || String(error));
  } finally {
    if (iterator && iterator !== WITHDRAWN && !exhausted && typeof iterator.return === 'function') {
      Promise.resolve(iterator.return()).catch(() => {}); // close it, without waiting
    }
  }
}

module.exports = {
  finishChunk,
  lastUserText,
  runModel,
  textChunks,
  toolCallChunks,
  usageChunk,
};
