'use strict';
/**
 * @file Decision constructors and content helpers for agentloop plugins.
 *
 * Messages are the plain objects of `@grpc/proto-loader` with camelCase field names
 * (`keepCase: false`): a `HookCall` reads `call.promptSubmit.content`, a text block is
 * `{text: {text: 'hi'}}`. A oneof is set by setting exactly one of its members (for
 * example `{block: {reason}}`); on messages received, the oneof's own name (`payload`,
 * `decision`, `block`, `kind`) holds the name of the member that is set.
 *
 * Every constructor here returns the decision of one seam, tagged (with a hidden
 * symbol) so the plugin can refuse a decision returned from the wrong seam. Wherever
 * content is accepted, a string stands for one text block; wherever contexts are
 * accepted, a string stands for `context(text)`.
 */

/** Hidden tag: the `HookResult` field (the seam) a decision belongs to. */
const SEAM_OF = Symbol('agentloop.seam');

/**
 * Tag `value` as the decision of the `HookResult` field `field`.
 * @template T
 * @param {string} field
 * @param {T} value
 * @returns {T}
 */
function tagged(field, value) {
  Object.defineProperty(value, SEAM_OF, { value: field, enumerable: false });
  return value;
}

/**
 * One text content block.
 * @param {string} text
 * @returns {{text: {text: string}}}
 */
function textBlock(text) {
  return { text: { text } };
}

/**
 * Content as an array of blocks: a string is one text block, nothing is none.
 * @param {string|object[]|undefined|null} content
 * @returns {object[]}
 */
function blocks(content) {
  if (content === undefined || content === null || content === '') return [];
  if (typeof content === 'string') return [textBlock(content)];
  if (!Array.isArray(content)) throw new TypeError('content: a string or an array of blocks');
  return content;
}

/**
 * The text of the text blocks of `content`, joined with no separator.
 * @param {object[]|undefined|null} content
 * @returns {string}
 */
function textOf(content) {
  return (content || []).map((block) => (block && block.text && block.text.text) || '').join('');
}

/**
 * A `Source`: a string is the kind ("plugin", "loop", ...).
 * @param {string|{kind?: string, name?: string}} source
 */
function asSource(source) {
  return typeof source === 'string' ? { kind: source } : source;
}

/**
 * A context message (`HookContext`), wrapped as `<context source=...>` unless `raw`.
 * @param {string|object[]} text the content
 * @param {string|{kind?: string, name?: string}} [source='plugin']
 * @param {{raw?: boolean, meta?: object}} [options] `meta` is kept on the event, never shown
 */
function context(text, source = 'plugin', { raw = false, meta } = {}) {
  const result = {
    content: blocks(text),
    source: asSource(source),
    envelope: raw ? 'CONTEXT_ENVELOPE_RAW' : 'CONTEXT_ENVELOPE_CONTEXT',
  };
  if (meta) result.meta = toStruct(meta);
  return result;
}

/** @param {Iterable<string|object>} items @returns {object[]} */
function contextsOf(items = []) {
  return [...items].map((item) => (typeof item === 'string' ? context(item) : item));
}

// agent/prompt-submit

/**
 * Allow the prompt, replaced by `content` when given, followed by `contexts`.
 * @param {string|object[]} [content]
 * @param {Iterable<string|object>} [contexts]
 */
function allowPrompt(content, contexts = []) {
  const allow = { content: blocks(content), additionalContexts: contextsOf(contexts) };
  return tagged('promptSubmit', { allow });
}

/** Block the prompt; it is logged as `prompt_blocked` with `reason`. @param {string} reason */
function blockPrompt(reason) {
  return tagged('promptSubmit', { block: { reason } });
}

// agent/session-prefix, agent/pre-step, agent/request, agent/step-result

/**
 * Replace the session prefix (by convention: your messages, then the prefix received).
 * @param {object[]} messages
 */
function replacePrefix(messages) {
  return tagged('sessionPrefix', { prefix: [...messages] });
}

/**
 * Add one context before the step.
 * @param {string|object} text a text, or a full `HookContext`
 * @param {string|{kind?: string, name?: string}} [source='plugin']
 */
function addContext(text, source = 'plugin') {
  return tagged('preStep', { contexts: [typeof text === 'string' ? context(text, source) : text] });
}

/** Add several contexts before the step. @param {Iterable<string|object>} contexts */
function addContexts(contexts) {
  return tagged('preStep', { contexts: contextsOf(contexts) });
}

/**
 * Replace the model configuration: `base` with `changes` applied.
 * @param {object} [base] usually `call.request.config`
 * @param {{provider?: string, model?: string, temperature?: number, maxTokens?: number,
 *   stop?: string[]}} [changes] the fields to change
 */
function replaceConfig(base = {}, changes = {}) {
  const config = { ...(base || {}) };
  for (const [key, value] of Object.entries(changes)) if (value !== undefined) config[key] = value;
  return tagged('request', { config });
}

/**
 * Replace the step's assistant message (content alone makes an assistant message).
 * @param {object|string|object[]} message a `Message`, or its content
 */
function replaceMessage(message) {
  const isMessage = message && !Array.isArray(message) && typeof message === 'object';
  return tagged('stepResult', {
    message: isMessage ? message : { role: 'ROLE_ASSISTANT', content: blocks(message) },
  });
}

// agent/turn-continuation, agent/turn-stop

/**
 * Run another step; `reason`, when given, is recorded as steering at its top.
 * @param {string|object[]} [reason]
 * @param {string|{kind?: string, name?: string}} [source] empty means kind "loop"
 */
function continueTurn(reason, source) {
  const decision = { reason: blocks(reason) };
  if (source !== undefined) decision.source = asSource(source);
  return tagged('turnContinuation', { continueTurn: decision });
}

/** End the turn (unless steering is pending). */
function stopTurn() {
  return tagged('turnContinuation', { stop: {} });
}

/** Make the turn's stop terminal: pending and late steering are discarded. */
function terminalStop() {
  return tagged('turnStop', { stop: true });
}

// tools/pre-execute, tools/post-execute

/** Run the tool call. */
function allowTool() {
  return tagged('toolPreExecute', { allow: {} });
}

/** Refuse the tool call; the model sees `Error: <reason>`. @param {string} reason */
function deny(reason) {
  return tagged('toolPreExecute', { deny: { reason } });
}

/**
 * Ask for approval: the call waits for ResolveApproval or an approver plugin.
 * @param {string} reason
 */
function ask(reason) {
  return tagged('toolPreExecute', { ask: { reason } });
}

/** Approver: allow the pending tool call once (`tools/approval`). */
function approveOnce() {
  return tagged('toolApproval', { decision: 'APPROVAL_DECISION_ALLOW_ONCE', reason: '' });
}

/**
 * Approver: reject the pending tool call; the model sees
 * `Error: the user rejected tool "X": <reason>` (without `: <reason>` when empty).
 * @param {string} [reason]
 */
function rejectTool(reason = '') {
  return tagged('toolApproval', { decision: 'APPROVAL_DECISION_REJECT', reason });
}

/**
 * Keep the tool result, its content replaced by `content` when given.
 * @param {string|object[]} [content]
 * @param {Iterable<string|object>} [contexts]
 */
function accept(content, contexts = []) {
  const decision = { content: blocks(content), additionalContexts: contextsOf(contexts) };
  return tagged('toolPostExecute', { accept: decision });
}

/**
 * Replace the tool result with `feedback`, marked as an error.
 * @param {string} feedback
 * @param {Iterable<string|object>} [contexts]
 */
function blockResult(feedback, contexts = []) {
  const block = { feedback, additionalContexts: contextsOf(contexts) };
  return tagged('toolPostExecute', { block });
}

// Plugin tools

/**
 * A successful tool result.
 * @param {string|object[]} content what the model sees
 * @param {{meta?: object, contexts?: Iterable<string|object>}} [options]
 */
function toolOutput(content, { meta, contexts = [] } = {}) {
  const output = { content: blocks(content), additionalContexts: contextsOf(contexts) };
  if (meta) output.meta = toStruct(meta);
  return tagged('toolExecute', output);
}

/**
 * A failed tool result the model sees as `Error: <message>`.
 * @param {string} message
 * @param {string} [code] classifies the failure (sets `error`)
 */
function toolError(message, code = '') {
  const output = { content: [textBlock(`Error: ${message}`)], isError: true };
  if (code) output.error = { name: 'PluginToolError', code };
  return tagged('toolExecute', output);
}

// JSON <-> google.protobuf.Struct (proto-loader keeps Struct as its message shape)

/** @param {unknown} value @returns {object} a `google.protobuf.Value` */
function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof value === 'number') return { numberValue: value };
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  if (typeof value === 'object') return { structValue: toStruct(value) };
  throw new TypeError(`${typeof value} is not JSON`);
}

/** A JSON object as a `google.protobuf.Struct`. @param {object} object */
function toStruct(object) {
  const fields = {};
  for (const [key, value] of Object.entries(object)) fields[key] = toValue(value);
  return { fields };
}

/** @param {object|null|undefined} value a received `google.protobuf.Value` */
function fromValue(value) {
  if (!value) return null;
  switch (value.kind) {
    case 'numberValue': return value.numberValue;
    case 'stringValue': return value.stringValue;
    case 'boolValue': return value.boolValue;
    case 'structValue': return fromStruct(value.structValue);
    case 'listValue': return ((value.listValue && value.listValue.values) || []).map(fromValue);
    default: return null;
  }
}

/** A received `google.protobuf.Struct` as a JSON object. @param {object|null|undefined} struct */
function fromStruct(struct) {
  const object = {};
  const fields = (struct && struct.fields) || {};
  for (const [key, value] of Object.entries(fields)) object[key] = fromValue(value);
  return object;
}

/**
 * The answer to a call the plugin failed to handle (`HookResult.error`, code UNKNOWN
 * unless given).
 * @param {string} callId
 * @param {string} message
 * @param {number} [code]
 * @returns {object} the `HookResult`
 */
function failure(callId, message, code = UNKNOWN) {
  return { callId, error: { code, message } };
}

/** `google.rpc.Code`s of a failed call: a handler's failure; a call nothing here handles. */
const UNKNOWN = 2;
const UNIMPLEMENTED = 12;

module.exports = {
  failure,
  UNIMPLEMENTED,
  UNKNOWN,
  SEAM_OF,
  accept,
  addContext,
  addContexts,
  allowPrompt,
  allowTool,
  approveOnce,
  ask,
  blockPrompt,
  blockResult,
  blocks,
  context,
  continueTurn,
  deny,
  fromStruct,
  replaceConfig,
  replaceMessage,
  rejectTool,
  replacePrefix,
  stopTurn,
  terminalStop,
  textBlock,
  textOf,
  toStruct,
  toolError,
  toolOutput,
};
